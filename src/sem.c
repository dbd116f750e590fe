/* redsem - semaphores: the three strategies (basic, fair, locked) on top of the Lua scripts. */
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

static bool is_basic(const redsem_sem *s)
{
    return s->strategy == REDSEM_STRATEGY_BASIC;
}

static void redsem_sem_free_keys(redsem_sem *s)
{
    redsem__free(s->k_meta);
    redsem__free(s->k_holders);
    redsem__free(s->k_waiters);
    redsem__free(s->k_signal);
    redsem__free(s->k_owners);
    redsem__free(s->k_timeouts);
    redsem__free(s->k_sigprefix);
    redsem__free(s->k_guard);
}

void redsem_sem_free(redsem_sem *s)
{
    if (s == NULL)
        return;
    /* Its permits still renewed stop being renewed first, waiting for a renewal in flight,
     * which reads the keys (found by review: a use after free on the renewer thread). Only a
     * handle with such permits touches its client here: one with none may be freed after
     * the client (which lets go of them all). */
    if (atomic_load(&s->renewed) > 0)
        s->client->renew_ops->forget(s->client, s);
    redsem__free(s->name);
    redsem_sem_free_keys(s);
    redsem__free(s);
}

/* The permits of a semaphore refresh and release through these (see redsem__kind). */
static int sem_refresh_call(void *h, const redsem_permit *p, redsem__args *a, int *nkeys);
static int sem_refresh_lost(redsem_client *c, void *h, const redsem_permit *p);
static void sem_release_call(void *h, const redsem_permit *p, redsem__call *call);
static int sem_release_reply(redsem_client *c, void *h, const redsem_permit *p, int rc,
                             const redisReply *r, const redsem__req_info *info);
static _Atomic uint32_t *sem_renewed(void *h)
{
    return &((redsem_sem *)h)->renewed;
}
static const redsem__kind sem_kind = {"sem",           sem_refresh_call,  sem_refresh_lost,
                                      sem_release_call, sem_release_reply, sem_renewed};

/* -------------------------------------------------------------- per-strategy attempts */

/* Take an acquire script's reply into att (the wake-ups it carried were pushed by the
 * driver), and note the limit the server reports. */
static int attempt_done(redsem_sem *s, int script, int rc, const redisReply *r,
                        const redsem__req_info *info, redsem__attempt *att)
{
    redsem_client *c = s->client;
    if (rc != REDSEM_OK)
        return rc;
    rc = redsem__parse_attempt(c, r, att, redsem__script_defs[script].name);
    if (rc == REDSEM_OK)
        redsem__note_server_clock(c, s->k_meta, att->server_us, info->recv_ns);
    if (rc == REDSEM_OK && att->outcome != REDSEM__ATT_GUARD_BUSY && att->limit > 0)
        s->limit = att->limit;
    return rc;
}

/* The arguments both acquire scripts begin with: id, limit, lease, mode, wait lease. */
static void attempt_args(const redsem_sem *s, const char *id, int mode, redsem__args *a)
{
    redsem__args_mem(a, id, REDSEM_ID_LEN);
    redsem__args_i64(a, s->limit);
    redsem__args_i64(a, s->lease_ms);
    redsem__args_i64(a, mode);
    redsem__args_i64(a, s->wait_lease_ms);
}

static void basic_call(void *h, const char *id, int mode, uint32_t weight, int stage,
                       redsem__call *call)
{
    (void)stage; /* one call */
    redsem_sem *s = h;
    redsem__args *a = &call->ka;
    /* fair, locked: other waiters this attempt granted (a cleanup, a waiter leaving) are
     * woken by the driver */
    redsem__call_init(call, REDSEM__SCRIPT_BASIC_ACQUIRE, REDSEM__REQ_RETRY | REDSEM__REQ_SYNC,
                      s->k_sigprefix);
    const char *keys[] = {s->k_meta, s->k_holders, s->k_waiters, s->k_signal};
    redsem__call_keys(call, 4, keys);
    attempt_args(s, id, mode, a);
    redsem__args_i64(a, redsem__not_after_us(s->client, s->k_meta));
    redsem__args_i64(a, weight);
}

