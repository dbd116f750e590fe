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

/* Give a connection up after a failure. Abortive: a request that is still unacknowledged
 * (a partition) is discarded by the kernel instead of being retransmitted and applied when
 * the network heals, long after the caller was told its outcome was unknown. */
static void drop_connection(redsem__node *n)
{
    redsem__conn_abort(&n->conn);
    n->connected = false;
}

void redsem__node_disconnect(redsem__node *n)
{
    if (n->connected)
        redsem__conn_close(&n->conn);
    n->connected = false;
}

/* Requests on the raw connection, pipelined in one write (cmd holds them all), and their
 * nrets replies; no reconnect, no retry. On failure no reply is kept. */
/* uncounted: leading replies whose requests are not counted in stats.requests (the SCRIPT
 * LOAD before a script's first EVALSHA: counted in script_loads) */
static int raw_roundtrip_n(redsem__node *n, const char *cmd, size_t len, int64_t deadline_ns,
                           redisReply **rets, int nrets, int uncounted, bool *written, char *err,
                           size_t errlen)
{
    int err_no = 0;
    *written = false;
    int io = redsem__conn_write(&n->conn, cmd, len, deadline_ns, &err_no);
    if (io == REDSEM__IO_OK) {
        *written = true;
        REDSEM__COUNT(n->ctx, requests, (uint64_t)(nrets - uncounted));
        for (int i = 0; i < nrets && io == REDSEM__IO_OK; i++) {
            io = redsem__conn_read(&n->conn, &rets[i], deadline_ns, &err_no, err, errlen);
            if (io != REDSEM__IO_OK)
                for (int j = 0; j < i; j++) {
                    freeReplyObject(rets[j]);
                    rets[j] = NULL;
                }
        }
    }
    return redsem__io_status(io, err_no, err, errlen);
}

static const char role_cmd[] = "*1\r\n$4\r\nROLE\r\n";

/* Whether a ROLE reply names something other than a primary ("slave", "sentinel"). An error
 * reply tells nothing (the connect's check passed: not expected) and is let through. */
static bool role_not_primary(const redisReply *r)
{
    return r->type != REDIS_REPLY_ERROR &&
           (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
            r->element[0]->type != REDIS_REPLY_STRING || strcmp(r->element[0]->str, "master") != 0);
}

/* Before a request on the open connection of a node found through Sentinel: whether its
 * topology learnt that the primary moved away from it (+switch-master: the old primary stays
 * a writable primary until Sentinel demotes it, seconds later, so neither READONLY nor a lost
 * connection would tell). Then the connection is dropped, nothing was sent, and err says why:
 * the caller goes on as after READONLY. */
static bool primary_moved(redsem__node *n, char *err, size_t errlen)
{
    if (!n->connected || n->moved == NULL || !n->moved(n->resolve_arg, n, err, errlen))
        return false;
    drop_connection(n);
    return true;
}

/* raw_roundtrip_n, with ROLE in front in the same write (no extra round trip) when the node
 * was found through Sentinel and last checked more than REDSEM__ROLE_CHECK_MS ago. On
 * REDSEM_OK with *demoted set, the server no longer says it is the primary: no reply is kept
 * and err says why (a replica applies no write: what ran there is as if refused with
 * READONLY). nrets <= REDSEM__BATCH_MAX. */
