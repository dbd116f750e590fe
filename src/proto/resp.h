/* redsem - the protocol layer: argument vectors for requests and typed reads of replies
 * (hiredis 0.14 formats and parses underneath). Pure: no I/O, no client. Not API. */
#ifndef REDSEM_RESP_H
#define REDSEM_RESP_H

#include "base/base.h"

struct redisReply;

#define REDSEM__MAX_ARGS 24
typedef struct redsem__args {
    int n;
    const char *v[REDSEM__MAX_ARGS];
    size_t len[REDSEM__MAX_ARGS];
    char num[REDSEM__MAX_ARGS][24];
} redsem__args;
void redsem__args_init(redsem__args *a);
void redsem__args_str(redsem__args *a, const char *s);
void redsem__args_mem(redsem__args *a, const char *s, size_t len);
void redsem__args_i64(redsem__args *a, int64_t v);
/* The request in RESP, allocated with hiredis (free with redisFreeCommand); -1 no memory. */
int redsem__args_format(const redsem__args *a, char **out);

/* Reply helpers: return false if the shape is wrong. */
bool redsem__reply_int(const struct redisReply *r, long long *out);
bool redsem__reply_u64(const struct redisReply *r, uint64_t *out);
/* The first element of a script's {status, ...} array reply. */
bool redsem__reply_status_of(const struct redisReply *r, long long *status);

#endif /* REDSEM_RESP_H */
