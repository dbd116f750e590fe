/* redsem - the client's state that every layer above the topology shares: the calling
 * thread's error text and cap for a client, the checks every call makes first, key names,
 * and the counters of the client's engines (redsem_client_get_stats). Below the engine
 * (drive_loop.c) and its drivers, which set the texts and attach their counters; the
 * handle's lifecycle is client.c's. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "internal.h"

/* ================================================================ errors */

/* A client may be used by many threads at once, so the text of the last error is the calling
 * thread's, as errno is: each thread keeps the texts of the last few clients it used
 * (ERR_SLOTS), keyed by the client's serial number (never reused, unlike its address). */
#define ERR_SLOTS 8
typedef struct err_slot {
    uint64_t serial;
    char text[REDSEM__ERRMSG_LEN];
} err_slot;
static _Thread_local err_slot err_slots[ERR_SLOTS];
static _Thread_local unsigned err_next;

static err_slot *err_find(const redsem_client *c)
{
    for (unsigned i = 0; i < ERR_SLOTS; i++)
        if (err_slots[i].serial == c->serial)
            return &err_slots[i];
    return NULL;
}

char *redsem__errbuf(const redsem_client *c)
{
    err_slot *e = err_find(c);
    if (e == NULL) {
        e = &err_slots[err_next++ % ERR_SLOTS];
        e->serial = c->serial;
        e->text[0] = '\0';
    }
    return e->text;
}

int redsem__set_err(redsem_client *c, int code, const char *fmt, ...)
{
    if (c != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(redsem__errbuf(c), REDSEM__ERRMSG_LEN, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* The calling thread's error text for c made empty. */
static void clear_err(redsem_client *c)
{
    err_slot *e = err_find(c);
    if (e != NULL)
        e->text[0] = '\0';
}

/* A thread's own cap on the deadlines of its calls on one client (redsem__call_cap_set): set
 * by the renewer around its renewals, so that no renewal waits for a connection or a reply
 * past the moment a holder must be told; other threads' calls never see it. */
static _Thread_local uint64_t cap_serial;
static _Thread_local int64_t cap_at_ns;

void redsem__call_cap_set(const redsem_client *c, int64_t cap_ns)
{
    cap_serial = cap_ns != 0 ? c->serial : 0;
    cap_at_ns = cap_ns;
}

static int64_t call_cap(const redsem_client *c)
{
    return cap_serial == c->serial ? cap_at_ns : 0;
}

int64_t redsem__call_cap(const redsem_client *c)
{
    return call_cap(c);
}

const char *redsem_client_errmsg(const redsem_client *c)
{
    if (c == NULL)
        return "";
    const err_slot *e = err_find(c);
    return e != NULL ? e->text : "";
}

void redsem__text_copy(char *dst, const char *src)
{
    size_t n = strnlen(src, REDSEM__ERRMSG_LEN - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ================================================================ checks */

int redsem__check_owner(redsem_client *c)
{
    clear_err(c);
    if (c->pid != getpid())
        return redsem__set_err(c, REDSEM_EFORKED,
                               "this client was created by process %ld; it cannot be used "
                               "in process %ld (after fork)",
                               (long)c->pid, (long)getpid());
    return REDSEM_OK;
}

int redsem__reply_status(redsem_client *c, const redisReply *r, const char *what,
                         long long *status)
{
    if (!redsem__reply_status_of(r, status))
        return redsem__set_err(c, REDSEM_EPROTO, "%s: unexpected reply", what);
    return REDSEM_OK;
}

int redsem__refresh_synced(redsem_client *c, const redsem__req_info *info)
{
    if (c->sync_replicas == 0 || info->replicas_acked >= c->sync_replicas)
        return REDSEM_OK;
    return redsem__set_err(c, REDSEM_EREPLICA,
                           "refreshed, but %d of the %d replicas required acknowledged it "
                           "within %lld ms: the validity deadline was not moved",
                           info->replicas_acked < 0 ? 0 : info->replicas_acked, c->sync_replicas,
                           (long long)c->sync_timeout_ms);
}

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

/* Add the counters of s (updated by other threads: relaxed atomic loads) to sum. */
static void stats_add(redsem_client_stats *sum, const redsem_client_stats *s)
{
#define SUM(f) sum->f += __atomic_load_n(&s->f, __ATOMIC_RELAXED)
    SUM(requests);
    SUM(connects);
    SUM(script_loads);
    SUM(noscript);
    SUM(retries);
    SUM(wakeups);
    SUM(redirects);
    SUM(pipelined);
#undef SUM
}

void redsem__stats_attach(redsem_client *c, redsem__ctx *ctx)
{
    pthread_mutex_lock(&c->stats_mu);
    if (c->nstats_ctx == c->stats_ctx_cap) {
        size_t cap = c->stats_ctx_cap ? 2 * c->stats_ctx_cap : 4;
        redsem__ctx **v = redsem__realloc(c->stats_ctx, cap * sizeof *v);
        if (v != NULL) {
            c->stats_ctx = v;
            c->stats_ctx_cap = cap;
        }
    }
    if (c->nstats_ctx < c->stats_ctx_cap) /* else (no memory) not counted */
        c->stats_ctx[c->nstats_ctx++] = ctx;
    pthread_mutex_unlock(&c->stats_mu);
}

void redsem__stats_detach(redsem_client *c, redsem__ctx *ctx)
{
    if (c->pid != getpid())
        return; /* a forked child frees its copy: the lock may have been held at fork */
    pthread_mutex_lock(&c->stats_mu);
    for (size_t i = 0; i < c->nstats_ctx; i++)
        if (c->stats_ctx[i] == ctx) {
            stats_add(&c->stats_gone, &ctx->stats);
            c->stats_ctx[i] = c->stats_ctx[--c->nstats_ctx];
            break;
        }
    pthread_mutex_unlock(&c->stats_mu);
}

int redsem_client_get_stats(const redsem_client *c, redsem_client_stats *ret_stats)
{
    if (c == NULL || ret_stats == NULL)
        return REDSEM_EINVAL;
    memset(ret_stats, 0, sizeof *ret_stats);
    redsem_client *m = (redsem_client *)c; /* the counters' lock only */
    pthread_mutex_lock(&m->stats_mu);
    for (size_t i = 0; i < c->nstats_ctx; i++)
        stats_add(ret_stats, &c->stats_ctx[i]->stats);
    stats_add(ret_stats, &c->stats_gone);
    ret_stats->pool_waits = 0; /* no pool: one connection per server (since 0.7) */
    ret_stats->direct_grants = __atomic_load_n(&c->direct_grants, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&m->stats_mu);
    return REDSEM_OK;
}
