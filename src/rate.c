/* redsem - rate limits (rate.h): a sliding-window log of grant times with a FIFO queue of
 * waiters, one script (lua/rate.lua), waiting through the semaphores' loop (acquire.c). */
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

struct redsem_rate {
    redsem_client *client;
    char *name;
    uint32_t limit;
    int64_t window_ms;
    int64_t wait_lease_ms;
    char *k_meta, *k_grants, *k_queue, *k_timeouts, *k_sigprefix;
    redsem__mslot *_Atomic metrics; /* its figures (metrics.c), found at the first acquire */
};

/* rate.lua's modes beyond the acquire modes (REDSEM__MODE_*). */
enum { RATE_MODE_STATUS = 4, RATE_MODE_OPEN = 5 };

static void free_keys(redsem_rate *r)
{
    redsem__free(r->k_meta);
    redsem__free(r->k_grants);
    redsem__free(r->k_queue);
    redsem__free(r->k_timeouts);
    redsem__free(r->k_sigprefix);
}

void redsem_rate_free(redsem_rate *r)
{
    if (r == NULL)
        return;
    redsem__free(r->name);
    free_keys(r);
    redsem__free(r);
}

static int make_keys(redsem_client *c, redsem_rate *r)
{
    r->k_meta = redsem__key(c, r->name, ":rate");
    r->k_grants = redsem__key(c, r->name, ":rate:grants");
    r->k_queue = redsem__key(c, r->name, ":rate:queue");
    r->k_timeouts = redsem__key(c, r->name, ":rate:timeouts");
    r->k_sigprefix = redsem__key(c, r->name, ":rate:signal:");
    if (!r->k_meta || !r->k_grants || !r->k_queue || !r->k_timeouts || !r->k_sigprefix)
        return REDSEM_ENOMEM;
    return REDSEM_OK;
}

/* One call of rate.lua: KEYS as the script wants them, then id, N, W, mode, wait lease and
 * the not-after time (acquire modes only). The waiters it made entitled to a slot are woken
 * on their own lists, which the script could not name in KEYS (rate.lua), by the driver. */
static void rate_script_call(redsem_rate *r, const char *id, int mode, redsem__call *call)
{
    redsem__args *a = &call->ka;
    bool acquire = mode <= REDSEM__MODE_LAST;
    redsem__call_init(call, REDSEM__SCRIPT_RATE,
                      REDSEM__REQ_RETRY | (acquire ? REDSEM__REQ_SYNC : 0), r->k_sigprefix);
    const char *keys[] = {r->k_meta, r->k_grants, r->k_queue, r->k_timeouts, r->k_sigprefix};
    redsem__call_keys(call, 5, keys);
    if (id != NULL)
        redsem__args_mem(a, id, REDSEM_ID_LEN);
    else
        redsem__args_str(a, "");
    redsem__args_i64(a, r->limit);
    redsem__args_i64(a, r->window_ms);
    redsem__args_i64(a, mode);
    redsem__args_i64(a, r->wait_lease_ms);
    redsem__args_i64(a, acquire ? redsem__not_after_us(r->client, r->k_meta) : 0);
}

/* A call of rate.lua without a holder (open, status) on the calling thread. */
static int run_script(redsem_rate *r, int mode, redisReply **ret_reply)
{
    redsem__call call;
    rate_script_call(r, NULL, mode, &call);
    return redsem__call_run(r->client, &call, NULL, ret_reply);
}

/* ---------------------------------------------------------------- open */

static int check_name(redsem_client *c, const char *name)
{
    if (!redsem__valid_name(name))
        return redsem__set_err(c, REDSEM_EINVAL,
                               "name must be 1..%d bytes of printable ASCII without '{' '}'",
                               REDSEM_NAME_MAX);
    return REDSEM_OK;
}

/* A handle without I/O (open, inspect). */
static int new_handle(redsem_client *c, const char *name, uint32_t n, int64_t window_ms,
                      redsem_rate **ret)
{
    redsem_rate *r = redsem__calloc(1, sizeof *r);
    if (r == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    r->client = c;
    r->limit = n;
    r->window_ms = window_ms;
    r->wait_lease_ms = REDSEM_DEFAULT_WAIT_LEASE_MS;
    r->name = redsem__strdup(name);
    if (r->name == NULL || make_keys(c, r) != REDSEM_OK) {
        redsem_rate_free(r);
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    }
    *ret = r;
    return REDSEM_OK;
}

int redsem_rate_open(redsem_client *c, const char *name, uint32_t n, int64_t window_ms,
                     redsem_rate **ret_rate)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if (ret_rate == NULL)
        return redsem__set_err(c, REDSEM_EINVAL, "ret_rate is NULL");
    if ((rc = check_name(c, name)) != REDSEM_OK)
        return rc;
    if (n < 1 || n > REDSEM_RATE_MAX)
        return redsem__set_err(c, REDSEM_EINVAL, "rate %u per window is outside 1..%u", n,
                               REDSEM_RATE_MAX);
    if (window_ms < REDSEM_WINDOW_MIN_MS || window_ms > REDSEM_WINDOW_MAX_MS)
        return redsem__set_err(c, REDSEM_EINVAL, "window %lld ms is outside %d..%lld",
                               (long long)window_ms, REDSEM_WINDOW_MIN_MS, REDSEM_WINDOW_MAX_MS);
    redsem_rate *r;
    if ((rc = new_handle(c, name, n, window_ms, &r)) != REDSEM_OK)
        return rc;
    redisReply *reply = NULL;
    rc = run_script(r, RATE_MODE_OPEN, &reply);
    if (rc == REDSEM_OK) {
        if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 1 ||
            reply->element[0]->type != REDIS_REPLY_INTEGER)
            rc = redsem__set_err(c, REDSEM_EPROTO, "rate open: unexpected reply");
        freeReplyObject(reply);
    }
    if (rc != REDSEM_OK) {
        redsem_rate_free(r);
        return rc;
    }
    *ret_rate = r;
    return REDSEM_OK;
}