static int basic_reply(void *h, int stage, int rc, const redisReply *r, redsem__req_info *info,
                       redsem__attempt *att)
{
    (void)stage;
    return attempt_done(h, REDSEM__SCRIPT_BASIC_ACQUIRE, rc, r, info, att);
}

/* The locked strategy's guard: SET guard id NX PX guard_lease (Redis in Action 6.3.4), in a
 * script that also reports a foreign key of another type (WRONGTYPE) in the same round trip. */
static void guard_call(redsem_sem *s, const char *id, redsem__call *call)
{
    redsem__call_init(call, REDSEM__SCRIPT_GUARD_ACQUIRE, REDSEM__REQ_RETRY, NULL);
    redsem__args_str(&call->ka, s->k_guard);
    call->nkeys = 1;
    redsem__args_mem(&call->ka, id, REDSEM_ID_LEN);
    redsem__args_i64(&call->ka, s->guard_lease_ms);
}

/* The guard's outcome: REDSEM__ATTEMPT (taken: the attempt's call is due), REDSEM_OK with a
 * busy guard in att, or a fault. Neither grants anything. */
static int guard_reply(redsem_sem *s, int rc, const redisReply *r, redsem__req_info *info,
                       redsem__attempt *att)
{
    info->maybe_applied = false; /* the guard alone grants nothing */
    long long v = 0;
    if (rc != REDSEM_OK)
        return rc;
    if (!redsem__reply_int(r, &v))
        return redsem__set_err(s->client, REDSEM_EPROTO, "guard_acquire: unexpected reply");
    if (v == 1)
        return REDSEM__ATTEMPT;
    memset(att, 0, sizeof *att);
    att->outcome = REDSEM__ATT_GUARD_BUSY;
    att->next_ms = -1;
    att->limit = s->limit;
    return REDSEM_OK;
}

/* Fair and locked on one server: a waiter is woken by its id pushed to its client's
 * id list (wake.c, prelude.lua's grant_heads); on a cluster client, on a list of its own in
 * the semaphore's slot. */
static bool wake_by_id(const redsem_sem *s)
{
    return s->strategy != REDSEM_STRATEGY_BASIC && s->client->ep.kind != REDSEM__EP_CLUSTER;
}

/* Fair and locked on one server, a release or set_limit while this client has waiters on
 * its engines: the client's id list and its bell as two more KEYS (after nkeys), so that a
 * script that grants a waiter of this same client wakes it at once; the waiters of other
 * clients (and this client's, when it passes none) are woken by this client after the reply
 * (the engine pushes them), their lists being no key the script was given. Not without waiters:
 * two more keys cost the server about 1.5k instructions a call (bench/script-cost.sh), for
 * nothing. The number of KEYS. */
static int own_wake_keys(const redsem_sem *s, redsem__args *a, int nkeys)
{
    if (!wake_by_id(s) || !redsem__wake_any(s->client))
        return nkeys;
    redsem__args_str(a, s->client->wake_ids);
    redsem__args_str(a, s->client->wake_bell);
    return nkeys + 2;
}