static int roundtrip_checked(redsem__node *n, const char *cmd, size_t len, int64_t deadline_ns,
                             redisReply **rets, int nrets, int uncounted, bool *written,
                             bool *demoted, char *err, size_t errlen)
{
    *demoted = false;
    int64_t now = redsem__now_ns();
    char *all = NULL;
    if (n->resolve != NULL && nrets <= REDSEM__BATCH_MAX &&
        now - n->role_checked_ns >= REDSEM__ROLE_CHECK_MS * REDSEM__NS_PER_MS)
        all = redsem__malloc(sizeof role_cmd - 1 + len); /* NULL: checked next time */
    if (all == NULL)
        return raw_roundtrip_n(n, cmd, len, deadline_ns, rets, nrets, uncounted, written, err,
                               errlen);
    memcpy(all, role_cmd, sizeof role_cmd - 1);
    memcpy(all + sizeof role_cmd - 1, cmd, len);
    redisReply *got[REDSEM__BATCH_MAX + 1];
    int rc = raw_roundtrip_n(n, all, sizeof role_cmd - 1 + len, deadline_ns, got, nrets + 1,
                             uncounted, written, err, errlen);
    redsem__free(all);
    if (rc != REDSEM_OK)
        return rc;
    *demoted = role_not_primary(got[0]);
    freeReplyObject(got[0]);
    if (*demoted) {
        for (int i = 1; i <= nrets; i++)
            freeReplyObject(got[i]);
        snprintf(err, errlen, "%s:%d is no longer the primary (ROLE)", n->ep.host, n->ep.port);
        return REDSEM_OK;
    }
    n->role_checked_ns = now;
    memcpy(rets, got + 1, (size_t)nrets * sizeof *rets);
    return REDSEM_OK;
}

