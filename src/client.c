/* redsem - options, the client handle, requests with reconnect/retry, scripts (EVALSHA with
 * NOSCRIPT reload), BLPOP waits and error reporting. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "internal.h"

/* ================================================================ options */

int redsem_options_new(redsem_options **ret_options)
{
    if (ret_options == NULL)
        return REDSEM_EINVAL;
    redsem_options *o = redsem__calloc(1, sizeof *o);
    if (o == NULL)
        return REDSEM_ENOMEM;
    o->connect_timeout_ms = REDSEM_DEFAULT_CONNECT_TIMEOUT_MS;
    o->command_timeout_ms = REDSEM_DEFAULT_COMMAND_TIMEOUT_MS;
    o->retry_ms = REDSEM_DEFAULT_RETRY_MS;
    o->prefix = redsem__strdup(REDSEM_DEFAULT_KEY_PREFIX);
    if (o->prefix == NULL ||
        redsem__url_parse(REDSEM_DEFAULT_URL, &o->ep, NULL, 0) != REDSEM_OK) {
        redsem_options_free(o);
        return REDSEM_ENOMEM;
    }
    *ret_options = o;
    return REDSEM_OK;
}

void redsem_options_free(redsem_options *o)
{
    if (o == NULL)
        return;
    redsem__endpoint_clear(&o->ep);
    redsem__free(o->prefix);
    redsem__free(o);
}

int redsem_options_set_url(redsem_options *o, const char *url)
{
    if (o == NULL || url == NULL)
        return REDSEM_EINVAL;
    redsem__endpoint ep;
    int rc = redsem__url_parse(url, &ep, NULL, 0);
    if (rc != REDSEM_OK)
        return rc;
    redsem__endpoint_clear(&o->ep);
    o->ep = ep;
    return REDSEM_OK;
}

static int set_ms(int64_t *field, int64_t ms, int64_t lo)
{
    if (ms < lo || ms > REDSEM_TIMEOUT_MAX_MS)
        return REDSEM_EINVAL;
    *field = ms;
    return REDSEM_OK;
}

int redsem_options_set_connect_timeout_ms(redsem_options *o, int64_t ms)
{
    return o ? set_ms(&o->connect_timeout_ms, ms, 1) : REDSEM_EINVAL;
}

int redsem_options_set_command_timeout_ms(redsem_options *o, int64_t ms)
{
    return o ? set_ms(&o->command_timeout_ms, ms, 1) : REDSEM_EINVAL;
}

int redsem_options_set_retry_ms(redsem_options *o, int64_t ms)
{
    return o ? set_ms(&o->retry_ms, ms, 0) : REDSEM_EINVAL;
}

int redsem_options_set_key_prefix(redsem_options *o, const char *prefix)
{
    if (o == NULL || !redsem__valid_prefix(prefix))
        return REDSEM_EINVAL;
    char *p = redsem__strdup(prefix);
    if (p == NULL)
        return REDSEM_ENOMEM;
    redsem__free(o->prefix);
    o->prefix = p;
    return REDSEM_OK;
}

/* ================================================================ errors */

int redsem__set_err(redsem_client *c, int code, const char *fmt, ...)
{
    if (c != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void redsem__clear_err(redsem_client *c)
{
    c->errmsg[0] = '\0';
}

const char *redsem_client_errmsg(const redsem_client *c)
{
    return c ? c->errmsg : "";
}

int redsem__check_owner(redsem_client *c)
{
    redsem__clear_err(c);
    if (c->pid != getpid())
        return redsem__set_err(c, REDSEM_EFORKED,
                               "this client was created by process %ld; it cannot be used "
                               "in process %ld (after fork)",
                               (long)c->pid, (long)getpid());
    return REDSEM_OK;
}

int redsem__error_reply(redsem_client *c, const redisReply *r, const char *what)
{
    const char *s = r->str ? r->str : "";
    int code = REDSEM_ESERVER;
    if (strncmp(s, "NOPERM", 6) == 0 || strncmp(s, "NOAUTH", 6) == 0 ||
        strncmp(s, "WRONGPASS", 9) == 0)
        code = REDSEM_EPERM;
    else if (strncmp(s, "CONFLICT", 8) == 0)
        code = REDSEM_ECONFLICT;
    return redsem__set_err(c, code, "%s: %.*s", what, (int)(r->len < 400 ? r->len : 400), s);
}

bool redsem__reply_int(const redisReply *r, long long *out)
{
    if (r == NULL || r->type != REDIS_REPLY_INTEGER)
        return false;
    *out = r->integer;
    return true;
}

int redsem__reply_status(redsem_client *c, const redisReply *r, const char *what,
                         long long *status)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        !redsem__reply_int(r->element[0], status))
        return redsem__set_err(c, REDSEM_EPROTO, "%s: unexpected reply", what);
    return REDSEM_OK;
}

