/* redsem - permits: accessors, refresh, release. */
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

const char *redsem_permit_id(const redsem_permit *p)
{
    return p ? p->id : "";
}

uint64_t redsem_permit_token(const redsem_permit *p)
{
    return p ? p->token : 0;
}

uint32_t redsem_permit_weight(const redsem_permit *p)
{
    return p ? p->weight : 0;
}

int64_t redsem_permit_deadline_ms(const redsem_permit *p)
{
    return p ? atomic_load(&p->deadline_ns) / REDSEM__NS_PER_MS : 0;
}

int64_t redsem_permit_validity_ms(const redsem_permit *p)
{
    if (p == NULL || atomic_load(&p->state) != REDSEM__HELD)
        return 0;
    int64_t left = atomic_load(&p->deadline_ns) - redsem__now_ns();
    return left > 0 ? (left + REDSEM__NS_PER_MS - 1) / REDSEM__NS_PER_MS : 0;
}

bool redsem_permit_held(const redsem_permit *p)
{
    return redsem_permit_validity_ms(p) > 0;
}

/* What the refresh script's status (rc, st) means for p. */
static int refresh_outcome(redsem_client *c, redsem_permit *p, int rc, long long st,
                           const redsem__req_info *info, int64_t *sent_ns)
{
    if (rc != REDSEM_OK)
        return rc;
    if (st != 1)
        return p->kind->refresh_lost(c, p->handle, p);
    if ((rc = redsem__refresh_synced(c, info)) != REDSEM_OK)
        return rc;
    *sent_ns = info->sent_ns;
    return REDSEM_OK;
}

void redsem__refresh_call(const redsem_permit *p, redsem__call *call)
{
    redsem__call_init(call, 0, REDSEM__REQ_RETRY | REDSEM__REQ_SYNC, NULL);
    call->script = p->kind->refresh_call(p->handle, p, &call->ka, &call->nkeys);
}

int redsem__refresh_reply(redsem_client *c, redsem_permit *p, int script, int rc,
                          const redisReply *r, const redsem__req_info *info, int64_t *sent_ns)
{
    long long st = 0;
    if (rc == REDSEM_OK)
        rc = redsem__reply_status(c, r, redsem__script_defs[script].name, &st);
    return refresh_outcome(c, p, rc, st, info, sent_ns);
}

int redsem__refresh(redsem_client *c, redsem_permit *p, int64_t *sent_ns)
{
    redsem__call call;
    redsem__refresh_call(p, &call);
    redsem__req_info info;
    redisReply *r = NULL;
    int rc = redsem__call_run(c, &call, &info, &r);
    rc = redsem__refresh_reply(c, p, call.script, rc, r, &info, sent_ns);
    if (r != NULL)
        freeReplyObject(r);
    return rc;
}

void redsem__refresh_many(redsem_client *c, redsem_permit *const *ps, int k, int *rcs,
                          int64_t *sent_ns)
{
    redsem__call calls[REDSEM__BATCH_MAX];
    redsem__req_info info[REDSEM__BATCH_MAX];
    redisReply *r[REDSEM__BATCH_MAX];
    char text[REDSEM__BATCH_MAX][REDSEM__ERRMSG_LEN];
    redsem__batch_item items[REDSEM__BATCH_MAX];
    for (int i = 0; i < k; i++) {
        redsem__call *call = &calls[i];
        redsem__refresh_call(ps[i], call);
        r[i] = NULL;
        text[i][0] = '\0';
        items[i] = (redsem__batch_item){call->script, call->nkeys, &call->ka, call->flags,
                                        &info[i], &r[i], text[i], REDSEM_OK};
    }
    redsem__eval_many(c, items, k);
    for (int i = 0; i < k; i++) {
        if (items[i].rc != REDSEM_OK)
            (void)redsem__set_err(c, items[i].rc, "%s", text[i]);
        rcs[i] = redsem__refresh_reply(c, ps[i], items[i].script, items[i].rc, r[i], &info[i],
                                       &sent_ns[i]);
        if (r[i] != NULL)
            freeReplyObject(r[i]);
    }
}

/* Release p on the server through client c, without touching renewal or its state: its
 * kind's release call on the calling thread (redsem__call_run). */
static int release_on_server(redsem_client *c, redsem_permit *p)
{
    redsem__call call;
    p->kind->release_call(p->handle, p, &call);
    redsem__req_info info;
    redisReply *r = NULL;
    int rc = redsem__call_run(c, &call, &info, &r);
    rc = p->kind->release_reply(c, p->handle, p, rc, r, &info);
    if (r != NULL)
        freeReplyObject(r);
    return rc;
}

int redsem__refresh_begin(redsem_permit *p)
{
    redsem_client *c = p->client;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    int st = atomic_load(&p->state);
    if (st != REDSEM__HELD)
        return redsem__set_err(c, REDSEM_ESTATE, "permit %s was already %s", p->id,
                               st == REDSEM__RELEASED ? "released" : "found lost");
    return REDSEM_OK;
}

