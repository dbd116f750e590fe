/* redsem - the base layer: allocation, clocks, randomness, validation, identifiers, and the
 * error text buffer. Includes nothing of redsem's but the public headers. Not API. */
#ifndef REDSEM_BASE_H
#define REDSEM_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "redsem/redsem.h"

/* ---------------------------------------------------------------- allocation (alloc.c) */
/* Every allocation of the library goes through these, so that an allocator hook can be
 * added in one place later (STYLE 2.6). redsem__calloc checks n * size for overflow. */
void *redsem__malloc(size_t size);
void *redsem__calloc(size_t n, size_t size);
void *redsem__realloc(void *p, size_t size);
char *redsem__strdup(const char *s);
char *redsem__memdup0(const void *p, size_t len); /* copy + NUL */
void redsem__free(void *p);

/* ---------------------------------------------------------------- time (util.c) */
#define REDSEM__NS_PER_MS 1000000LL
#define REDSEM__FOREVER INT64_MAX
int64_t redsem__now_ns(void); /* CLOCK_MONOTONIC */
int64_t redsem__deadline_after_ms(int64_t ms); /* now + ms, saturating; ms < 0 => forever */
/* Uniform random integer in [lo, hi] (libsodium). */
int64_t redsem__rand_between(int64_t lo, int64_t hi);
/* Validity deadline: sent + lease - (lease/100 + 2 ms). */
int64_t redsem__validity_deadline(int64_t sent_ns, int64_t lease_ms);
/* The renewer declares a permit lost this long before its validity deadline:
 * min(lease/50, 25 ms), at least 1 ms. */
int64_t redsem__lost_early_ms(int64_t lease_ms);
/* A refresh applies only while the lease has at least this left on the server: the drift
 * margin, the early warning, and a slack of min(early + 5 ms, lease/10) (see util.c). */
int64_t redsem__refresh_margin_ms(int64_t lease_ms);

/* ---------------------------------------------------------------- validation (util.c) */
bool redsem__valid_name(const char *name);
bool redsem__valid_prefix(const char *prefix);
bool redsem__valid_id(const char *id);
bool redsem__valid_lease(int64_t ms);
bool redsem__valid_wait(int64_t ms);
int redsem__new_id(char out[REDSEM_ID_BUFSIZE]);

/* ---------------------------------------------------------------- per-client context */
#define REDSEM__ERRMSG_LEN 512
/* What the layers below the client share for one of its engines (drive_loop.c; also the
 * blocking driver's Sentinel watch keeper, drive_sync.c): the text of the last error, the
 * counters, and a cap on how long any request may run. The engine owns it; each of its
 * nodes points to it; one thread at a time uses it. */
typedef struct redsem__ctx {
    char errmsg[REDSEM__ERRMSG_LEN];
    redsem_client_stats stats;
    int64_t deadline_cap_ns; /* if non-zero, no request (nor its retries) outlives this: the
                              * caller's own cap (a renewal's, an acquire leaving a queue) */
    int64_t wait_cap_ns;     /* if non-zero, a request's first attempt (connect, round trip)
                              * does not outlive this: a call that waited for a connection
                              * shares one command timeout with it. A retry window after a
                              * lost connection clears it (redsem__ctx_retry_until): the
                              * window runs to its end, cut only by deadline_cap_ns */
} redsem__ctx;

/* The earliest of ctx's caps (0: none): what bounds a request's attempt now. */
static inline int64_t redsem__ctx_cap(const redsem__ctx *ctx)
{
    int64_t a = ctx->deadline_cap_ns, b = ctx->wait_cap_ns;
    return a == 0 ? b : b == 0 || a < b ? a : b;
}

/* The end of a retry window opened now (until: now + the retry window), cut only by the
 * caller's own cap; from now on the wait for a connection no longer caps the request. Found
 * by fault scenario 17 (restart_lock, 2 busy cores): calls that queued long for a connection
 * during a 400 ms restart returned REDSEM_ECONN well within their 1 s retry window. */
static inline int64_t redsem__ctx_retry_until(redsem__ctx *ctx, int64_t until)
{
    ctx->wait_cap_ns = 0;
    return ctx->deadline_cap_ns != 0 && ctx->deadline_cap_ns < until ? ctx->deadline_cap_ns
                                                                      : until;
}

/* Add n to one of ctx's counters. A client's counters are read by redsem_client_get_stats()
 * from any thread while other threads' requests count: relaxed atomic adds. */
#define REDSEM__COUNT(ctx, field, n) \
    ((void)__atomic_fetch_add(&(ctx)->stats.field, (uint64_t)(n), __ATOMIC_RELAXED))

/* Format the error text into ctx (may be NULL) and return code. */
int redsem__ctx_err(redsem__ctx *ctx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---------------------------------------------------------------- intrusive lists */
/* A list of any struct with members prev and next, kept by a struct l with members head and
 * tail: added at either end and unlinked in constant time (the engine's ops, the event-loop
 * API's operations, the sleeping threads of a blocking engine). o must be in l to unlink. */
#define REDSEM__LIST_APPEND(l, o)                                                          \
    do {                                                                                   \
        (o)->next = NULL;                                                                  \
        (o)->prev = (l)->tail;                                                             \
        if ((l)->tail != NULL)                                                             \
            (l)->tail->next = (o);                                                         \
        else                                                                               \
            (l)->head = (o);                                                               \
        (l)->tail = (o);                                                                   \
    } while (0)
#define REDSEM__LIST_PREPEND(l, o)                                                         \
    do {                                                                                   \
        (o)->prev = NULL;                                                                  \
        (o)->next = (l)->head;                                                             \
        if ((l)->head != NULL)                                                             \
            (l)->head->prev = (o);                                                         \
        else                                                                               \
            (l)->tail = (o);                                                               \
        (l)->head = (o);                                                                   \
    } while (0)
#define REDSEM__LIST_UNLINK(l, o)                                                          \
    do {                                                                                   \
        if ((o)->prev != NULL)                                                             \
            (o)->prev->next = (o)->next;                                                   \
        else                                                                               \
            (l)->head = (o)->next;                                                         \
        if ((o)->next != NULL)                                                             \
            (o)->next->prev = (o)->prev;                                                   \
        else                                                                               \
            (l)->tail = (o)->prev;                                                         \
        (o)->next = (o)->prev = NULL;                                                      \
    } while (0)

#endif /* REDSEM_BASE_H */