bool redsem__reply_u64(const redisReply *r, uint64_t *out)
{
    long long v;
    if (!redsem__reply_int(r, &v) || v < 0)
        return false;
    *out = (uint64_t)v;
    return true;
}

/* ================================================================ argument vectors */

void redsem__args_init(redsem__args *a)
{
    a->n = 0;
}

void redsem__args_mem(redsem__args *a, const char *s, size_t len)
{
    if (a->n >= REDSEM__MAX_ARGS)
        return; /* callers never exceed the bound; checked by tests */
    a->v[a->n] = s;
    a->len[a->n] = len;
    a->n++;
}

void redsem__args_str(redsem__args *a, const char *s)
{
    redsem__args_mem(a, s, strlen(s));
}

void redsem__args_i64(redsem__args *a, int64_t v)
{
    if (a->n >= REDSEM__MAX_ARGS)
        return;
    int len = snprintf(a->num[a->n], sizeof a->num[a->n], "%lld", (long long)v);
    redsem__args_mem(a, a->num[a->n], (size_t)len);
}

/* ================================================================ connection */

/* Give a connection up after a failure. Abortive: a request that is still unacknowledged
 * (a partition) is discarded by the kernel instead of being retransmitted and applied when
 * the network heals, long after the caller was told its outcome was unknown. */
static void drop_connection(redsem_client *c)
{
    redsem__conn_abort(&c->conn);
    c->connected = false;
}

/* One request on the raw connection, no reconnect, no retry. */
static int raw_roundtrip(redsem_client *c, const char *cmd, size_t len, int64_t deadline_ns,
                         redisReply **ret, bool *written, char *err, size_t errlen)
{
    int err_no = 0;
    *written = false;
    int io = redsem__conn_write(&c->conn, cmd, len, deadline_ns, &err_no);
    if (io == REDSEM__IO_OK) {
        *written = true;
        c->stats.requests++;
        io = redsem__conn_read(&c->conn, ret, deadline_ns, &err_no, err, errlen);
    }
    switch (io) {
    case REDSEM__IO_OK:
        return REDSEM_OK;
    case REDSEM__IO_TIMEOUT:
        snprintf(err, errlen, "no reply from Redis within the deadline");
        return REDSEM_ETIMEDOUT;
    case REDSEM__IO_CLOSED:
        snprintf(err, errlen, "connection lost: %s",
                 err_no ? strerror(err_no) : "closed by the server");
        return REDSEM_ECONN;
    case REDSEM__IO_NOMEM:
        return REDSEM_ENOMEM;
    default:
        return REDSEM_EPROTO;
    }
}

static int handshake_cmd(redsem_client *c, const redsem__args *a, const char *what,
                         int64_t deadline_ns, char *err, size_t errlen)
{
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, a->n, (const char **)a->v, a->len);
    if (len < 0)
        return REDSEM_ENOMEM;
    redisReply *r = NULL;
    bool written;
    int rc = raw_roundtrip(c, cmd, (size_t)len, deadline_ns, &r, &written, err, errlen);
    redisFreeCommand(cmd);
    if (rc != REDSEM_OK)
        return rc;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = redsem__error_reply(c, r, what);
        snprintf(err, errlen, "%s", c->errmsg);
    } else if (r->type != REDIS_REPLY_STATUS) {
        snprintf(err, errlen, "%s: unexpected reply type %d", what, r->type);
        rc = REDSEM_EPROTO;
    }
    freeReplyObject(r);
    return rc;
}

void redsem__note_server_clock(redsem_client *c, int64_t server_us, int64_t recv_ns)
{
    if (server_us <= 0 || recv_ns <= 0)
        return;
    /* The reply left the server before we read it: this underestimates the offset by the
     * reply's one-way latency, which the not-after margin covers. */
    c->clock_offset_us = server_us - recv_ns / 1000;
    c->clock_offset_known = true;
}

