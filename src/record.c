/* redsem - metrics recording (metrics.h, "CLIENT SIDE"): the figures a client records.
 *
 * Each (name, kind) a client used has one slot of atomic counters, allocated the first time
 * it is used and never freed before the client. Slots are found by hash in an
 * open-addressed table of twice the cap's size (never more than half full): lookups are
 * lock-free (acquire loads of its entries), inserts take the table's mutex, which only the
 * first use of a name on a handle reaches; a handle caches its slot. Every figure is a
 * relaxed atomic add; a reader (metrics.c) loads each once. Below the objects that record
 * (acquire.c, sem.c, lock.c, rate.c, permit.c, renew.c) and the client (client.c), which
 * makes and frees the table: it calls nothing of theirs. */
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* The buckets' upper bounds in ns (metrics.h; the last bucket, +Inf, has none). */
static const int64_t bounds_ns[REDSEM_METRICS_BUCKETS - 1] = {
    100000LL,     250000LL,     500000LL,     1000000LL,     2500000LL,
    5000000LL,    10000000LL,   25000000LL,   50000000LL,    100000000LL,
    250000000LL,  500000000LL,  1000000000LL, 2500000000LL,  5000000000LL,
    10000000000LL, 30000000000LL, 60000000000LL, 120000000000LL, 300000000000LL};

int redsem__metrics_init(redsem_client *c, uint32_t max, bool off)
{
    redsem__metrics *m = redsem__calloc(1, sizeof *m);
    if (m == NULL)
        return REDSEM_ENOMEM;
    pthread_mutex_init(&m->seen_mu, NULL);
    pthread_mutex_init(&m->mu, NULL);
    m->off = off;
    c->metrics = m;
    if (off)
        return REDSEM_OK;
    size_t size = 16;
    while (size < 2 * ((size_t)max + REDSEM__MK_N))
        size *= 2;
    m->mask = size - 1;
    m->max = max;
    m->table = redsem__calloc(size, sizeof *m->table);
    m->order = redsem__calloc((size_t)max + REDSEM__MK_N, sizeof *m->order);
    return m->table != NULL && m->order != NULL ? REDSEM_OK : REDSEM_ENOMEM;
}

void redsem__metrics_free(redsem_client *c)
{
    redsem__metrics *m = c->metrics;
    if (m == NULL)
        return;
    size_t n = atomic_load(&m->norder);
    for (size_t i = 0; i < n; i++)
        redsem__free(m->order[i]);
    redsem__free(m->order);
    redsem__free(m->table);
    for (size_t i = 0; i < m->nseen; i++) {
        redsem__free(m->seen[i].name);
        redsem__free(m->seen[i].w);
    }
    redsem__free(m->seen);
    if (c->pid == getpid()) {
        pthread_mutex_destroy(&m->mu);
        pthread_mutex_destroy(&m->seen_mu);
    }
    redsem__free(m);
    c->metrics = NULL;
}

/* FNV-1a, 64 bits, of the name and the kind. */
static uint64_t name_hash(const char *name, int kind)
{
    uint64_t h = 14695981039346656037ULL;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 1099511628211ULL;
    return (h ^ (uint64_t)kind) * 1099511628211ULL;
}

/* The slot of (name, kind), or the index of the empty entry where it would go (*at). */
static redsem__mslot *probe(redsem__metrics *m, const char *name, int kind, size_t *at)
{
    size_t i = (size_t)name_hash(name, kind) & m->mask;
    for (;;) {
        redsem__mslot *s = atomic_load_explicit(&m->table[i], memory_order_acquire);
        if (s == NULL) {
            *at = i;
            return NULL;
        }
        if (s->kind == kind && strcmp(s->name, name) == 0)
            return s;
        i = (i + 1) & m->mask;
    }
}

/* Under mu: a new slot, appended to the order (NULL: no memory). */
static redsem__mslot *slot_new(redsem__metrics *m, const char *name, int kind)
{
    size_t len = strlen(name);
    redsem__mslot *s = redsem__calloc(1, sizeof *s + len + 1);
    if (s == NULL)
        return NULL;
    s->kind = kind;
    memcpy(s->name, name, len + 1);
    size_t n = atomic_load_explicit(&m->norder, memory_order_relaxed);
    m->order[n] = s;
    atomic_store_explicit(&m->norder, n + 1, memory_order_release);
    return s;
}

