/* redsem - the distributed lock: SET NX PX, compare-and-delete, compare-and-pexpire. */
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

/* The permits of a lock refresh and release through these (see redsem__kind). */
static int lock_refresh_call(void *h, const redsem_permit *p, redsem__args *a, int *nkeys);
static int lock_refresh_lost(redsem_client *c, void *h, const redsem_permit *p);
static void lock_release_call(void *h, const redsem_permit *p, redsem__call *call);
static int lock_release_reply(redsem_client *c, void *h, const redsem_permit *p, int rc,
                              const redisReply *r, const redsem__req_info *info);
static _Atomic uint32_t *lock_renewed(void *h)
{
    return &((redsem_lock *)h)->renewed;
}
static const redsem__kind lock_kind = {"lock",           lock_refresh_call,  lock_refresh_lost,
                                        lock_release_call, lock_release_reply, lock_renewed};

void redsem_lock_free(redsem_lock *l)
{
    if (l == NULL)
        return;
    /* as redsem_sem_free(): its renewals stop before its keys go */
    if (atomic_load(&l->renewed) > 0)
        l->client->renew_ops->forget(l->client, l);
    redsem__free(l->name);
    redsem__free(l->k_mutex);
    redsem__free(l->k_meta);
    redsem__free(l->k_waiters);
    redsem__free(l->k_signal);
    redsem__free(l);
}

int redsem_lock_open(redsem_client *c, const char *name, int64_t lease_ms, redsem_lock **ret_lock)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if (ret_lock == NULL)
        return redsem__set_err(c, REDSEM_EINVAL, "ret_lock is NULL");
    if (!redsem__valid_name(name))
        return redsem__set_err(c, REDSEM_EINVAL,
                               "name must be 1..%d bytes of printable ASCII without '{' '}'",
                               REDSEM_NAME_MAX);
    if (!redsem__valid_lease(lease_ms))
        return redsem__set_err(c, REDSEM_EINVAL, "lease %lld ms is outside %d..%lld",
                               (long long)lease_ms, REDSEM_LEASE_MIN_MS, REDSEM_LEASE_MAX_MS);
    redsem_lock *l = redsem__calloc(1, sizeof *l);
    if (l == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    l->client = c;
    l->lease_ms = lease_ms;
    l->name = redsem__strdup(name);
    l->k_mutex = redsem__key(c, name, ":mutex");
    l->k_meta = redsem__key(c, name, ":mutex:meta");
    l->k_waiters = redsem__key(c, name, ":mutex:waiters");
    l->k_signal = redsem__key(c, name, ":mutex:signal");
    if (!l->name || !l->k_mutex || !l->k_meta || !l->k_waiters || !l->k_signal) {
        redsem_lock_free(l);
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    }
    redsem__new_id(l->owner);
    *ret_lock = l;
    return REDSEM_OK;
}

static void lock_keys(const redsem_lock *l, redsem__args *a, int n)
{
    const char *k[4] = {l->k_mutex, l->k_meta, l->k_waiters, l->k_signal};
    for (int i = 0; i < n; i++)
        redsem__args_str(a, k[i]);
}

static void lock_call(void *h, const char *id, int mode, uint32_t weight, int stage,
                      redsem__call *call)
{
    (void)weight; /* always 1 */
    (void)stage;  /* one call */
    redsem_lock *l = h;
    redsem__args *a = &call->ka;
    redsem__call_init(call, REDSEM__SCRIPT_LOCK_ACQUIRE, REDSEM__REQ_RETRY | REDSEM__REQ_SYNC,
                      NULL);
    lock_keys(l, a, 4);
    call->nkeys = 4;
    redsem__args_mem(a, id, REDSEM_ID_LEN);
    redsem__args_i64(a, l->lease_ms);
    redsem__args_i64(a, mode);
    redsem__args_i64(a, REDSEM_DEFAULT_WAIT_LEASE_MS);
    redsem__args_str(a, l->reentrant ? "1" : "0");
    redsem__args_i64(a, redsem__not_after_us(l->client, l->k_mutex));
}

static int lock_reply(void *h, int stage, int rc, const redisReply *r, redsem__req_info *info,
                      redsem__attempt *att)
{
    (void)stage;
    redsem_lock *l = h;
    redsem_client *c = l->client;
    if (rc != REDSEM_OK)
        return rc;
    rc = redsem__parse_attempt(c, r, att, "lock_acquire");
    if (rc == REDSEM_OK)
        redsem__note_server_clock(c, l->k_mutex, att->server_us, info->recv_ns);
    att->limit = 1;
    return rc;
}

static const char *lock_wait_key(void *h, const char *id, size_t *len, char *buf, size_t buflen)
{
    (void)id;
    (void)buf;
    (void)buflen;
    redsem_lock *l = h;
    *len = strlen(l->k_signal);
    return l->k_signal;
}

int redsem__lock_prepare(redsem_lock *l, const char *token, bool token_required,
                         int64_t timeout_ms, redsem_permit **ret_permit, redsem__acquirer *q,
                         const redsem__kind **kind, char id[REDSEM_ID_BUFSIZE])
{
    redsem_client *c = l->client;
    if (l->reentrant && (token != NULL || token_required)) {
        int rc = redsem__check_owner(c);
        return rc != REDSEM_OK ? rc
                               : redsem__set_err(c, REDSEM_EINVAL,
                                                 "a reentrant lock's token is its owner identity");
    }
    /* a reentrant handle always acquires as its owner */
    int rc = redsem__acquire_args(c, ret_permit, timeout_ms, l->reentrant ? l->owner : token,
                                  token_required, id);
    if (rc != REDSEM_OK)
        return rc;
    *q = (redsem__acquirer){
        .client = c,
        .handle = l,
        .attempt_call = lock_call,
        .attempt_reply = lock_reply,
        .wait_key = lock_wait_key,
        .wait_lease_ms = 0,
        .weight = 1,
        .metrics = redsem__metrics_of(c, &l->metrics, l->name, REDSEM__MK_LOCK),
    };
    *kind = &lock_kind;
    return REDSEM_OK;
}