/* Fair: one call. Locked: the guard (stage 0), then the same call (stage 1). */
static void fair_call(void *h, const char *id, int mode, uint32_t weight, int stage,
                      redsem__call *call)
{
    redsem_sem *s = h;
    if (s->strategy == REDSEM_STRATEGY_LOCKED && stage == 0) {
        guard_call(s, id, call);
        return;
    }
    redsem__args *a = &call->ka;
    redsem__call_init(call, REDSEM__SCRIPT_FAIR_ACQUIRE, REDSEM__REQ_RETRY | REDSEM__REQ_SYNC,
                      s->k_sigprefix);
    const char *keys[] = {s->k_meta, s->k_owners, s->k_timeouts, s->k_sigprefix, s->k_guard};
    redsem__call_keys(call, 5, keys);
    attempt_args(s, id, mode, a);
    redsem__args_str(a, redsem_strategy_name(s->strategy));
    redsem__args_mem(a, id, REDSEM_ID_LEN);
    redsem__args_i64(a, redsem__not_after_us(s->client, s->k_meta));
    redsem__args_i64(a, weight);
    if (wake_by_id(s)) {
        redsem__args_str(a, s->client->wake_ids);
        /* a direct grant (the permit handed over with this lease, no attempt after the
         * wake-up): not when each grant must reach replicas (the waiter's attempt waits for
         * them) */
        if (s->client->sync_replicas == 0)
            redsem__args_str(a, "1");
    }
    /* locked: fair_acquire.lua deletes the guard as soon as it has checked it. If the script
     * did not run (a timeout, a lost connection, a refusal), the guard expires after
     * guard_lease_ms: one more request to a server that did not answer would double this
     * call's time, which must end one command timeout after the attempt's request was sent. */
}

static int fair_reply(void *h, int stage, int rc, const redisReply *r, redsem__req_info *info,
                      redsem__attempt *att)
{
    redsem_sem *s = h;
    if (s->strategy == REDSEM_STRATEGY_LOCKED && stage == 0)
        return guard_reply(s, rc, r, info, att);
    return attempt_done(s, REDSEM__SCRIPT_FAIR_ACQUIRE, rc, r, info, att);
}

static const char *basic_wait_key(void *h, const char *id, size_t *len, char *buf, size_t buflen)
{
    (void)id;
    (void)buf;
    (void)buflen;
    redsem_sem *s = h;
    *len = strlen(s->k_signal);
    return s->k_signal;
}

static const char *fair_wait_key(void *h, const char *id, size_t *len, char *buf, size_t buflen)
{
    redsem_sem *s = h;
    if (wake_by_id(s)) { /* the id list's bell */
        *len = strlen(s->client->wake_bell);
        return s->client->wake_bell;
    }
    /* buf holds prefix (<= 256) + '{' + name (<= 512) + "}:signal:" + id (40): < 1024 */
    size_t pl = s->sigprefix_len;
    if (pl + REDSEM_ID_LEN + 1 > buflen) {
        *len = 0;
        return "";
    }
    memcpy(buf, s->k_sigprefix, pl);
    memcpy(buf + pl, id, REDSEM_ID_LEN);
    buf[pl + REDSEM_ID_LEN] = '\0';
    *len = pl + REDSEM_ID_LEN;
    return buf;
}

/* -------------------------------------------------------------- open / setters */

static int make_keys(redsem_client *c, redsem_sem *s)
{
    s->k_meta = redsem__key(c, s->name, ":meta");
    s->k_holders = redsem__key(c, s->name, ":holders");
    s->k_waiters = redsem__key(c, s->name, ":waiters");
    s->k_signal = redsem__key(c, s->name, ":signal");
    s->k_owners = redsem__key(c, s->name, ":owners");
    s->k_timeouts = redsem__key(c, s->name, ":timeouts");
    s->k_sigprefix = redsem__key(c, s->name, ":signal:");
    s->k_guard = redsem__key(c, s->name, ":lock");
    if (!s->k_meta || !s->k_holders || !s->k_waiters || !s->k_signal || !s->k_owners ||
        !s->k_timeouts || !s->k_sigprefix || !s->k_guard)
        return REDSEM_ENOMEM;
    s->sigprefix_len = strlen(s->k_sigprefix);
    return REDSEM_OK;
}