const char *redsem_rate_name(const redsem_rate *r)
{
    return r ? r->name : "";
}

uint32_t redsem_rate_limit(const redsem_rate *r)
{
    return r ? r->limit : 0;
}

int64_t redsem_rate_window_ms(const redsem_rate *r)
{
    return r ? r->window_ms : 0;
}

/* ---------------------------------------------------------------- acquire */

/* One acquire call: the handle the wait loop passes to the attempts, and what the last
 * reply said beyond redsem__attempt (the grant's time; when a busy reply came). */
typedef struct rate_call {
    redsem_rate *rate;
    int64_t grant_us;
    int64_t busy_recv_ns; /* the last "not granted" reply: when received (monotonic) */
    int64_t busy_next_ms; /* ... and its ms until the turn */
} rate_call;

static void rate_attempt_call(void *h, const char *id, int mode, uint32_t weight, int stage,
                              redsem__call *call)
{
    (void)weight; /* always 1 */
    (void)stage;  /* one call */
    rate_call *rc = h;
    rate_script_call(rc->rate, id, mode, call);
}

static int rate_attempt_reply(void *h, int stage, int rc, const redisReply *r,
                              redsem__req_info *info, redsem__attempt *att)
{
    (void)stage;
    rate_call *call = h;
    redsem_client *c = call->rate->client;
    if (rc != REDSEM_OK)
        return rc;
    rc = redsem__parse_attempt(c, r, att, "rate");
    long long extra = 0;
    if (rc == REDSEM_OK && att->outcome == REDSEM__ATT_GRANTED &&
        (r->elements < 5 || !redsem__reply_int(r->element[4], &extra) || extra <= 0))
        rc = redsem__set_err(c, REDSEM_EPROTO, "rate: unexpected reply values");
    if (rc != REDSEM_OK)
        return rc;
    redsem__note_server_clock(c, call->rate->k_meta, att->server_us, info->recv_ns);
    if (att->outcome == REDSEM__ATT_GRANTED)
        call->grant_us = extra;
    if (att->outcome == REDSEM__ATT_BUSY) {
        call->busy_recv_ns = info->recv_ns;
        call->busy_next_ms = att->next_ms;
    }
    return REDSEM_OK;
}

/* A waiter blocks on its own list, PREFIX{NAME}:rate:signal:<id>. */
static const char *rate_wait_key(void *h, const char *id, size_t *len, char *buf, size_t buflen)
{
    const rate_call *call = h;
    int n = snprintf(buf, buflen, "%s%.*s", call->rate->k_sigprefix, REDSEM_ID_LEN, id);
    *len = n > 0 && (size_t)n < buflen ? (size_t)n : 0;
    return *len ? buf : "";
}

/* retry_after_ms of an EBUSY: the last busy reply's turn, less the time since it came. */
static int64_t retry_after(const rate_call *call)
{
    if (call->busy_recv_ns == 0 || call->busy_next_ms < 0)
        return -1;
    int64_t since_ms = (redsem__now_ns() - call->busy_recv_ns) / REDSEM__NS_PER_MS;
    return call->busy_next_ms > since_ms ? call->busy_next_ms - since_ms : 0;
}

static int rate_wait(redsem_rate *r, int64_t timeout_ms, redsem_rate_grant *g);

