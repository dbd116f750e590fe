/* redsem - argument vectors for requests and typed reads of replies. */
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "proto/resp.h"

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

int redsem__args_format(const redsem__args *a, char **out)
{
    return redisFormatCommandArgv(out, a->n, (const char **)a->v, a->len);
}

bool redsem__reply_int(const redisReply *r, long long *out)
{
    if (r == NULL || r->type != REDIS_REPLY_INTEGER)
        return false;
    *out = r->integer;
    return true;
}

bool redsem__reply_u64(const redisReply *r, uint64_t *out)
{
    long long v;
    if (!redsem__reply_int(r, &v) || v < 0)
        return false;
    *out = (uint64_t)v;
    return true;
}

bool redsem__reply_status_of(const redisReply *r, long long *status)
{
    /* A bare integer (the scripts' hot paths: cheaper for Redis than a table) or {status, ...} */
    if (r->type == REDIS_REPLY_INTEGER)
        return redsem__reply_int(r, status);
    return r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
           redsem__reply_int(r->element[0], status);
}