int redsem_sem_open(redsem_client *c, const char *name, redsem_strategy strategy, uint32_t limit,
                    int64_t lease_ms, redsem_sem **ret_sem)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if (ret_sem == NULL)
        return redsem__set_err(c, REDSEM_EINVAL, "ret_sem is NULL");
    if (!redsem__valid_name(name))
        return redsem__set_err(c, REDSEM_EINVAL,
                               "name must be 1..%d bytes of printable ASCII without '{' '}'",
                               REDSEM_NAME_MAX);
    if (strategy < REDSEM_STRATEGY_BASIC || strategy > REDSEM_STRATEGY_LOCKED)
        return redsem__set_err(c, REDSEM_EINVAL, "unknown strategy %d", (int)strategy);
    if (limit < 1 || limit > REDSEM_LIMIT_MAX)
        return redsem__set_err(c, REDSEM_EINVAL, "limit %u is outside 1..%u", limit,
                               REDSEM_LIMIT_MAX);
    if (!redsem__valid_lease(lease_ms))
        return redsem__set_err(c, REDSEM_EINVAL, "lease %lld ms is outside %d..%lld",
                               (long long)lease_ms, REDSEM_LEASE_MIN_MS, REDSEM_LEASE_MAX_MS);
    redsem_sem *s = redsem__calloc(1, sizeof *s);
    if (s == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    s->client = c;
    s->strategy = strategy;
    s->limit = limit;
    s->lease_ms = lease_ms;
    /* A queued waiter entitled to a permit holds it until it claims it or its wait lease
     * ends: never let a dead waiter withhold a permit longer than a dead holder can. */
    s->wait_lease_ms = lease_ms < REDSEM_DEFAULT_WAIT_LEASE_MS ? lease_ms
                                                                : REDSEM_DEFAULT_WAIT_LEASE_MS;
    s->guard_lease_ms = REDSEM_DEFAULT_GUARD_LEASE_MS;
    s->name = redsem__strdup(name);
    if (s->name == NULL || make_keys(c, s) != REDSEM_OK) {
        redsem_sem_free(s);
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    }
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, s->k_meta);
    redsem__args_str(&a, redsem_strategy_name(strategy));
    redsem__args_i64(&a, limit);
    redisReply *r = NULL;
    rc = redsem__eval(c, REDSEM__SCRIPT_SEM_OPEN, 1, &a, REDSEM__REQ_RETRY, NULL, &r);
    if (rc == REDSEM_OK) {
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 1 ||
            r->element[0]->type != REDIS_REPLY_INTEGER)
            rc = redsem__set_err(c, REDSEM_EPROTO, "sem_open: unexpected reply");
        freeReplyObject(r);
    }
    if (rc != REDSEM_OK) {
        redsem_sem_free(s);
        return rc;
    }
    *ret_sem = s;
    return REDSEM_OK;
}

int redsem_sem_set_wait_lease_ms(redsem_sem *s, int64_t ms)
{
    if (s == NULL || !redsem__valid_lease(ms))
        return REDSEM_EINVAL;
    s->wait_lease_ms = ms;
    return REDSEM_OK;
}

int redsem_sem_set_guard_lease_ms(redsem_sem *s, int64_t ms)
{
    if (s == NULL || !redsem__valid_lease(ms))
        return REDSEM_EINVAL;
    s->guard_lease_ms = ms;
    return REDSEM_OK;
}

const char *redsem_sem_name(const redsem_sem *s)
{
    return s ? s->name : "";
}

redsem_strategy redsem_sem_strategy(const redsem_sem *s)
{
    return s ? s->strategy : (redsem_strategy)0;
}

uint32_t redsem_sem_limit(const redsem_sem *s)
{
    return s ? s->limit : 0;
}

int64_t redsem_sem_lease_ms(const redsem_sem *s)
{
    return s ? s->lease_ms : 0;
}

/* -------------------------------------------------------------- acquire */