/* The slot of (name, kind) for a handle whose cache was empty; stored in the cache. */
static redsem__mslot *lookup(redsem__metrics *m, redsem__mslot *_Atomic *cache,
                             const char *name, int kind)
{
    size_t at;
    redsem__mslot *s = probe(m, name, kind, &at);
    if (s != NULL) {
        atomic_store_explicit(cache, s, memory_order_release);
        return s;
    }
    pthread_mutex_lock(&m->mu);
    /* the handle's first uses on other threads may have come first: past the cap, the
     * handle counts once in dropped */
    if ((s = atomic_load_explicit(cache, memory_order_acquire)) == NULL &&
        (s = probe(m, name, kind, &at)) == NULL) {
        if (m->nnames < m->max) {
            if ((s = slot_new(m, name, kind)) != NULL) {
                m->nnames++;
                atomic_store_explicit(&m->table[at], s, memory_order_release);
            }
        } else {
            if (m->other[kind] == NULL)
                m->other[kind] = slot_new(m, "_other", kind);
            s = m->other[kind];
            atomic_fetch_add_explicit(&m->dropped, 1, memory_order_relaxed);
        }
    }
    atomic_store_explicit(cache, s, memory_order_release);
    pthread_mutex_unlock(&m->mu);
    return s;
}

redsem__mslot *redsem__metrics_of(redsem_client *c, redsem__mslot *_Atomic *cache,
                                  const char *name, int kind)
{
    redsem__mslot *s = atomic_load_explicit(cache, memory_order_acquire);
    if (s != NULL || c->metrics == NULL || c->metrics->off)
        return s;
    return lookup(c->metrics, cache, name, kind);
}

static void hist_add(redsem__hist *h, int64_t ns)
{
    if (ns < 0)
        ns = 0;
    int i = 0;
    while (i < REDSEM_METRICS_BUCKETS - 1 && ns > bounds_ns[i])
        i++;
    atomic_fetch_add_explicit(&h->b[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (uint64_t)ns, memory_order_relaxed);
}

void redsem__metrics_acquired(redsem__mslot *s, int rc, int64_t start_ns, int64_t now_ns)
{
    if (s == NULL)
        return;
    int out = rc == REDSEM_OK           ? REDSEM__MO_GRANTED
              : rc == REDSEM_EBUSY      ? REDSEM__MO_BUSY
              : rc == REDSEM_ETIMEDOUT  ? REDSEM__MO_TIMEOUT
              : rc == REDSEM_ECANCELED  ? REDSEM__MO_CANCELLED
              : rc == REDSEM_EUNKNOWN   ? REDSEM__MO_UNKNOWN
                                        : REDSEM__MO_ERROR;
    hist_add(&s->wait[out], now_ns - start_ns);
    if (s->kind == REDSEM__MK_RATE) {
        int r = rc == REDSEM_OK      ? REDSEM__MT_ALLOWED
                : rc == REDSEM_EBUSY ? REDSEM__MT_LIMITED
                                     : REDSEM__MT_ERROR;
        atomic_fetch_add_explicit(&s->rate[r], 1, memory_order_relaxed);
    } else if (rc == REDSEM_OK) {
        atomic_fetch_add_explicit(&s->grants, 1, memory_order_relaxed);
    }
}

void redsem__metrics_released(redsem__mslot *s, int64_t granted_ns)
{
    if (s != NULL && granted_ns > 0)
        hist_add(&s->hold, redsem__now_ns() - granted_ns);
}

void redsem__metrics_lost(redsem__mslot *s, int reason)
{
    if (s != NULL && reason >= 0 && reason < REDSEM__ML_N)
        atomic_fetch_add_explicit(&s->lost[reason], 1, memory_order_relaxed);
}

void redsem__metrics_lost_held(const redsem_permit *p)
{
    if (p->metrics != NULL)
        redsem__metrics_lost(p->metrics, atomic_load(&p->deadline_ns) <= redsem__now_ns()
                                             ? REDSEM__ML_EXPIRED
                                             : REDSEM__ML_TAKEN);
}

void redsem__metrics_renewal(redsem__mslot *s, int rc)
{
    if (s == NULL)
        return;
    int r = rc == REDSEM_OK ? REDSEM__MR_OK : rc == REDSEM_ELOST ? REDSEM__MR_LOST
                                                                  : REDSEM__MR_ERROR;
    atomic_fetch_add_explicit(&s->renew[r], 1, memory_order_relaxed);
}
