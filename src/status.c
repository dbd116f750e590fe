/* redsem - introspection results (status.lua and lock_status.lua replies). */
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

void redsem_status_free(redsem_status *st)
{
    if (st == NULL)
        return;
    for (size_t i = 0; i < st->nholders; i++)
        redsem__free(st->holders[i].id);
    for (size_t i = 0; i < st->nwaiters; i++)
        redsem__free(st->waiters[i].id);
    redsem__free(st->holders);
    redsem__free(st->waiters);
    redsem__free(st);
}

/* flat {id, number, number, ...} -> entries */
static int entries(const redisReply *r, redsem__entry **out, size_t *n)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 3 != 0)
        return REDSEM_EPROTO;
    size_t count = r->elements / 3;
    *out = redsem__calloc(count, sizeof **out);
    if (*out == NULL)
        return REDSEM_ENOMEM;
    for (size_t i = 0; i < count; i++) {
        const redisReply *id = r->element[3 * i];
        long long tok, left;
        if (id->type != REDIS_REPLY_STRING || !redsem__reply_int(r->element[3 * i + 1], &tok) ||
            !redsem__reply_int(r->element[3 * i + 2], &left))
            return REDSEM_EPROTO;
        (*out)[i].id = redsem__memdup0(id->str, id->len);
        if ((*out)[i].id == NULL)
            return REDSEM_ENOMEM;
        (*out)[i].token = tok < 0 ? 0 : (uint64_t)tok;
        (*out)[i].remaining_ms = left;
        (*out)[i].weight = 1;
        *n = i + 1;
    }
    return REDSEM_OK;
}

/* {weight, ...} parallel to the listed holders (status.lua); absent (lock_status.lua): 1 */
static int weights(const redisReply *r, redsem__entry *list, size_t n)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n)
        return REDSEM_EPROTO;
    for (size_t i = 0; i < n; i++) {
        long long w;
        if (!redsem__reply_int(r->element[i], &w) || w < 1 || w > UINT32_MAX)
            return REDSEM_EPROTO;
        list[i].weight = (uint32_t)w;
    }
    return REDSEM_OK;
}

int redsem__status_from_reply(redsem_client *c, const char *key, const redisReply *r,
                              redsem_status **ret)
{
    long long limit, nh, nw, holds, exists, in_use = -1, expired = 0;
    if (r->type != REDIS_REPLY_ARRAY ||
        (r->elements != 8 && r->elements != 10 && r->elements != 11) ||
        (r->elements >= 10 && (!redsem__reply_int(r->element[8], &in_use) || in_use < 0)) ||
        (r->elements == 11 && (!redsem__reply_int(r->element[10], &expired) || expired < 0)) ||
        r->element[0]->type != REDIS_REPLY_STRING || !redsem__reply_int(r->element[1], &limit) ||
        !redsem__reply_int(r->element[2], &nh) || !redsem__reply_int(r->element[3], &nw) ||
        !redsem__reply_int(r->element[6], &holds) || !redsem__reply_int(r->element[7], &exists) ||
        limit < 0 || nh < 0 || nw < 0)
        return redsem__set_err(c, REDSEM_EPROTO, "status: unexpected reply shape");
    redsem_status *st = redsem__calloc(1, sizeof *st);
    if (st == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    redsem_strategy s;
    st->strategy = redsem_strategy_parse(r->element[0]->str, &s) == REDSEM_OK ? (int)s : 0;
    st->exists = exists != 0;
    redsem__served_by(c, key, st->server, sizeof st->server);
    st->limit = st->exists ? (uint32_t)limit : 0;
    st->holder_count = (size_t)nh;
    st->waiter_count = (size_t)nw;
    st->holds = holds > 0 ? (uint32_t)holds : 0;
    st->in_use = in_use >= 0 ? (uint64_t)in_use : (uint64_t)nh;
    st->expired = (uint64_t)expired;
    int rc = entries(r->element[4], &st->holders, &st->nholders);
    if (rc == REDSEM_OK)
        rc = entries(r->element[5], &st->waiters, &st->nwaiters);
    if (rc == REDSEM_OK && r->elements >= 10)
        rc = weights(r->element[9], st->holders, st->nholders);
    if (rc != REDSEM_OK) {
        redsem_status_free(st);
        return redsem__set_err(c, rc, "status: %s", redsem_strerror(rc));
    }
    *ret = st;
    return REDSEM_OK;
}

typedef struct status_judge {
    redsem_client *c;
    const char *key;
    redsem_status **ret;
} status_judge;

static int status_judged(void *arg, int rc, redisReply **r, const redsem__req_info *info)
{
    (void)info;
    status_judge *j = arg;
    return rc != REDSEM_OK ? rc : redsem__status_from_reply(j->c, j->key, *r, j->ret);
}

int redsem__status_run(redsem_client *c, redsem__call *call, redsem_status **ret)
{
    status_judge j = {c, call->ka.v[0], ret};
    return redsem__call_judged(c, call, status_judged, &j);
}

int redsem_status_strategy(const redsem_status *st)
{
    return st ? st->strategy : 0;
}

bool redsem_status_exists(const redsem_status *st)
{
    return st ? st->exists : false;
}

uint32_t redsem_status_limit(const redsem_status *st)
{
    return st ? st->limit : 0;
}

size_t redsem_status_holder_count(const redsem_status *st)
{
    return st ? st->holder_count : 0;
}

size_t redsem_status_waiter_count(const redsem_status *st)
{
    return st ? st->waiter_count : 0;
}

size_t redsem_status_holders_listed(const redsem_status *st)
{
    return st ? st->nholders : 0;
}

size_t redsem_status_waiters_listed(const redsem_status *st)
{
    return st ? st->nwaiters : 0;
}

uint32_t redsem_status_hold_count(const redsem_status *st)
{
    return st ? st->holds : 0;
}

uint64_t redsem_status_permits_in_use(const redsem_status *st)
{
    return st ? st->in_use : 0;
}

uint32_t redsem_status_holder_weight(const redsem_status *st, size_t i)
{
    return st && i < st->nholders ? st->holders[i].weight : 0;
}

const char *redsem_status_server(const redsem_status *st)
{
    return st ? st->server : "";
}

static int entry(const redsem__entry *list, size_t n, size_t i, const char **id, uint64_t *tok,
                 int64_t *left)
{
    if (list == NULL || i >= n)
        return REDSEM_EINVAL;
    if (id)
        *id = list[i].id;
    if (tok)
        *tok = list[i].token;
    if (left)
        *left = list[i].remaining_ms;
    return REDSEM_OK;
}

int redsem_status_holder(const redsem_status *st, size_t i, const char **ret_id,
                         uint64_t *ret_token, int64_t *ret_remaining_ms)
{
    if (st == NULL)
        return REDSEM_EINVAL;
    return entry(st->holders, st->nholders, i, ret_id, ret_token, ret_remaining_ms);
}

int redsem_status_waiter(const redsem_status *st, size_t i, const char **ret_id,
                         uint64_t *ret_ticket, int64_t *ret_remaining_ms)
{
    if (st == NULL)
        return REDSEM_EINVAL;
    return entry(st->waiters, st->nwaiters, i, ret_id, ret_ticket, ret_remaining_ms);
}
