/* redsem - one Redis server as seen by one client: its connection and handshake, requests
 * with reconnect and idempotent retry, the server's clock offset, BLPOP, and the
 * classification of error replies. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>
#include <sodium.h>

#include "node/node.h"

int redsem__node_init(redsem__node *n, redsem__ctx *ctx, const redsem__endpoint *ep,
                      const redsem__node_cfg *cfg, char *err, size_t errlen)
{
    memset(n, 0, sizeof *n);
    n->ctx = ctx;
    redsem__clock_init(&n->own_clock);
    n->clock = &n->own_clock;
    for (int i = 0; i < REDSEM__SCRIPT_COUNT; i++)
        atomic_init(&n->own_scripts.sent[i], false);
    atomic_init(&n->own_scripts.eval_body, false);
    n->scripts = &n->own_scripts;
    redsem__conn_init(&n->conn);
    n->connect_timeout_ms = cfg->connect_timeout_ms;
    n->command_timeout_ms = cfg->command_timeout_ms;
    n->retry_ms = cfg->retry_ms;
    n->sync_replicas = cfg->sync_replicas;
    n->sync_timeout_ms = cfg->sync_timeout_ms;
    n->allow_eviction = cfg->allow_eviction;
    if (redsem__endpoint_copy(&n->ep, ep) != REDSEM_OK) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    if (ep->tls) {
        static const redsem__tls_opts defaults = {0};
        const redsem__tls_opts *t = cfg->tls ? cfg->tls : &defaults;
        n->tls_ctx = cfg->tls_ctx ? redsem__tls_ctx_ref(cfg->tls_ctx)
                                  : redsem__tls_ctx_new(t, err, errlen);
        if (n->tls_ctx == NULL)
            return REDSEM_EINVAL;
        if (t->server_name && (n->tls_server_name = redsem__strdup(t->server_name)) == NULL) {
            snprintf(err, errlen, "out of memory");
            return REDSEM_ENOMEM;
        }
    }
    return REDSEM_OK;
}

void redsem__node_close(redsem__node *n)
{
    redsem__conn_close(&n->conn);
    n->connected = false;
    redsem__endpoint_clear(&n->ep);
    redsem__tls_ctx_free(n->tls_ctx);
    n->tls_ctx = NULL;
    redsem__free(n->tls_server_name);
    n->tls_server_name = NULL;
}

static bool starts(const redisReply *r, const char *word)
{
    size_t l = strlen(word);
    return r->type == REDIS_REPLY_ERROR && r->str != NULL && r->len >= l &&
           memcmp(r->str, word, l) == 0;
}

bool redsem__redirect_reply(const redisReply *r)
{
    /* UNBLOCKED: a blocked BLPOP cut because its node became a replica (a failover) */
    return starts(r, "MOVED ") || starts(r, "ASK ") || starts(r, "TRYAGAIN") ||
           starts(r, "CLUSTERDOWN") || starts(r, "UNBLOCKED");
}

/* "MOVED 3999 127.0.0.1:6381" or "ASK ...": the slot and the address (the host may be empty:
 * the node's own, as the Cluster specification allows; an IPv6 address ends at the last ':'). */
static bool parse_redirect(const redsem__node *n, const redisReply *r, redsem__redirect *d)
{
    memset(d, 0, sizeof *d);
    if (!starts(r, "MOVED ") && !starts(r, "ASK ")) {
        d->kind = REDSEM__REDIR_TRYAGAIN;
        return true;
    }
    d->kind = starts(r, "ASK ") ? REDSEM__REDIR_ASK : REDSEM__REDIR_MOVED;
    char text[400];
    snprintf(text, sizeof text, "%.*s", (int)(r->len < 399 ? r->len : 399), r->str);
    char *sp = strchr(text, ' '), *addr = sp ? strchr(sp + 1, ' ') : NULL;
    char *colon = addr ? strrchr(addr + 1, ':') : NULL;
    if (colon == NULL)
        return false;
    char *end;
    long slot = strtol(sp + 1, &end, 10), port = strtol(colon + 1, NULL, 10);
    if (end != addr || slot < 0 || slot >= 16384 || port < 1 || port > 65535)
        return false;
    *colon = '\0';
    const char *host = addr[1] != '\0' ? addr + 1 : n->ep.host;
    if (host == NULL || strlen(host) >= sizeof d->host)
        return false;
    snprintf(d->host, sizeof d->host, "%s", host);
    d->slot = (int)slot;
    d->port = (int)port;
    return true;
}