int redsem__sem_prepare(redsem_sem *s, const char *holder_id, bool id_required, uint32_t n,
                        int64_t timeout_ms, redsem_permit **ret_permit, redsem__acquirer *q,
                        const redsem__kind **kind, char id[REDSEM_ID_BUFSIZE])
{
    int rc = redsem__acquire_args(s->client, ret_permit, timeout_ms, holder_id, id_required, id);
    if (rc != REDSEM_OK)
        return rc;
    /* n above the limit recorded on the server is refused by the script, before it writes:
     * this handle's limit may be stale (redsem_sem_set_limit() by another client). */
    if (n < 1 || n > REDSEM_LIMIT_MAX)
        return redsem__set_err(s->client, REDSEM_EINVAL,
                               "%u permits: a weighted acquire takes 1..limit permits", n);
    *q = (redsem__acquirer){
        .client = s->client,
        .handle = s,
        .attempt_call = is_basic(s) ? basic_call : fair_call,
        .attempt_reply = is_basic(s) ? basic_reply : fair_reply,
        .wait_key = is_basic(s) ? basic_wait_key : fair_wait_key,
        .wait_lease_ms = is_basic(s) ? 0 : s->wait_lease_ms,
        .lease_ms = s->lease_ms,
        .weight = n,
        .wake_meta = wake_by_id(s) ? s->k_meta : NULL,
        .metrics = redsem__metrics_of(s->client, &s->metrics, s->name, REDSEM__MK_SEM),
    };
    *kind = &sem_kind;
    return REDSEM_OK;
}

static int sem_acquire(redsem_sem *s, const char *holder_id, bool id_required, uint32_t n,
                       int64_t timeout_ms, redsem_permit **ret_permit)
{
    if (s == NULL)
        return REDSEM_EINVAL;
    char id[REDSEM_ID_BUFSIZE];
    redsem__acquirer q;
    const redsem__kind *kind;
    int rc = redsem__sem_prepare(s, holder_id, id_required, n, timeout_ms, ret_permit, &q,
                                 &kind, id);
    if (rc != REDSEM_OK)
        return rc;
    return redsem__acquire_permit(&q, kind, id, timeout_ms, s->lease_ms, ret_permit);
}

int redsem_sem_try_acquire(redsem_sem *s, redsem_permit **ret_permit)
{
    return sem_acquire(s, NULL, false, 1, 0, ret_permit);
}

int redsem_sem_acquire(redsem_sem *s, int64_t timeout_ms, redsem_permit **ret_permit)
{
    return sem_acquire(s, NULL, false, 1, timeout_ms, ret_permit);
}

int redsem_sem_acquire_as(redsem_sem *s, const char *holder_id, int64_t timeout_ms,
                          redsem_permit **ret_permit)
{
    return sem_acquire(s, holder_id, true, 1, timeout_ms, ret_permit);
}

int redsem_sem_try_acquire_n(redsem_sem *s, uint32_t n, redsem_permit **ret_permit)
{
    return sem_acquire(s, NULL, false, n, 0, ret_permit);
}

int redsem_sem_acquire_n(redsem_sem *s, uint32_t n, int64_t timeout_ms,
                         redsem_permit **ret_permit)
{
    return sem_acquire(s, NULL, false, n, timeout_ms, ret_permit);
}

int redsem_sem_acquire_as_n(redsem_sem *s, const char *holder_id, uint32_t n,
                            int64_t timeout_ms, redsem_permit **ret_permit)
{
    return sem_acquire(s, holder_id, true, n, timeout_ms, ret_permit);
}

int redsem_sem_adopt(redsem_sem *s, const char *holder_id, redsem_permit **ret_permit)
{
    if (s == NULL)
        return REDSEM_EINVAL;
    return redsem__adopt(s->client, &sem_kind, s, holder_id, s->lease_ms, s->k_meta,
                         is_basic(s) ? s->k_holders : s->k_timeouts, s->k_meta, ret_permit);
}

/* -------------------------------------------------------------- refresh / release */