int64_t redsem__not_after_us(const redsem_client *c)
{
    if (!c->clock_offset_known)
        return 0;
    /* margin: the offset's error (one-way latency) and the drift of the two clocks between
     * measurements (NTP slews at most 0.05 %) */
    int64_t margin_us = 100000;
    return redsem__now_ns() / 1000 + c->clock_offset_us + c->command_timeout_ms * 1000 +
           margin_us;
}

/* TIME on the client's first connection, so that its first acquire can carry a not-after
 * time (later acquire replies keep the estimate fresh; it stays valid across reconnects to
 * the same server). A TIME that gets no reply fails the connect: the connection would be out
 * of step. An error reply (an ACL without TIME) just leaves the offset unknown. */
static int measure_clock(redsem_client *c, int64_t deadline_ns, char *err, size_t errlen)
{
    if (c->clock_offset_known)
        return REDSEM_OK;
    static const char cmd[] = "*1\r\n$4\r\nTIME\r\n";
    int64_t dl = redsem__now_ns() + c->command_timeout_ms * REDSEM__NS_PER_MS;
    if (deadline_ns < dl)
        dl = deadline_ns;
    redisReply *r = NULL;
    bool written;
    int rc = raw_roundtrip(c, cmd, sizeof cmd - 1, dl, &r, &written, err, errlen);
    if (rc != REDSEM_OK)
        return rc;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[1]->type == REDIS_REPLY_STRING)
        redsem__note_server_clock(c, strtoll(r->element[0]->str, NULL, 10) * 1000000 +
                                         strtoll(r->element[1]->str, NULL, 10),
                                  redsem__now_ns());
    freeReplyObject(r);
    return REDSEM_OK;
}

/* Connect, AUTH, SELECT. On failure the connection is closed and err says why. */
static int connect_client(redsem_client *c, bool *retryable, char *err, size_t errlen)
{
    int64_t deadline = redsem__deadline_after_ms(c->connect_timeout_ms);
    if (c->deadline_cap_ns && c->deadline_cap_ns < deadline)
        deadline = c->deadline_cap_ns;
    drop_connection(c);
    int rc = redsem__conn_open(&c->conn, &c->ep, deadline, c->command_timeout_ms, retryable,
                               err, errlen);
    if (rc != REDSEM_OK)
        return rc;
    redsem__args a;
    if (c->ep.password != NULL) {
        redsem__args_init(&a);
        redsem__args_str(&a, "AUTH");
        if (c->ep.user != NULL)
            redsem__args_str(&a, c->ep.user);
        redsem__args_str(&a, c->ep.password);
        rc = handshake_cmd(c, &a, "AUTH", deadline, err, errlen);
    }
    if (rc == REDSEM_OK && c->ep.db != 0) {
        redsem__args_init(&a);
        redsem__args_str(&a, "SELECT");
        redsem__args_i64(&a, c->ep.db);
        rc = handshake_cmd(c, &a, "SELECT", deadline, err, errlen);
    }
    if (rc == REDSEM_OK)
        rc = measure_clock(c, deadline, err, errlen);
    if (rc != REDSEM_OK) {
        /* Authentication and SELECT refusals are configuration errors: retrying won't help. */
        *retryable = rc == REDSEM_ECONN;
        drop_connection(c);
        return rc;
    }
    c->connected = true;
    c->stats.connects++;
    return REDSEM_OK;
}

/* "-LOADING Redis is loading the dataset in memory": a restarted server reading its RDB or AOF
 * file; it executes nothing until it is done. */
static bool loading_reply(const redisReply *r)
{
    return r->type == REDIS_REPLY_ERROR && r->str != NULL && strncmp(r->str, "LOADING", 7) == 0;
}

static int64_t retry_deadline(const redsem_client *c, int64_t now)
{
    int64_t until = now + c->retry_ms * REDSEM__NS_PER_MS;
    if (c->deadline_cap_ns && c->deadline_cap_ns < until)
        until = c->deadline_cap_ns;
    return until;
}

/* Jittered exponential backoff, 5 ms doubling to 100 ms, never past retry_until. */
static void nap_before_retry(redsem_client *c, int64_t *backoff, int64_t retry_until)
{
    int64_t now = redsem__now_ns();
    int64_t nap = redsem__rand_between(*backoff / 2, *backoff);
    if (nap > retry_until - now)
        nap = retry_until - now;
    redsem__sleep_ns(nap);
    *backoff = *backoff * 2 > 100 * REDSEM__NS_PER_MS ? 100 * REDSEM__NS_PER_MS : *backoff * 2;
    c->stats.retries++;
}