static int raw_roundtrip(redsem__node *n, const char *cmd, size_t len, int64_t deadline_ns,
                         redisReply **ret, bool *written, char *err, size_t errlen)
{
    return raw_roundtrip_n(n, cmd, len, deadline_ns, ret, 1, 0, written, err, errlen);
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

/* One step of the blocking handshake on the raw connection: within the connect's deadline,
 * and TIME and INFO within one command timeout too. */
static int handshake_step(redsem__node *n, int step, int64_t deadline_ns, char *err,
                          size_t errlen)
{
    int64_t dl = deadline_ns;
    if (step == REDSEM__HS_TIME || step == REDSEM__HS_EVICTION) {
        dl = redsem__now_ns() + n->command_timeout_ms * REDSEM__NS_PER_MS;
        if (deadline_ns < dl)
            dl = deadline_ns;
    }
    char *cmd = NULL;
    int len = redsem__handshake_format(n, step, &cmd);
    if (len < 0)
        return REDSEM_ENOMEM;
    redisReply *r = NULL;
    bool written;
    int rc = raw_roundtrip(n, cmd, (size_t)len, dl, &r, &written, err, errlen);
    redsem__handshake_free(cmd, len);
    rc = redsem__handshake_judge(n, step, rc, r, redsem__now_ns(), err, errlen);
    if (r != NULL)
        freeReplyObject(r);
    return rc;
}

int redsem__node_connect(redsem__node *n, bool *retryable, char *err, size_t errlen)
{
    int64_t deadline = redsem__deadline_after_ms(n->connect_timeout_ms);
    int64_t cap = redsem__ctx_cap(n->ctx);
    if (cap != 0 && cap < deadline)
        deadline = cap;
    drop_connection(n);
    if (n->resolve != NULL) {
        int rc = n->resolve(n->resolve_arg, n, deadline, err, errlen);
        if (rc != REDSEM_OK) {
            *retryable = rc == REDSEM_ECONN;
            return rc;
        }
    }
    redsem__conn_tls tls = {n->tls_ctx, n->tls_server_name};
    int rc = redsem__conn_open(&n->conn, &n->ep, &tls, deadline, n->command_timeout_ms,
                               retryable, err, errlen);
    if (rc != REDSEM_OK)
        return rc;
    redsem__handshake h;
    redsem__handshake_plan(n, true, &h);
    for (int i = 0; i < h.n && rc == REDSEM_OK; i++)
        rc = handshake_step(n, h.step[i], deadline, err, errlen);
    if (rc != REDSEM_OK) {
        *retryable = redsem__handshake_failed(n, rc, err, errlen);
        drop_connection(n);
        return rc;
    }
    redsem__node_opened(n);
    return REDSEM_OK;
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

static int64_t retry_deadline(const redsem__node *n, int64_t now)
{
    return redsem__ctx_retry_until(n->ctx, now + n->retry_ms * REDSEM__NS_PER_MS);
}

/* Jittered exponential backoff, 5 ms doubling to 100 ms, never past retry_until. */
static void nap_before_retry(redsem__node *n, int64_t *backoff, int64_t retry_until)
{
    int64_t now = redsem__now_ns();
    int64_t nap = redsem__rand_between(*backoff / 2, *backoff);
    if (nap > retry_until - now)
        nap = retry_until - now;
    redsem__sleep_ns(nap);
    *backoff = *backoff * 2 > 100 * REDSEM__NS_PER_MS ? 100 * REDSEM__NS_PER_MS : *backoff * 2;
    REDSEM__COUNT(n->ctx, retries, 1);
}

int redsem__node_request(redsem__node *n, const redsem__args *a, int flags, int64_t deadline_ns,
                         redisReply **ret_reply, redsem__req_info *info)
{
    return redsem__node_request2(n, a, NULL, flags, deadline_ns, ret_reply, NULL, info);
}

/* The bytes of a request: [pre] [ASKING (after a cluster's ASK)] a [then], in one buffer so
 * that they go in one write (one round trip). ASKING applies to the one command after it, so it
 * goes right before a (pre is a SCRIPT LOAD, which names no key). Freed with redisFreeCommand
 * when it is a alone, else with redsem__free. The length, or -1 without memory. */
static int format_requests(const redsem__node *n, const redsem__args *pre, const redsem__args *a,
                           const redsem__args *then, char **out)
{
    static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
    char *cmd0 = NULL, *cmd = NULL, *cmd2 = NULL;
    int len = redsem__args_format(a, &cmd);
    if (len < 0)
        return -1;
    if (pre == NULL && then == NULL && !n->asking) {
        *out = cmd;
        return len;
    }
    int len0 = pre != NULL ? redsem__args_format(pre, &cmd0) : 0;
    int len2 = then != NULL ? redsem__args_format(then, &cmd2) : 0;
    size_t ask = n->asking ? sizeof asking - 1 : 0;
    char *all = len0 < 0 || len2 < 0
                    ? NULL
                    : redsem__malloc((size_t)len0 + ask + (size_t)len + (size_t)len2);
    if (all != NULL) {
        if (cmd0 != NULL)
            memcpy(all, cmd0, (size_t)len0);
        memcpy(all + len0, asking, ask);
        memcpy(all + len0 + ask, cmd, (size_t)len);
        if (cmd2 != NULL)
            memcpy(all + len0 + ask + len, cmd2, (size_t)len2);
    }
    if (cmd0 != NULL)
        redisFreeCommand(cmd0);
    redisFreeCommand(cmd);
    if (cmd2 != NULL)
        redisFreeCommand(cmd2);
    *out = all;
    return all == NULL ? -1 : len0 + (int)ask + len + len2;
}

/* Before a request's attempt: connect n if it is not, and give up a connection to a primary
 * the Sentinels announced they moved away from (nothing sent). REDSEM_OK: send; else the
 * fault (set on n's context), *retry: it may be retried within the window. */
static int send_ready(redsem__node *n, bool *retry, char *err, size_t errlen)
{
    bool retryable = true;
    *retry = false;
    if (!n->connected) {
        int rc = redsem__node_connect(n, &retryable, err, errlen);
        if (rc != REDSEM_OK) {
            redsem__ctx_err(n->ctx, rc, "%s", err);
            /* a cluster node that cannot be reached: the topology asks the cluster
             * where its slots went before it retries */
            *retry = rc == REDSEM_ECONN && retryable && !n->cluster;
            return rc;
        }
    }
    if (primary_moved(n, err, errlen)) {
        /* Sentinel switched the primary, the old one still accepts writes: nothing was
         * sent; resolve again and resend, as after READONLY below */
        redsem__ctx_err(n->ctx, REDSEM_ECONN, "%s", err);
        *retry = true;
        return REDSEM_ECONN;
    }
    return REDSEM_OK;
}

/* Free the replies of an attempt that is made again: a's (r), then's (r2) and pre's (r0),
 * the last two if any. */
static void free_replies(redisReply *r, redisReply *r2, redisReply *r0)
{
    freeReplyObject(r);
    if (r2 != NULL)
        freeReplyObject(r2);
    if (r0 != NULL)
        freeReplyObject(r0);
}

/* Hand out the replies of a request that succeeded: a's to *ret_reply, then's (r2) and pre's
 * (r0) where asked for, else freed. */
static void hand_out(redisReply *r, redisReply *r2, redisReply *r0, redisReply **ret_pre,
                     redisReply **ret_reply, redisReply **ret_then)
{
    *ret_reply = r;
    if (ret_then != NULL)
        *ret_then = r2;
    else if (r2 != NULL)
        freeReplyObject(r2);
    if (ret_pre != NULL)
        *ret_pre = r0;
    else if (r0 != NULL)
        freeReplyObject(r0);
}

/* After a lost connection: whether the request may be sent again (flags' REDSEM__REQ_RETRY,
 * within n's retry window, which starts at the first loss: *retry_until), after a nap. */
static bool retry_after_nap(redsem__node *n, int flags, int64_t *retry_until, int64_t *backoff)
{
    if (!(flags & REDSEM__REQ_RETRY) || n->retry_ms == 0)
        return false;
    int64_t now = redsem__now_ns();
    if (*retry_until == 0)
        *retry_until = retry_deadline(n, now);
    if (now >= *retry_until)
        return false;
    nap_before_retry(n, backoff, *retry_until);
    return true;
}

/* The request loop of node_request3 on bytes already formatted (cmd: [pre] [ASKING] a
 * [then]): connect, write, read, reconnect and resend within the retry window. The replies
 * judged (LOADING, READONLY) are a's: pre's is returned as it came. */
static int send_formatted(redsem__node *n, const char *cmd, size_t len, bool has_pre,
                          bool has_then, int flags, int64_t deadline_ns, redisReply **ret_pre,
                          redisReply **ret_reply, redisReply **ret_then, redsem__req_info *info)
{
    redsem__req_info dummy;
    if (info == NULL)
        info = &dummy;
    info->maybe_applied = false;
    info->sent_ns = 0;
    info->recv_ns = 0;
    info->replicas_acked = -1;

    /* replies: [pre's], [ASKING's], a's, [then's] */
    int p0 = has_pre ? 1 : 0;
    int first = p0 + (n->asking ? 1 : 0), nrets = first + 1 + (has_then ? 1 : 0);

    int64_t retry_until = 0, backoff = 5 * REDSEM__NS_PER_MS;
    int rc;
    char err[256];
    for (;;) {
        bool may_retry = false;
        rc = send_ready(n, &may_retry, err, sizeof err);
        if (rc != REDSEM_OK && may_retry)
            goto retry;
        if (rc != REDSEM_OK)
            break;
        int64_t sent = redsem__now_ns();
        /* 0: an ordinary request, bounded by the socket's timeout (the command timeout) */
        int64_t dl = deadline_ns, cap = redsem__ctx_cap(n->ctx);
        if (cap != 0 && (dl == 0 || cap < dl))
            dl = cap;
        bool written = false, demoted = false;
        redisReply *rets[4] = {NULL, NULL, NULL, NULL};
        rc = roundtrip_checked(n, cmd, len, dl, rets, nrets, p0, &written, &demoted, err,
                               sizeof err);
        if (rc == REDSEM_OK && demoted) {
            drop_connection(n);
            redsem__ctx_err(n->ctx, REDSEM_ECONN, "%s", err);
            rc = REDSEM_ECONN;
            goto retry;
        }
        if (rc == REDSEM_OK && first > p0)
            freeReplyObject(rets[p0]); /* ASKING's +OK (an error there shows in the next) */
        redisReply *r = rets[first], *r2 = has_then ? rets[first + 1] : NULL;
        redisReply *r0 = has_pre ? rets[0] : NULL;
        if (rc == REDSEM_OK && redsem__loading_reply(r) && (flags & REDSEM__REQ_RETRY) &&
            n->retry_ms > 0) {
            /* A restarted server loading its data refuses every command, executing nothing:
             * wait for it within the retry window, on the same connection. */
            int64_t now = redsem__now_ns();
            if (retry_until == 0)
                retry_until = retry_deadline(n, now);
            if (now < retry_until) {
                free_replies(r, r2, r0);
                nap_before_retry(n, &backoff, retry_until);
                continue;
            }
        }
        if (rc == REDSEM_OK && n->resolve != NULL && r->type == REDIS_REPLY_ERROR &&
            r->str != NULL && strncmp(r->str, "READONLY", 8) == 0) {
            /* The node was demoted to a replica under us (a failover): the request was
             * refused before anything was written. Resolve the primary again and resend. */
            snprintf(err, sizeof err, "%s:%d became a replica (READONLY)", n->ep.host,
                     n->ep.port);
            free_replies(r, r2, r0);
            drop_connection(n);
            redsem__ctx_err(n->ctx, REDSEM_ECONN, "%s", err);
            rc = REDSEM_ECONN;
            goto retry;
        }
        if (rc == REDSEM_OK) {
            info->sent_ns = sent;
            info->recv_ns = redsem__now_ns();
            hand_out(r, r2, r0, ret_pre, ret_reply, ret_then);
            break;
        }
        drop_connection(n);
        if (written)
            info->maybe_applied = true;
        redsem__ctx_err(n->ctx, rc, "%s", err);
        if (rc != REDSEM_ECONN)
            break; /* timeouts are not retried: the server may be stalled */
    retry:
        if (!retry_after_nap(n, flags, &retry_until, &backoff)) {
            rc = REDSEM_ECONN;
            break;
        }
    }
    return rc;
}

int redsem__node_request3(redsem__node *n, const redsem__args *pre, const redsem__args *a,
                          const redsem__args *then, int flags, int64_t deadline_ns,
                          redisReply **ret_pre, redisReply **ret_reply, redisReply **ret_then,
                          redsem__req_info *info)
{
    char *cmd = NULL;
    int len = format_requests(n, pre, a, then, &cmd);
    if (len < 0) {
        if (info != NULL)
            *info = (redsem__req_info){false, 0, 0, -1};
        return redsem__ctx_err(n->ctx, REDSEM_ENOMEM, "out of memory formatting a request");
    }
    bool combined = pre != NULL || then != NULL || n->asking; /* format_requests' own buffer */
    int rc = send_formatted(n, cmd, (size_t)len, pre != NULL, then != NULL, flags, deadline_ns,
                            ret_pre, ret_reply, ret_then, info);
    if (combined)
        redsem__free(cmd);
    else
        redisFreeCommand(cmd);
    return rc;
}

int redsem__node_request2(redsem__node *n, const redsem__args *a, const redsem__args *then,
                          int flags, int64_t deadline_ns, redisReply **ret_reply,
                          redisReply **ret_then, redsem__req_info *info)
{
    return redsem__node_request3(n, NULL, a, then, flags, deadline_ns, NULL, ret_reply, ret_then,
                                 info);
}

int redsem__node_blpop_many(redsem__node *n, const char *const *keys, const size_t *lens,
                            int nkeys, int64_t wait_ms, int64_t hard_deadline_ns, int *which,
                            char *val, size_t valcap)
{
    *which = -1;
    if (val != NULL && valcap > 0)
        val[0] = '\0';
    if (wait_ms < 1)
        wait_ms = 1;
    /* The server's BLPOP timeout only fires on its event-loop tick (hz 10: up to 100 ms
     * late), so precision comes from our socket deadline: at hard_deadline_ns the request is
     * abandoned and the connection discarded (the next request reconnects). */
    int64_t soft = redsem__now_ns() + (wait_ms + n->command_timeout_ms) * REDSEM__NS_PER_MS;
    int64_t dl = hard_deadline_ns < soft ? hard_deadline_ns : soft;
    char secs[32];
    snprintf(secs, sizeof secs, "%lld.%03lld", (long long)(wait_ms / 1000),
             (long long)(wait_ms % 1000));
    const char **argv = redsem__calloc((size_t)nkeys + 2, sizeof *argv);
    size_t *argl = redsem__calloc((size_t)nkeys + 2, sizeof *argl);
    char *cmd = NULL;
    int len = -1;
    if (argv != NULL && argl != NULL) {
        argv[0] = "BLPOP";
        argl[0] = 5;
        for (int i = 0; i < nkeys; i++) {
            argv[i + 1] = keys[i];
            argl[i + 1] = lens[i];
        }
        argv[nkeys + 1] = secs;
        argl[nkeys + 1] = strlen(secs);
        len = redisFormatCommandArgv(&cmd, nkeys + 2, argv, argl);
    }
    redsem__free(argv);
    redsem__free(argl);
    char *all = NULL;
    if (len >= 0 && n->asking) {
        /* after a cluster's ASK: ASKING in the same write (send_formatted reads its +OK) */
        static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
        all = redsem__malloc(sizeof asking - 1 + (size_t)len);
        if (all != NULL) {
            memcpy(all, asking, sizeof asking - 1);
            memcpy(all + sizeof asking - 1, cmd, (size_t)len);
        }
        len = all != NULL ? len + (int)(sizeof asking - 1) : -1;
    }
    if (len < 0) {
        if (cmd != NULL)
            redisFreeCommand(cmd);
        return redsem__ctx_err(n->ctx, REDSEM_ENOMEM, "out of memory formatting BLPOP");
    }
    redisReply *r = NULL;
    int rc = send_formatted(n, all != NULL ? all : cmd, (size_t)len, false, false,
                            REDSEM__REQ_RETRY, dl, NULL, &r, NULL, NULL);
    redisFreeCommand(cmd);
    redsem__free(all);
    if (rc == REDSEM_ETIMEDOUT && dl == hard_deadline_ns) {
        n->ctx->errmsg[0] = '\0';
        *which = -2;
        return REDSEM_OK; /* our own deadline, not a fault */
    }
    if (rc != REDSEM_OK)
        return rc;
    if (r->type == REDIS_REPLY_ERROR && n->resolve != NULL && starts(r, "UNBLOCKED")) {
        /* A Sentinel primary demoted while we waited (a failover that did not close our
         * connection): the wait was cut, nothing popped. Like READONLY: drop the connection
         * so that the next request resolves the primary again (and retries until one says
         * it is the primary, within the retry window); the caller's loop goes on within its
         * own deadline. */
        drop_connection(n);
        REDSEM__COUNT(n->ctx, retries, 1);
        freeReplyObject(r);
        return REDSEM_OK;
    }
    if (r->type == REDIS_REPLY_ERROR)
        rc = redsem__node_error_reply(n, r, "BLPOP");
    else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
             r->element[0]->type == REDIS_REPLY_STRING) {
        /* {key, value}: which list had an element */
        for (int i = 0; i < nkeys && *which < 0; i++)
            if (lens[i] == (size_t)r->element[0]->len &&
                memcmp(keys[i], r->element[0]->str, lens[i]) == 0)
                *which = i;
        if (*which < 0)
            *which = 0; /* cannot happen; count it as the first key's */
        const redisReply *v = r->element[1];
        if (val != NULL && valcap > 0 && v->type == REDIS_REPLY_STRING) {
            /* the element (a fair waiter's id on its client's list); longer ones cut */
            size_t vl = v->len < valcap - 1 ? (size_t)v->len : valcap - 1;
            memcpy(val, v->str, vl);
            val[vl] = '\0';
        }
    }
    freeReplyObject(r);
    return rc;
}

int redsem__node_blpop(redsem__node *n, const char *key, size_t keylen, int64_t wait_ms,
                       int64_t hard_deadline_ns, bool *signaled)
{
    int which = -1;
    int rc = redsem__node_blpop_many(n, &key, &keylen, 1, wait_ms, hard_deadline_ns, &which,
                                     NULL, 0);
    *signaled = which >= 0;
    if (*signaled)
        REDSEM__COUNT(n->ctx, wakeups, 1);
    return rc;
}