static int rate_acquire(redsem_rate *r, const char *holder_id, bool id_required,
                        int64_t timeout_ms, redsem_rate_grant *g)
{
    if (r == NULL)
        return REDSEM_EINVAL;
    redsem_client *c = r->client;
    if (g == NULL)
        return redsem__set_err(c, REDSEM_EINVAL, "ret_grant is NULL");
    memset(g, 0, sizeof *g);
    g->retry_after_ms = -1;
    /* The semaphores' argument checks; they want an out pointer, which we have as g. */
    redsem_permit *unused = NULL;
    int rc = redsem__acquire_args(c, &unused, timeout_ms, holder_id, id_required, g->id);
    if (rc != REDSEM_OK)
        return rc;
    redsem__mslot *ms = redsem__metrics_of(c, &r->metrics, r->name, REDSEM__MK_RATE);
    int64_t start = ms != NULL ? redsem__now_ns() : 0;
    rc = rate_wait(r, timeout_ms, g);
    if (ms != NULL)
        redsem__metrics_acquired(ms, rc, start, redsem__now_ns());
    return rc;
}

/* rate_acquire's wait for a grant, its arguments checked. */
static int rate_wait(redsem_rate *r, int64_t timeout_ms, redsem_rate_grant *g)
{
    redsem_client *c = r->client;
    int rc;
    rate_call call = {.rate = r, .busy_next_ms = -1};
    redsem__acquirer q = {
        .client = c,
        .handle = &call,
        .attempt_call = rate_attempt_call,
        .attempt_reply = rate_attempt_reply,
        .wait_key = rate_wait_key,
        .wait_lease_ms = r->wait_lease_ms,
    };
    redsem__attempt att;
    memset(&att, 0, sizeof att);
    q.att_out = &att;
    redsem_permit *none = NULL;
    rc = redsem__acquire_permit(&q, NULL, g->id, timeout_ms, 0, &none);
    g->server_us = att.server_us;
    if (rc == REDSEM_EBUSY)
        g->retry_after_ms = retry_after(&call);
    if (rc != REDSEM_OK)
        return rc;
    g->token = att.token;
    g->granted_us = call.grant_us;
    if (c->sync_replicas > 0 && att.replicas_acked < c->sync_replicas)
        return redsem__set_err(c, REDSEM_EREPLICA,
                               "granted, but %d of the %d replicas required acknowledged it "
                               "within %lld ms: the grant stays counted, do not use it",
                               att.replicas_acked < 0 ? 0 : att.replicas_acked,
                               c->sync_replicas, (long long)c->sync_timeout_ms);
    return REDSEM_OK;
}

int redsem_rate_try_acquire(redsem_rate *r, redsem_rate_grant *ret_grant)
{
    return rate_acquire(r, NULL, false, 0, ret_grant);
}

int redsem_rate_acquire(redsem_rate *r, int64_t timeout_ms, redsem_rate_grant *ret_grant)
{
    return rate_acquire(r, NULL, false, timeout_ms, ret_grant);
}

int redsem_rate_acquire_as(redsem_rate *r, const char *holder_id, int64_t timeout_ms,
                           redsem_rate_grant *ret_grant)
{
    return rate_acquire(r, holder_id, true, timeout_ms, ret_grant);
}

/* ---------------------------------------------------------------- status */

static int status_of(redsem_rate *r, redsem_rate_info *info)
{
    redsem_client *c = r->client;
    redisReply *reply = NULL;
    int rc = run_script(r, RATE_MODE_STATUS, &reply);
    if (rc != REDSEM_OK)
        return rc;
    long long v[8] = {0};
    bool ok = reply->type == REDIS_REPLY_ARRAY && reply->elements == 8;
    for (size_t i = 0; ok && i < 8; i++)
        ok = redsem__reply_int(reply->element[i], &v[i]);
    freeReplyObject(reply);
    if (!ok || v[1] < 0 || v[1] > REDSEM_RATE_MAX || v[3] < 0 || v[3] > v[1] || v[4] < 0 ||
        v[0] < 0 || v[0] > 1)
        return redsem__set_err(c, REDSEM_EPROTO, "rate status: unexpected reply");
    *info = (redsem_rate_info){
        .exists = v[0] == 1,
        .limit = (uint32_t)v[1],
        .window_ms = v[2],
        .in_window = (uint32_t)v[3],
        .waiters = (size_t)v[4],
        .next_free_ms = v[5],
        .last_token = (uint64_t)v[6],
        .server_us = v[7],
    };
    return REDSEM_OK;
}

int redsem_rate_status(redsem_rate *r, redsem_rate_info *ret_info)
{
    if (r == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(r->client);
    if (rc != REDSEM_OK)
        return rc;
    if (ret_info == NULL)
        return redsem__set_err(r->client, REDSEM_EINVAL, "ret_info is NULL");
    return status_of(r, ret_info);
}

int redsem_rate_inspect(redsem_client *c, const char *name, redsem_rate_info *ret_info)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if ((rc = check_name(c, name)) != REDSEM_OK)
        return rc;
    if (ret_info == NULL)
        return redsem__set_err(c, REDSEM_EINVAL, "ret_info is NULL");
    redsem_rate *r;
    if ((rc = new_handle(c, name, 0, 0, &r)) != REDSEM_OK) /* N = 0: what the server has */
        return rc;
    rc = status_of(r, ret_info);
    redsem_rate_free(r);
    return rc;
}