int redsem__request(redsem_client *c, const redsem__args *a, int flags, int64_t deadline_ns,
                    redisReply **ret_reply, redsem__req_info *info)
{
    redsem__req_info dummy;
    if (info == NULL)
        info = &dummy;
    info->maybe_applied = false;
    info->sent_ns = 0;
    info->recv_ns = 0;

    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, a->n, (const char **)a->v, a->len);
    if (len < 0)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory formatting a request");

    int64_t retry_until = 0, backoff = 5 * REDSEM__NS_PER_MS;
    int rc;
    char err[256];
    for (;;) {
        bool retryable = true;
        if (!c->connected) {
            rc = connect_client(c, &retryable, err, sizeof err);
            if (rc != REDSEM_OK) {
                redsem__set_err(c, rc, "%s", err);
                if (rc == REDSEM_ECONN && retryable)
                    goto retry;
                break;
            }
        }
        int64_t sent = redsem__now_ns();
        /* 0: an ordinary request, bounded by the socket's timeout (the command timeout) */
        int64_t dl = deadline_ns;
        if (c->deadline_cap_ns && (dl == 0 || c->deadline_cap_ns < dl))
            dl = c->deadline_cap_ns;
        bool written = false;
        redisReply *r = NULL;
        rc = raw_roundtrip(c, cmd, (size_t)len, dl, &r, &written, err, sizeof err);
        if (rc == REDSEM_OK && loading_reply(r) && (flags & REDSEM__REQ_RETRY) &&
            c->retry_ms > 0) {
            /* A restarted server loading its data refuses every command, executing nothing:
             * wait for it within the retry window, on the same connection. */
            int64_t now = redsem__now_ns();
            if (retry_until == 0)
                retry_until = retry_deadline(c, now);
            if (now < retry_until) {
                freeReplyObject(r);
                nap_before_retry(c, &backoff, retry_until);
                continue;
            }
        }
        if (rc == REDSEM_OK) {
            info->sent_ns = sent;
            info->recv_ns = redsem__now_ns();
            *ret_reply = r;
            break;
        }
        drop_connection(c);
        if (written)
            info->maybe_applied = true;
        redsem__set_err(c, rc, "%s", err);
        if (rc != REDSEM_ECONN)
            break; /* timeouts are not retried: the server may be stalled */
    retry:
        if (!(flags & REDSEM__REQ_RETRY) || c->retry_ms == 0) {
            rc = REDSEM_ECONN;
            break;
        }
        int64_t now = redsem__now_ns();
        if (retry_until == 0)
            retry_until = retry_deadline(c, now);
        if (now >= retry_until) {
            rc = REDSEM_ECONN;
            break;
        }
        nap_before_retry(c, &backoff, retry_until);
    }
    redisFreeCommand(cmd);
    return rc;
}

/* ================================================================ scripts */

#define REDSEM__NOSCRIPT_RETRIES 5

static int load_script(redsem_client *c, int script)
{
    const redsem__script_def *d = &redsem__script_defs[script];
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, "SCRIPT");
    redsem__args_str(&a, "LOAD");
    redsem__args_mem(&a, d->text, d->len);
    redisReply *r = NULL;
    int rc = redsem__request(c, &a, REDSEM__REQ_RETRY, 0, &r, NULL);
    if (rc != REDSEM_OK)
        return rc;
    c->stats.script_loads++;
    if (r->type == REDIS_REPLY_ERROR) {
        char what[64];
        snprintf(what, sizeof what, "SCRIPT LOAD %s", d->name);
        rc = redsem__error_reply(c, r, what);
    } else if (r->type != REDIS_REPLY_STRING || r->len != 40) {
        rc = redsem__set_err(c, REDSEM_EPROTO, "SCRIPT LOAD %s: unexpected reply", d->name);
    } else {
        memcpy(c->sha[script], r->str, 40);
        c->sha[script][40] = '\0';
        c->sha_known[script] = true;
    }
    freeReplyObject(r);
    return rc;
}