static int lock_acquire(redsem_lock *l, const char *token, bool token_required,
                        int64_t timeout_ms, redsem_permit **ret_permit)
{
    if (l == NULL)
        return REDSEM_EINVAL;
    char id[REDSEM_ID_BUFSIZE];
    redsem__acquirer q;
    const redsem__kind *kind;
    int rc = redsem__lock_prepare(l, token, token_required, timeout_ms, ret_permit, &q, &kind,
                                  id);
    if (rc != REDSEM_OK)
        return rc;
    return redsem__acquire_permit(&q, kind, id, timeout_ms, l->lease_ms, ret_permit);
}

int redsem_lock_try_acquire(redsem_lock *l, redsem_permit **ret_permit)
{
    return lock_acquire(l, NULL, false, 0, ret_permit);
}

int redsem_lock_acquire(redsem_lock *l, int64_t timeout_ms, redsem_permit **ret_permit)
{
    return lock_acquire(l, NULL, false, timeout_ms, ret_permit);
}

int redsem_lock_acquire_as(redsem_lock *l, const char *token, int64_t timeout_ms,
                           redsem_permit **ret_permit)
{
    return lock_acquire(l, token, true, timeout_ms, ret_permit);
}

int redsem_lock_adopt(redsem_lock *l, const char *token, redsem_permit **ret_permit)
{
    if (l == NULL)
        return REDSEM_EINVAL;
    return redsem__adopt(l->client, &lock_kind, l, token, l->lease_ms, l->k_mutex,
                         l->k_mutex, l->k_meta, ret_permit);
}

static int lock_refresh_call(void *h, const redsem_permit *p, redsem__args *a, int *nkeys)
{
    const redsem_lock *l = h;
    lock_keys(l, a, 2);
    *nkeys = 2;
    redsem__args_mem(a, p->id, REDSEM_ID_LEN);
    redsem__args_i64(a, l->lease_ms);
    redsem__args_i64(a, redsem__refresh_margin_ms(p->lease_ms));
    return REDSEM__SCRIPT_LOCK_EXTEND;
}

static int lock_refresh_lost(redsem_client *c, void *h, const redsem_permit *p)
{
    const redsem_lock *l = h;
    return redsem__set_err(c, REDSEM_ELOST,
                           "lock '%s' is no longer held by %s, or had less than the refresh "
                           "margin (%lld ms) left when the refresh reached the server",
                           l->name, p->id, (long long)redsem__refresh_margin_ms(p->lease_ms));
}

static void lock_release_call(void *h, const redsem_permit *p, redsem__call *call)
{
    const redsem_lock *l = h;
    redsem__call_init(call, REDSEM__SCRIPT_LOCK_RELEASE, REDSEM__REQ_RETRY, NULL);
    lock_keys(l, &call->ka, 4);
    call->nkeys = 4;
    redsem__args_mem(&call->ka, p->id, REDSEM_ID_LEN);
    redsem__args_str(&call->ka, l->reentrant ? "1" : "0");
}

static int lock_release_reply(redsem_client *c, void *h, const redsem_permit *p, int rc,
                              const redisReply *r, const redsem__req_info *info)
{
    const redsem_lock *l = h;
    long long st = 0;
    if (rc != REDSEM_OK || (rc = redsem__reply_status(c, r, "lock_release", &st)) != REDSEM_OK)
        return rc;
    if (st != 1 && !info->maybe_applied)
        return redsem__set_err(c, REDSEM_ELOST, "lock '%s' was not held by %s", l->name, p->id);
    if (atomic_load(&p->deadline_ns) <= info->sent_ns)
        return redsem__set_err(c, REDSEM_ELOST, "lock '%s' released after its validity ended",
                               l->name);
    return REDSEM_OK;
}

void redsem__lock_status_call(const redsem_lock *l, size_t max_entries, redsem__call *call)
{
    redsem__call_init(call, REDSEM__SCRIPT_LOCK_STATUS, REDSEM__REQ_RETRY, NULL);
    lock_keys(l, &call->ka, 3);
    call->nkeys = 3;
    redsem__args_i64(&call->ka, (int64_t)max_entries);
}

int redsem_lock_status(redsem_lock *l, size_t max_entries, redsem_status **ret_status)
{
    if (l == NULL)
        return REDSEM_EINVAL;
    redsem_client *c = l->client;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if (ret_status == NULL || max_entries > REDSEM_LIMIT_MAX)
        return redsem__set_err(c, REDSEM_EINVAL, "ret_status is NULL or max_entries > %u",
                               REDSEM_LIMIT_MAX);
    redsem__call call;
    redsem__lock_status_call(l, max_entries, &call);
    return redsem__status_run(c, &call, ret_status);
}

int redsem_lock_set_reentrant(redsem_lock *l, bool on)
{
    if (l == NULL)
        return REDSEM_EINVAL;
    l->reentrant = on;
    return REDSEM_OK;
}