int redsem__node_error_reply(redsem__node *n, const redisReply *r, const char *what)
{
    const char *s = r->str ? r->str : "";
    int code = REDSEM_ESERVER;
    int shown = (int)(r->len < 400 ? r->len : 400);
    if (redsem__redirect_reply(r)) {
        if (n->cluster && parse_redirect(n, r, &n->redirect)) {
            (void)redsem__ctx_err(n->ctx, REDSEM_ESERVER, "%s: %.*s", what, shown, s);
            return REDSEM__EREDIRECT;
        }
        if (!n->cluster && (starts(r, "MOVED ") || starts(r, "ASK ")))
            return redsem__ctx_err(n->ctx, code, "%s: %.*s (this server is a Redis Cluster "
                                   "node: connect with redis+cluster://host:port)",
                                   what, shown, s);
    }
    /* a command or key refused inside a script comes back as ERR: "The user executing the
     * script can't run this command or subcommand" / "... can't access at least one of the
     * keys ..." (Redis 6.0-7.0, inside "Error running script" on 6.x), "ACL failure in
     * script: User U has no permissions to run the 'hset' command" (Redis 7.2+, Valkey) */
    if (strncmp(s, "NOPERM", 6) == 0 || strncmp(s, "NOAUTH", 6) == 0 ||
        strncmp(s, "WRONGPASS", 9) == 0 || strstr(s, "The user executing the script can't") ||
        strstr(s, "ACL failure in script"))
        code = REDSEM_EPERM;
    else if (strncmp(s, "CONFLICT", 8) == 0)
        code = REDSEM_ECONFLICT;
    return redsem__ctx_err(n->ctx, code, "%s: %.*s", what, shown, s);
}

void redsem__node_disconnect(redsem__node *n)
{
    if (n->connected)
        redsem__conn_close(&n->conn);
    n->connected = false;
}

void redsem__clock_init(redsem__clock *k)
{
    atomic_init(&k->offset_us, INT64_MIN);
}

void redsem__clock_note(redsem__clock *k, int64_t server_us, int64_t recv_ns)
{
    if (server_us <= 0 || recv_ns <= 0)
        return;
    /* The reply left the server before we read it: this underestimates the offset by the
     * reply's one-way latency, which the not-after margin covers. */
    atomic_store_explicit(&k->offset_us, server_us - recv_ns / 1000, memory_order_relaxed);
}

int64_t redsem__clock_not_after_us(const redsem__clock *k, int64_t command_timeout_ms)
{
    int64_t off = atomic_load_explicit(&k->offset_us, memory_order_relaxed);
    if (off == INT64_MIN)
        return 0;
    /* margin: the offset's error (one-way latency) and the drift of the two clocks between
     * measurements (NTP slews at most 0.05 %) */
    int64_t margin_us = 100000;
    return redsem__now_ns() / 1000 + off + command_timeout_ms * 1000 + margin_us;
}

void redsem__node_note_server_clock(redsem__node *n, int64_t server_us, int64_t recv_ns)
{
    redsem__clock_note(n->clock, server_us, recv_ns);
}

int64_t redsem__node_not_after_us(const redsem__node *n)
{
    return redsem__clock_not_after_us(n->clock, n->command_timeout_ms);
}

/* ---------------------------------------------------------------- the handshake */

/* AUTH or SELECT: +OK, or a refusal (a configuration error). */
static int judge_status(redsem__node *n, const redisReply *r, const char *what, char *err,
                        size_t errlen)
{
    if (r->type == REDIS_REPLY_ERROR) {
        int rc = redsem__node_error_reply(n, r, what);
        snprintf(err, errlen, "%s", n->ctx->errmsg);
        return rc;
    }
    if (r->type != REDIS_REPLY_STATUS) {
        snprintf(err, errlen, "%s: unexpected reply type %d", what, r->type);
        return REDSEM_EPROTO;
    }
    return REDSEM_OK;
}

/* TIME on the client's first connection, so that its first acquire can carry a not-after
 * time (later acquire replies keep the estimate fresh; it stays valid across reconnects to
 * the same server). A TIME that gets no reply fails the connect: the connection would be out
 * of step. An error reply (an ACL without TIME) just leaves the offset unknown. */
static int judge_time(redsem__node *n, const redisReply *r, int64_t recv_ns)
{
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[1]->type == REDIS_REPLY_STRING)
        redsem__node_note_server_clock(n, strtoll(r->element[0]->str, NULL, 10) * 1000000 +
                                              strtoll(r->element[1]->str, NULL, 10),
                                       recv_ns);
    return REDSEM_OK;
}

/* ROLE: a node found through Sentinel must be the primary; a replica (Sentinel's view not yet
 * updated after a failover, or a stale address) is refused as a lost connection, so that the
 * call resolves again within its retry window. */