int redsem__eval(redsem_client *c, int script, int nkeys, const redsem__args *ka, int flags,
                 redsem__req_info *info, redisReply **ret_reply)
{
    int rc;
    /* A failure before the script's own request (loading it) applied nothing. */
    if (info != NULL) {
        info->maybe_applied = false;
        info->sent_ns = 0;
    }
    /* A copy sent before a NOSCRIPT retry may have been applied: a reply lost with the
     * connection, then a restarted server (whose script cache is empty) answering the resent
     * copy NOSCRIPT. The request after the reload starts its own req_info; keep what the
     * earlier copies may have done, or a release re-sent after a restart would call its own
     * first copy's work "not held" (REDSEM_ELOST). */
    bool maybe_applied = false;
    for (int attempt = 0;; attempt++) {
        /* The SHA the server returned is kept per client and reused on later connections;
         * after a restart, failover or SCRIPT FLUSH the server answers NOSCRIPT and the script
         * is loaded again and the call retried, once. */
        if (!c->sha_known[script] && (rc = load_script(c, script)) != REDSEM_OK)
            return rc;
        redsem__args a;
        redsem__args_init(&a);
        redsem__args_str(&a, "EVALSHA");
        redsem__args_mem(&a, c->sha[script], 40);
        redsem__args_i64(&a, nkeys);
        for (int i = 0; i < ka->n; i++)
            redsem__args_mem(&a, ka->v[i], ka->len[i]);
        redisReply *r = NULL;
        rc = redsem__request(c, &a, flags, 0, &r, info);
        if (info != NULL) {
            maybe_applied = maybe_applied || info->maybe_applied;
            info->maybe_applied = maybe_applied;
        }
        if (rc != REDSEM_OK)
            return rc;
        /* Each NOSCRIPT gets one load and one retry; a server whose cache is flushed again
         * between the two (SCRIPT FLUSH in a loop) gets a few more, then the error. */
        if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0 &&
            attempt < REDSEM__NOSCRIPT_RETRIES) {
            freeReplyObject(r);
            c->stats.noscript++;
            c->sha_known[script] = false;
            continue;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            rc = redsem__error_reply(c, r, redsem__script_defs[script].name);
            freeReplyObject(r);
            return rc;
        }
        *ret_reply = r;
        return REDSEM_OK;
    }
}

/* ================================================================ BLPOP */

int redsem__blpop(redsem_client *c, const char *key, size_t keylen, int64_t wait_ms,
                  int64_t hard_deadline_ns, bool *signaled)
{
    *signaled = false;
    if (wait_ms < 1)
        wait_ms = 1;
    /* The server's BLPOP timeout only fires on its event-loop tick (hz 10: up to 100 ms
     * late), so precision comes from our socket deadline: at hard_deadline_ns the request is
     * abandoned and the connection discarded (the next request reconnects). */
    int64_t soft = redsem__now_ns() + (wait_ms + c->command_timeout_ms) * REDSEM__NS_PER_MS;
    int64_t dl = hard_deadline_ns < soft ? hard_deadline_ns : soft;
    char secs[32];
    snprintf(secs, sizeof secs, "%lld.%03lld", (long long)(wait_ms / 1000),
             (long long)(wait_ms % 1000));
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, "BLPOP");
    redsem__args_mem(&a, key, keylen);
    redsem__args_str(&a, secs);
    redisReply *r = NULL;
    int rc = redsem__request(c, &a, REDSEM__REQ_RETRY, dl, &r, NULL);
    if (rc == REDSEM_ETIMEDOUT && dl == hard_deadline_ns) {
        redsem__clear_err(c);
        return REDSEM_OK; /* our own deadline, not a fault */
    }
    if (rc != REDSEM_OK)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        rc = redsem__error_reply(c, r, "BLPOP");
    else if (r->type == REDIS_REPLY_ARRAY) {
        *signaled = true;
        c->stats.wakeups++;
    }
    freeReplyObject(r);
    return rc;
}

/* ================================================================ client */

char *redsem__key(const redsem_client *c, const char *name, const char *suffix)
{
    size_t nl = strlen(name), sl = strlen(suffix);
    size_t len = c->prefix_len + nl + sl + 2;
    char *k = redsem__malloc(len + 1);
    if (k == NULL)
        return NULL;
    char *p = k;
    memcpy(p, c->prefix, c->prefix_len);
    p += c->prefix_len;
    *p++ = '{';
    memcpy(p, name, nl);
    p += nl;
    *p++ = '}';
    memcpy(p, suffix, sl);
    p[sl] = '\0';
    return k;
}