int redsem__refresh_end(redsem_permit *p, int rc, int64_t sent_ns)
{
    redsem__metrics_renewal(p->metrics, rc);
    if (rc == REDSEM_OK) {
        int64_t d = redsem__validity_deadline(sent_ns, p->lease_ms);
        /* never move the deadline back (a concurrent renewal may have moved it further) */
        int64_t cur = atomic_load(&p->deadline_ns);
        while (d > cur && !atomic_compare_exchange_weak(&p->deadline_ns, &cur, d))
            ;
    } else if (rc == REDSEM_ELOST) {
        if (atomic_exchange(&p->state, REDSEM__LOST) == REDSEM__HELD)
            redsem__metrics_lost_held(p);
    }
    return rc;
}

int redsem_permit_refresh(redsem_permit *p)
{
    if (p == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__refresh_begin(p);
    if (rc != REDSEM_OK)
        return rc;
    int64_t sent = 0;
    rc = redsem__refresh(p->client, p, &sent);
    return redsem__refresh_end(p, rc, sent);
}

int redsem__release_begin(redsem_permit *p)
{
    redsem_client *c = p->client;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if (atomic_load(&p->state) == REDSEM__RELEASED)
        return redsem__set_err(c, REDSEM_ESTATE, "permit %s was already released", p->id);
    /* Stop renewal first, waiting for a renewal in flight: a lease is never extended after
     * it was released (from the permit's own lost callback, nothing is in flight any more:
     * the renewer thread does not wait for itself). */
    if (__atomic_load_n(&p->renewal, __ATOMIC_ACQUIRE) != NULL)
        c->renew_ops->detach(p);
    return REDSEM_OK;
}

int redsem__release_end(redsem_permit *p, int rc)
{
    if (rc == REDSEM_OK || rc == REDSEM_ELOST) {
        if (atomic_exchange(&p->state, REDSEM__RELEASED) == REDSEM__HELD && rc == REDSEM_ELOST)
            redsem__metrics_lost_held(p);
        redsem__metrics_released(p->metrics, p->granted_ns);
    }
    return rc;
}

int redsem_permit_release(redsem_permit *p)
{
    if (p == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__release_begin(p);
    if (rc != REDSEM_OK)
        return rc;
    return redsem__release_end(p, release_on_server(p->client, p));
}

void redsem_permit_free(redsem_permit *p)
{
    if (p == NULL)
        return;
    /* No longer renewed once its handle or its client was freed: then the client is not
     * touched (it may be gone). */
    if (__atomic_load_n(&p->renewal, __ATOMIC_ACQUIRE) != NULL)
        p->client->renew_ops->detach(p);
    if (p->home != NULL)
        p->home->unref(p->home);
    redsem__free(p);
}

int redsem__adopt(redsem_client *c, const redsem__kind *kind, void *handle, const char *id,
                  int64_t lease_ms, const char *k1, const char *k2, const char *k3,
                  redsem_permit **ret_permit)
{
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if (ret_permit == NULL || !redsem__valid_id(id))
        return redsem__set_err(c, REDSEM_EINVAL,
                               "ret_permit is NULL or the id is not %d lower-case hex chars",
                               REDSEM_ID_LEN);
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, k1);
    redsem__args_str(&a, k2);
    redsem__args_str(&a, k3);
    redsem__args_mem(&a, id, REDSEM_ID_LEN);
    redsem__args_str(&a, kind->name);
    redisReply *r = NULL;
    redsem__req_info info;
    rc = redsem__eval(c, REDSEM__SCRIPT_HOLDER, 3, &a, REDSEM__REQ_RETRY, &info, &r);
    if (rc != REDSEM_OK)
        return rc;
    long long st = 0, tok = 0, left = 0, weight = 1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || !redsem__reply_int(r->element[0], &st) ||
        (st == 1 && (r->elements < 3 || !redsem__reply_int(r->element[1], &tok) ||
                     !redsem__reply_int(r->element[2], &left))))
        rc = redsem__set_err(c, REDSEM_EPROTO, "holder: unexpected reply");
    if (rc == REDSEM_OK && st == 1 && r->elements >= 4 &&
        (!redsem__reply_int(r->element[3], &weight) || weight < 1 || weight > UINT32_MAX))
        rc = redsem__set_err(c, REDSEM_EPROTO, "holder: unexpected weight");
    freeReplyObject(r);
    if (rc != REDSEM_OK)
        return rc;
    if (st != 1 || left <= 0)
        return redsem__set_err(c, REDSEM_ELOST, "%s holds no live permit", id);
    redsem__attempt att = {.outcome = REDSEM__ATT_GRANTED, .token = (uint64_t)tok,
                           .sent_ns = info.sent_ns, .weight = (uint32_t)weight};
    redsem_permit *p = redsem__permit_new(kind, handle, c, id, &att, lease_ms);
    if (p == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    /* validity from what the server says is left, not from our own lease setting */
    atomic_store(&p->deadline_ns, redsem__validity_deadline(info.sent_ns, left));
    *ret_permit = p;
    return REDSEM_OK;
}