static int judge_role(redsem__node *n, const redisReply *r, char *err, size_t errlen)
{
    int rc = REDSEM_OK;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = redsem__node_error_reply(n, r, "ROLE");
        snprintf(err, errlen, "%s", n->ctx->errmsg);
    } else if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
               r->element[0]->type != REDIS_REPLY_STRING) {
        snprintf(err, errlen, "ROLE: unexpected reply");
        rc = REDSEM_EPROTO;
    } else if (strcmp(r->element[0]->str, "master") != 0) {
        snprintf(err, errlen, "%s:%d is a %s, not the primary (Sentinel named it)", n->ep.host,
                 n->ep.port, r->element[0]->str);
        rc = REDSEM_ECONN;
    }
    if (rc == REDSEM_OK)
        n->role_checked_ns = redsem__now_ns();
    return rc;
}

/* The value of field `name` in an INFO reply's text ("name:value\r\n" lines), cut to cap - 1
 * bytes; false if the field is not there. */
static bool info_field(const char *text, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = text; p != NULL && *p != '\0'; p = strchr(p, '\n'), p = p ? p + 1 : p)
        if (strncmp(p, name, nl) == 0 && p[nl] == ':') {
            size_t vl = strcspn(p + nl + 1, "\r\n");
            snprintf(out, cap, "%.*s", (int)(vl < cap ? vl : cap - 1), p + nl + 1);
            return true;
        }
    return false;
}

/* INFO memory: a server with maxmemory set and a policy other than noeviction may evict
 * redsem's keys (all of them have a TTL, so volatile-* policies too), which forgets holders:
 * refused with REDSEM_EEVICTION unless the client allows eviction. Read from INFO, which
 * managed services allow where they refuse CONFIG GET. Every connect checks: a reconnect may
 * reach another server (a Sentinel failover) or a changed configuration. */
static int judge_eviction(redsem__node *n, int rc, const redisReply *r, char *err, size_t errlen)
{
    static const char hint[] = "redsem_options_set_allow_eviction(), redsem --allow-eviction";
    if (rc != REDSEM_OK) {
        /* a stalled server: the call fails here, before its request was written */
        char why[200];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen, "%s (INFO memory, the eviction check at connect: the request "
                 "was not sent)", why);
        return rc;
    }
    char mm[32] = "", policy[64] = "", where[300];
    if (n->ep.kind == REDSEM__EP_UNIX)
        snprintf(where, sizeof where, "%.200s", n->ep.path);
    else
        snprintf(where, sizeof where, "%.200s:%d", n->ep.host, n->ep.port);
    if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0) {
        rc = redsem__node_error_reply(n, r, "INFO memory"); /* a password is missing */
        snprintf(err, errlen, "%s", n->ctx->errmsg);
    } else if (r->type == REDIS_REPLY_ERROR) {
        rc = redsem__node_error_reply(n, r, "INFO memory");
        snprintf(err, errlen, "%.120s (read to refuse a server that may evict redsem's keys: "
                 "allow INFO, or allow eviction: %s)", n->ctx->errmsg, hint);
    } else if (r->type != REDIS_REPLY_STRING) {
        snprintf(err, errlen, "INFO memory: unexpected reply type %d", r->type);
        rc = REDSEM_EPROTO;
    } else if (!info_field(r->str, "maxmemory", mm, sizeof mm) ||
               !info_field(r->str, "maxmemory_policy", policy, sizeof policy)) {
        snprintf(err, errlen, "INFO memory of %s has no maxmemory or maxmemory_policy: cannot "
                 "tell if it may evict redsem's keys (allow eviction: %s)", where, hint);
        rc = REDSEM_EEVICTION;
    } else if (strtoll(mm, NULL, 10) != 0 && strcmp(policy, "noeviction") != 0) {
        snprintf(err, errlen, "%s has maxmemory %s with maxmemory-policy %s: it may evict "
                 "redsem's keys and forget holders; use noeviction, or allow eviction (%s)",
                 where, mm, policy, hint);
        rc = REDSEM_EEVICTION;
    }
    return rc;
}

void redsem__handshake_plan(const redsem__node *n, bool with_role, redsem__handshake *h)
{
    h->n = 0;
    if (n->ep.password != NULL)
        h->step[h->n++] = REDSEM__HS_AUTH;
    if (n->ep.db != 0)
        h->step[h->n++] = REDSEM__HS_SELECT;
    if (atomic_load_explicit(&n->clock->offset_us, memory_order_relaxed) == INT64_MIN)
        h->step[h->n++] = REDSEM__HS_TIME;
    if (with_role && n->resolve != NULL)
        h->step[h->n++] = REDSEM__HS_ROLE;
    if (!n->allow_eviction)
        h->step[h->n++] = REDSEM__HS_EVICTION;
}