/* Keys of the semaphore in the order refresh.lua wants: meta, deadline zset, the rest. */
static void refresh_keys(const redsem_sem *s, redsem__args *a)
{
    redsem__args_str(a, s->k_meta);
    if (is_basic(s)) {
        redsem__args_str(a, s->k_holders);
        redsem__args_str(a, s->k_waiters);
        redsem__args_str(a, s->k_signal);
    } else {
        redsem__args_str(a, s->k_timeouts);
        redsem__args_str(a, s->k_owners);
    }
}

static int sem_refresh_call(void *h, const redsem_permit *p, redsem__args *a, int *nkeys)
{
    const redsem_sem *s = h;
    refresh_keys(s, a);
    *nkeys = a->n;
    redsem__args_mem(a, p->id, REDSEM_ID_LEN);
    redsem__args_i64(a, s->lease_ms);
    redsem__args_i64(a, redsem__refresh_margin_ms(p->lease_ms));
    return REDSEM__SCRIPT_REFRESH;
}

static int sem_refresh_lost(redsem_client *c, void *h, const redsem_permit *p)
{
    const redsem_sem *s = h;
    return redsem__set_err(c, REDSEM_ELOST,
                           "lease lost: holder %s of '%s' had expired, was released, or had "
                           "less than the refresh margin (%lld ms) left when the refresh "
                           "reached the server",
                           p->id, s->name, (long long)redsem__refresh_margin_ms(p->lease_ms));
}

static void sem_release_call(void *h, const redsem_permit *p, redsem__call *call)
{
    const redsem_sem *s = h;
    redsem__args *a = &call->ka;
    /* fair, locked: the waiters of other clients this release granted are woken by the
     * driver, a second round trip (their lists are data the script could not name in KEYS:
     * docs/design.md section 2) */
    redsem__call_init(call, is_basic(s) ? REDSEM__SCRIPT_BASIC_RELEASE : REDSEM__SCRIPT_FAIR_RELEASE,
                      REDSEM__REQ_RETRY, s->k_sigprefix);
    redsem__args_str(a, s->k_meta);
    if (is_basic(s)) {
        redsem__args_str(a, s->k_holders);
        redsem__args_str(a, s->k_waiters);
        redsem__args_str(a, s->k_signal);
        call->nkeys = 4;
    } else {
        redsem__args_str(a, s->k_owners);
        redsem__args_str(a, s->k_timeouts);
        redsem__args_str(a, s->k_sigprefix);
        call->nkeys = own_wake_keys(s, a, 4);
    }
    redsem__args_mem(a, p->id, REDSEM_ID_LEN);
    /* the weight: a release of weight 1 then reads nothing more on the server (basic) */
    redsem__args_i64(a, p->weight);
}

static int sem_release_reply(redsem_client *c, void *h, const redsem_permit *p, int rc,
                             const redisReply *r, const redsem__req_info *info)
{
    const redsem_sem *s = h;
    long long st;
    if (rc != REDSEM_OK || (rc = redsem__reply_status(c, r, "release", &st)) != REDSEM_OK)
        return rc;
    /* After a lost reply the request was re-sent; "not held" then may mean that the first copy
     * released it. Either way the permit is not held any more. */
    if (st != 1 && !info->maybe_applied)
        return redsem__set_err(c, REDSEM_ELOST,
                               "lease lost: holder %s of '%s' had expired or was not held",
                               p->id, s->name);
    /* The server had the entry; had its lease run out by the holder's validity clock? */
    if (atomic_load(&p->deadline_ns) <= info->sent_ns)
        return redsem__set_err(c, REDSEM_ELOST,
                               "lease lost: holder %s of '%s' released after its validity ended",
                               p->id, s->name);
    return REDSEM_OK;
}

/* -------------------------------------------------------------- set_limit / status */

const char *redsem__sem_status_kind(const redsem_sem *s)
{
    return is_basic(s) ? "basic" : "fair";
}