int redsem__client_open(const redsem_options *o, redsem_client **ret, char *err, size_t errlen)
{
    if (sodium_init() < 0) {
        snprintf(err, errlen, "libsodium failed to initialise");
        return REDSEM_ENOMEM;
    }
    redsem_client *c = redsem__calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    redsem__conn_init(&c->conn);
    c->pid = getpid();
    c->connect_timeout_ms = o->connect_timeout_ms;
    c->command_timeout_ms = o->command_timeout_ms;
    c->retry_ms = o->retry_ms;
    c->prefix = redsem__strdup(o->prefix);
    if (c->prefix == NULL || redsem__endpoint_copy(&c->ep, &o->ep) != REDSEM_OK) {
        redsem_client_free(c);
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    c->prefix_len = strlen(c->prefix);
    bool retryable;
    int rc = connect_client(c, &retryable, err, errlen);
    if (rc != REDSEM_OK) {
        redsem_client_free(c);
        return rc;
    }
    *ret = c;
    return REDSEM_OK;
}

int redsem_client_new_verbose(const redsem_options *options, redsem_client **ret_client,
                              char *errbuf, size_t errbuf_len)
{
    char err[512] = "";
    if (ret_client == NULL) {
        if (errbuf && errbuf_len)
            snprintf(errbuf, errbuf_len, "ret_client is NULL");
        return REDSEM_EINVAL;
    }
    redsem_options *defaults = NULL;
    if (options == NULL) {
        int rc = redsem_options_new(&defaults);
        if (rc != REDSEM_OK)
            return rc;
        options = defaults;
    }
    int rc = redsem__client_open(options, ret_client, err, sizeof err);
    redsem_options_free(defaults);
    if (rc != REDSEM_OK && errbuf && errbuf_len)
        snprintf(errbuf, errbuf_len, "%s", err);
    return rc;
}

int redsem_client_new(const redsem_options *options, redsem_client **ret_client)
{
    return redsem_client_new_verbose(options, ret_client, NULL, 0);
}

int redsem_client_connect(const char *url, redsem_client **ret_client)
{
    if (ret_client == NULL)
        return REDSEM_EINVAL;
    redsem_options *o = NULL;
    int rc = redsem_options_new(&o);
    if (rc == REDSEM_OK && url != NULL)
        rc = redsem_options_set_url(o, url);
    if (rc == REDSEM_OK)
        rc = redsem_client_new(o, ret_client);
    redsem_options_free(o);
    return rc;
}

int redsem__client_options(const redsem_client *c, redsem_options **ret)
{
    redsem_options *o = redsem__calloc(1, sizeof *o);
    if (o == NULL)
        return REDSEM_ENOMEM;
    o->connect_timeout_ms = c->connect_timeout_ms;
    o->command_timeout_ms = c->command_timeout_ms;
    o->retry_ms = c->retry_ms;
    o->prefix = redsem__strdup(c->prefix);
    if (o->prefix == NULL || redsem__endpoint_copy(&o->ep, &c->ep) != REDSEM_OK) {
        redsem_options_free(o);
        return REDSEM_ENOMEM;
    }
    *ret = o;
    return REDSEM_OK;
}

void redsem_client_free(redsem_client *c)
{
    if (c == NULL)
        return;
    if (c->renewer != NULL)
        redsem__renewer_stop(c);
    redsem__conn_close(&c->conn);
    redsem__endpoint_clear(&c->ep);
    redsem__free(c->prefix);
    redsem__free(c);
}

int redsem_client_ping(redsem_client *c)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, "PING");
    redisReply *r = NULL;
    rc = redsem__request(c, &a, REDSEM__REQ_RETRY, 0, &r, NULL);
    if (rc != REDSEM_OK)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        rc = redsem__error_reply(c, r, "PING");
    else if (r->type != REDIS_REPLY_STATUS)
        rc = redsem__set_err(c, REDSEM_EPROTO, "PING: unexpected reply");
    freeReplyObject(r);
    return rc;
}

int redsem_client_get_stats(const redsem_client *c, redsem_client_stats *ret_stats)
{
    if (c == NULL || ret_stats == NULL)
        return REDSEM_EINVAL;
    *ret_stats = c->stats;
    return REDSEM_OK;
}