int redsem__handshake_format(const redsem__node *n, int step, char **cmd)
{
    static const char *const fixed[] = {
        [REDSEM__HS_TIME] = "*1\r\n$4\r\nTIME\r\n",
        [REDSEM__HS_ROLE] = "*1\r\n$4\r\nROLE\r\n",
        [REDSEM__HS_EVICTION] = "*2\r\n$4\r\nINFO\r\n$6\r\nmemory\r\n",
    };
    redsem__args a;
    redsem__args_init(&a);
    if (step == REDSEM__HS_AUTH) {
        redsem__args_str(&a, "AUTH");
        if (n->ep.user != NULL)
            redsem__args_str(&a, n->ep.user);
        redsem__args_str(&a, n->ep.password);
    } else if (step == REDSEM__HS_SELECT) {
        redsem__args_str(&a, "SELECT");
        redsem__args_i64(&a, n->ep.db);
    } else {
        size_t len = strlen(fixed[step]);
        *cmd = redsem__malloc(len);
        if (*cmd == NULL)
            return -1;
        memcpy(*cmd, fixed[step], len);
        return (int)len;
    }
    char *f = NULL;
    int len = redsem__args_format(&a, &f);
    *cmd = len < 0 ? NULL : redsem__malloc((size_t)len);
    if (*cmd != NULL)
        memcpy(*cmd, f, (size_t)len);
    if (f != NULL) {
        sodium_memzero(f, (size_t)len); /* AUTH's password */
        redisFreeCommand(f);
    }
    return *cmd == NULL ? -1 : len;
}

void redsem__handshake_free(char *cmd, int len)
{
    if (cmd != NULL && len > 0)
        sodium_memzero(cmd, (size_t)len);
    redsem__free(cmd);
}

int redsem__handshake_judge(redsem__node *n, int step, int rc, const redisReply *r,
                            int64_t recv_ns, char *err, size_t errlen)
{
    if (step == REDSEM__HS_EVICTION)
        return judge_eviction(n, rc, r, err, errlen);
    if (rc != REDSEM_OK)
        return rc;
    switch (step) {
    case REDSEM__HS_AUTH:
        return judge_status(n, r, "AUTH", err, errlen);
    case REDSEM__HS_SELECT:
        return judge_status(n, r, "SELECT", err, errlen);
    case REDSEM__HS_TIME:
        return judge_time(n, r, recv_ns);
    default:
        return judge_role(n, r, err, errlen);
    }
}

bool redsem__handshake_failed(const redsem__node *n, int rc, char *err, size_t errlen)
{
    /* A TLS port drops a client that does not start with a TLS handshake; a server that
     * requires client certificates drops one without (TLS 1.3 tells the client only then). */
    if (rc == REDSEM_ECONN && n->ep.kind == REDSEM__EP_TCP && strstr(err, "connection lost")) {
        size_t l = strlen(err);
        snprintf(err + l, errlen > l ? errlen - l : 0, "%s",
                 n->ep.tls ? " (just after the TLS handshake: does the server require a "
                             "client certificate? see redsem_options_set_tls_cert)"
                           : " (during the handshake: if this is a TLS port, use rediss://)");
    }
    /* Authentication and SELECT refusals are configuration errors: retrying won't help. */
    return rc == REDSEM_ECONN;
}

void redsem__node_opened(redsem__node *n)
{
    n->connected = true;
    REDSEM__COUNT(n->ctx, connects, 1);
}

bool redsem__loading_reply(const redisReply *r)
{
    return r->type == REDIS_REPLY_ERROR && r->str != NULL && strncmp(r->str, "LOADING", 7) == 0;
}

/* ---------------------------------------------------------------- scripts and WAIT */

void redsem__script_args(const redsem__script_def *d, bool body, bool load, int nkeys,
                         const redsem__args *ka, redsem__args *a, redsem__args *la)
{
    redsem__args_init(a);
    redsem__args_init(la);
    if (load) {
        redsem__args_str(la, "SCRIPT");
        redsem__args_str(la, "LOAD");
        redsem__args_mem(la, d->text, d->len);
    }
    if (body && !load) {
        redsem__args_str(a, "EVAL");
        redsem__args_mem(a, d->text, d->len);
    } else {
        redsem__args_str(a, "EVALSHA");
        redsem__args_mem(a, d->sha, 40);
    }
    redsem__args_i64(a, nkeys);
    for (int i = 0; i < ka->n; i++)
        redsem__args_mem(a, ka->v[i], ka->len[i]);
}

int redsem__node_wait_acked(redsem__node *n, const redisReply *w)
{
    /* The script ran whatever WAIT says: a refused or odd WAIT counts as no replica (the
     * caller then gives a grant back), with the reason in errmsg. */
    long long acked = 0;
    if (w->type == REDIS_REPLY_ERROR)
        (void)redsem__node_error_reply(n, w, "WAIT");
    else if (!redsem__reply_int(w, &acked) || acked < 0) {
        acked = 0;
        (void)redsem__ctx_err(n->ctx, REDSEM_EPROTO, "WAIT: unexpected reply");
    }
    return (int)(acked > INT32_MAX ? INT32_MAX : acked);
}