int redsem_sem_set_limit(redsem_sem *s, uint32_t limit)
{
    if (s == NULL)
        return REDSEM_EINVAL;
    redsem_client *c = s->client;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if (limit < 1 || limit > REDSEM_LIMIT_MAX)
        return redsem__set_err(c, REDSEM_EINVAL, "limit %u is outside 1..%u", limit,
                               REDSEM_LIMIT_MAX);
    /* fair, locked: the engine pushes the wake-ups of the waiters it granted */
    redsem__call call;
    redsem__call_init(&call, REDSEM__SCRIPT_SET_LIMIT, REDSEM__REQ_RETRY, s->k_sigprefix);
    redsem__args *a = &call.ka;
    redsem__args_str(a, s->k_meta);
    redsem__args_str(a, is_basic(s) ? s->k_holders : s->k_owners);
    redsem__args_str(a, is_basic(s) ? s->k_waiters : s->k_timeouts);
    redsem__args_str(a, is_basic(s) ? s->k_signal : s->k_sigprefix);
    call.nkeys = own_wake_keys(s, a, 4);
    redsem__args_str(a, redsem_strategy_name(s->strategy));
    redsem__args_i64(a, limit);
    long long old;
    redisReply *r = NULL;
    rc = redsem__call_run(c, &call, NULL, &r);
    if (rc != REDSEM_OK)
        return rc;
    rc = redsem__reply_status(c, r, "set_limit", &old);
    freeReplyObject(r);
    if (rc == REDSEM_OK)
        s->limit = limit;
    return rc;
}

void redsem__sem_status_call(const redsem_sem *s, const char *kind, size_t max_entries,
                             redsem__call *call)
{
    redsem__args *a = &call->ka;
    redsem__call_init(call, REDSEM__SCRIPT_STATUS, REDSEM__REQ_RETRY, NULL);
    const char *keys[] = {s->k_meta, s->k_holders, s->k_waiters, s->k_owners, s->k_timeouts};
    redsem__call_keys(call, 5, keys);
    redsem__args_str(a, kind);
    redsem__args_i64(a, (int64_t)max_entries);
}

static int status_keys(redsem_client *c, const redsem_sem *s, const char *kind,
                       size_t max_entries, redsem_status **ret_status)
{
    redsem__call call;
    redsem__sem_status_call(s, kind, max_entries, &call);
    return redsem__status_run(c, &call, ret_status);
}

int redsem_sem_status(redsem_sem *s, size_t max_entries, redsem_status **ret_status)
{
    if (s == NULL)
        return REDSEM_EINVAL;
    redsem_client *c = s->client;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if (ret_status == NULL || max_entries > REDSEM_LIMIT_MAX)
        return redsem__set_err(c, REDSEM_EINVAL, "ret_status is NULL or max_entries > %u",
                               REDSEM_LIMIT_MAX);
    return status_keys(c, s, redsem__sem_status_kind(s), max_entries, ret_status);
}

int redsem_sem_inspect(redsem_client *c, const char *name, size_t max_entries,
                       redsem_status **ret_status)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if (!redsem__valid_name(name))
        return redsem__set_err(c, REDSEM_EINVAL,
                               "name must be 1..%d bytes of printable ASCII without '{' '}'",
                               REDSEM_NAME_MAX);
    if (ret_status == NULL || max_entries > REDSEM_LIMIT_MAX)
        return redsem__set_err(c, REDSEM_EINVAL, "ret_status is NULL or max_entries > %u",
                               REDSEM_LIMIT_MAX);
    redsem_sem tmp = {.client = c, .name = (char *)name};
    rc = make_keys(c, &tmp);
    if (rc == REDSEM_OK)
        rc = status_keys(c, &tmp, "auto", max_entries, ret_status);
    else
        rc = redsem__set_err(c, rc, "out of memory");
    tmp.name = NULL;
    redsem_sem_free_keys(&tmp);
    return rc;
}
