/* redsem - automatic renewal: one renewer thread per client, on the client's own request
 * connections (its renewals go first in their queue), and a timer queue (a binary min-heap ordered by next wake-up time), like the seed's DelayQueue
 * watchdog but for semaphore permits as well as locks. See include/redsem/renew.h. */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Fire the lost notification this long before the validity deadline, so that the holder
 * learns before its validity ends: min(lease / 50, 25 ms), at least 1 ms. */
static int64_t lost_early_ns(int64_t lease_ms)
{
    return redsem__lost_early_ms(lease_ms) * REDSEM__NS_PER_MS;
}

typedef struct renew_entry {
    redsem_permit *permit;
    int64_t interval_ns;
    int64_t next_ns;    /* next renewal */
    int64_t backoff_ns; /* after a failed renewal */
    redsem_lost_fn on_lost;
    void *user_data;
    size_t heap_index; /* SIZE_MAX when not queued */
    bool in_flight;    /* the renewer is working on it outside the lock */
} renew_entry;

struct redsem__renewer {
    redsem_client *owner; /* the client whose permits it renews, and whose connections */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* the queue changed, or stop */
    pthread_cond_t idle; /* an entry stopped being in flight */
    bool stop;
    renew_entry **heap;
    size_t n, cap;
    redsem_renew_stats stats;
};

/* ------------------------------------------------------------------ timer queue (min-heap) */

static int64_t wake_at(const renew_entry *e)
{
    int64_t lost_at = atomic_load(&e->permit->deadline_ns) - lost_early_ns(e->permit->lease_ms);
    return e->next_ns < lost_at ? e->next_ns : lost_at;
}

static void heap_swap(redsem__renewer *r, size_t i, size_t j)
{
    renew_entry *t = r->heap[i];
    r->heap[i] = r->heap[j];
    r->heap[j] = t;
    r->heap[i]->heap_index = i;
    r->heap[j]->heap_index = j;
}

static void heap_up(redsem__renewer *r, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (wake_at(r->heap[p]) <= wake_at(r->heap[i]))
            break;
        heap_swap(r, i, p);
        i = p;
    }
}

static void heap_down(redsem__renewer *r, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < r->n && wake_at(r->heap[l]) < wake_at(r->heap[m]))
            m = l;
        if (l + 1 < r->n && wake_at(r->heap[l + 1]) < wake_at(r->heap[m]))
            m = l + 1;
        if (m == i)
            return;
        heap_swap(r, i, m);
        i = m;
    }
}

static int heap_push(redsem__renewer *r, renew_entry *e)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        renew_entry **h = redsem__realloc(r->heap, cap * sizeof *h);
        if (h == NULL)
            return REDSEM_ENOMEM;
        r->heap = h;
        r->cap = cap;
    }
    e->heap_index = r->n;
    r->heap[r->n++] = e;
    heap_up(r, e->heap_index);
    return REDSEM_OK;
}

static void heap_remove(redsem__renewer *r, renew_entry *e)
{
    size_t i = e->heap_index;
    if (i == SIZE_MAX)
        return;
    e->heap_index = SIZE_MAX;
    r->n--;
    if (i == r->n)
        return;
    r->heap[i] = r->heap[r->n];
    r->heap[i]->heap_index = i;
    heap_down(r, i);
    heap_up(r, i);
}

/* ------------------------------------------------------------------ the thread */

static void declare_lost(redsem__renewer *r, renew_entry *e, redsem_lost_reason why)
{
    /* called with the lock held and e in flight (so detach waits); unlocks for the callback */
    atomic_store(&e->permit->state, REDSEM__LOST);
    if (why == REDSEM_LOST_EXPIRED)
        r->stats.lost_expired++;
    else
        r->stats.lost_deadline++;
    if (e->on_lost != NULL) {
        pthread_mutex_unlock(&r->mu);
        e->on_lost(e->permit, why, e->user_data);
        pthread_mutex_lock(&r->mu);
    }
}

static void timed_wait(redsem__renewer *r, int64_t until_ns)
{
    struct timespec ts = {.tv_sec = until_ns / 1000000000LL, .tv_nsec = until_ns % 1000000000LL};
    int rc = pthread_cond_timedwait(&r->wake, &r->mu, &ts);
    (void)rc;
}

/* The outcome of one renewal (with the lock held, e in flight). */
static void renewed(redsem__renewer *r, renew_entry *e, int rc, int64_t sent)
{
    redsem_permit *p = e->permit;
    if (rc == REDSEM_OK) {
        r->stats.renewals++;
        int64_t d = redsem__validity_deadline(sent, p->lease_ms);
        int64_t cur = atomic_load(&p->deadline_ns);
        while (d > cur && !atomic_compare_exchange_weak(&p->deadline_ns, &cur, d))
            ;
        e->next_ns = sent + e->interval_ns;
        e->backoff_ns = 0;
        (void)heap_push(r, e); /* capacity exists: e was just removed */
    } else if (rc == REDSEM_ELOST) {
        declare_lost(r, e, REDSEM_LOST_EXPIRED);
    } else {
        /* Redis unreachable, slow or restarting: retry soon; the deadline check declares the
         * permit lost in time if this never succeeds. */
        r->stats.failures++;
        e->backoff_ns = e->backoff_ns ? e->backoff_ns * 2 : 25 * REDSEM__NS_PER_MS;
        if (e->backoff_ns > e->interval_ns / 2)
            e->backoff_ns = e->interval_ns / 2 > 0 ? e->interval_ns / 2 : 1;
        e->next_ns = redsem__now_ns() + redsem__rand_between(e->backoff_ns / 2, e->backoff_ns);
        (void)heap_push(r, e);
    }
    e->in_flight = false;
}

/* Renewals due within this much of the first one go in the same round trip (early by at
 * most this: harmless, a lease is extended from when its refresh is sent). */
#define RENEW_TOGETHER_NS (10 * REDSEM__NS_PER_MS)

static void *renewer_main(void *arg)
{
    redsem__renewer *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        if (r->n == 0) {
            pthread_cond_wait(&r->wake, &r->mu);
            continue;
        }
        int64_t now = redsem__now_ns(), due = wake_at(r->heap[0]);
        if (now < due) {
            timed_wait(r, due);
            continue;
        }
        /* every entry due now, and those due within RENEW_TOGETHER_NS, up to a batch */
        renew_entry *batch[REDSEM__BATCH_MAX];
        redsem_permit *ps[REDSEM__BATCH_MAX];
        int k = 0;
        int64_t cap = INT64_MAX;
        while (r->n > 0 && k < REDSEM__BATCH_MAX && !r->stop) {
            renew_entry *e = r->heap[0];
            now = redsem__now_ns();
            if (wake_at(e) > now + (k == 0 ? 0 : RENEW_TOGETHER_NS))
                break;
            heap_remove(r, e);
            e->in_flight = true;
            redsem_permit *p = e->permit;
            int64_t lost_at = atomic_load(&p->deadline_ns) - lost_early_ns(p->lease_ms);
            if (now >= lost_at) {
                declare_lost(r, e, REDSEM_LOST_DEADLINE); /* may unlock for the callback */
                e->in_flight = false;
                pthread_cond_broadcast(&r->idle);
                continue;
            }
            int64_t late = (now - e->next_ns) / REDSEM__NS_PER_MS;
            if (late > r->stats.max_lateness_ms)
                r->stats.max_lateness_ms = late;
            if (lost_at < cap)
                cap = lost_at;
            ps[k] = p;
            batch[k++] = e;
        }
        if (k == 0)
            continue;
        pthread_mutex_unlock(&r->mu);
        /* Never wait for a connection or a reply past the moment the first holder must be
         * told. */
        redsem__call_cap_set(r->owner, cap);
        int rcs[REDSEM__BATCH_MAX];
        int64_t sent[REDSEM__BATCH_MAX];
        if (k == 1)
            rcs[0] = redsem__refresh(r->owner, ps[0], &sent[0]);
        else
            redsem__refresh_many(r->owner, ps, k, rcs, sent);
        redsem__call_cap_set(r->owner, 0);
        pthread_mutex_lock(&r->mu);
        /* together in one round trip on one server; one by one in a Redis Cluster, and with
         * sync replicas (each refresh waits for its WAIT) */
        bool together = r->owner->ep.kind != REDSEM__EP_CLUSTER && r->owner->sync_replicas == 0;
        r->stats.round_trips += together ? 1 : (uint64_t)k;
        for (int i = 0; i < k; i++)
            renewed(r, batch[i], rcs[i], sent[i]);
        pthread_cond_broadcast(&r->idle);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ------------------------------------------------------------------ start / stop */

static void renewer_stop(redsem_client *c);
static void renewal_detach(redsem_permit *p);
static const redsem__renew_ops renew_ops = {renewer_stop, renewal_detach};

static int renewer_start(redsem_client *c)
{
    redsem__renewer *r = redsem__calloc(1, sizeof *r);
    if (r == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    r->owner = c;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->wake, &ca);
    pthread_cond_init(&r->idle, &ca);
    pthread_condattr_destroy(&ca);
    /* The renewer takes no signals: they keep going to the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int prc = pthread_create(&r->thread, NULL, renewer_main, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc != 0) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->wake);
        pthread_cond_destroy(&r->idle);
        redsem__free(r);
        return redsem__set_err(c, REDSEM_ENOMEM, "cannot start the renewer thread: %s",
                               strerror(prc));
    }
    c->renew_ops = &renew_ops;
    __atomic_store_n(&c->renewer, r, __ATOMIC_RELEASE);
    return REDSEM_OK;
}

static void renewer_stop(redsem_client *c)
{
    redsem__renewer *r = c->renewer;
    c->renewer = NULL;
    if (r == NULL || c->pid != getpid())
        return; /* in a forked child the thread does not exist: leave its memory alone */
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    /* Entries still queued belong to permits that were not freed: detach them. */
    for (size_t i = 0; i < r->n; i++) {
        r->heap[i]->permit->renewal = NULL;
        redsem__free(r->heap[i]);
    }
    redsem__free(r->heap);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->wake);
    pthread_cond_destroy(&r->idle);
    redsem__free(r);
}

static void renewal_detach(redsem_permit *p)
{
    renew_entry *e = p->renewal;
    redsem__renewer *r = redsem__renewer_of(p->client);
    p->renewal = NULL;
    if (e == NULL || r == NULL || p->client->pid != getpid())
        return; /* forked child: the parent's renewer is not ours to touch */
    pthread_mutex_lock(&r->mu);
    while (e->in_flight)
        pthread_cond_wait(&r->idle, &r->mu);
    heap_remove(r, e);
    /* not woken: it wakes when it planned to and finds the next entry due then, or none */
    pthread_mutex_unlock(&r->mu);
    redsem__free(e);
}

/* ------------------------------------------------------------------ public API */

redsem__renewer *redsem__renewer_of(const redsem_client *c)
{
    return __atomic_load_n(&c->renewer, __ATOMIC_ACQUIRE);
}

int redsem_permit_auto_renew(redsem_permit *p, int64_t interval_ms, redsem_lost_fn on_lost,
                             void *user_data)
{
    if (p == NULL)
        return REDSEM_EINVAL;
    redsem_client *c = p->client;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    int64_t window_ms = p->lease_ms - (p->lease_ms / 100 + 2);
    if (interval_ms == 0)
        interval_ms = p->lease_ms / 3;
    if (interval_ms < 1 || interval_ms >= window_ms)
        return redsem__set_err(c, REDSEM_EINVAL,
                               "renewal interval %lld ms: use 0 (a third of the lease) or "
                               "1..%lld ms",
                               (long long)interval_ms, (long long)window_ms - 1);
    if (p->renewal != NULL)
        return redsem__set_err(c, REDSEM_ESTATE, "permit %s is already renewed", p->id);
    if (!redsem_permit_held(p))
        return redsem__set_err(c, REDSEM_ESTATE, "permit %s is not held", p->id);
    if (redsem__renewer_of(c) == NULL) {
        /* threads sharing c may enable renewal at once: one starts the renewer */
        pthread_mutex_lock(&c->renew_mu);
        if (c->renewer == NULL)
            rc = renewer_start(c);
        pthread_mutex_unlock(&c->renew_mu);
        if (rc != REDSEM_OK)
            return rc;
    }
    renew_entry *e = redsem__calloc(1, sizeof *e);
    if (e == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    e->permit = p;
    e->interval_ns = interval_ms * REDSEM__NS_PER_MS;
    /* first renewal one interval after the grant was sent */
    e->next_ns = atomic_load(&p->deadline_ns) -
                 (p->lease_ms - (p->lease_ms / 100 + 2)) * REDSEM__NS_PER_MS + e->interval_ns;
    e->on_lost = on_lost;
    e->user_data = user_data;
    e->heap_index = SIZE_MAX;
    redsem__renewer *r = redsem__renewer_of(c);
    pthread_mutex_lock(&r->mu);
    rc = heap_push(r, e);
    /* Wake the renewer only if it must wake earlier than it planned (or had nothing to do):
     * a thread switch per renewed permit costs the application's threads more than the
     * renewal itself (bench -w threads --shared --renew). */
    if (rc == REDSEM_OK && e->heap_index == 0)
        pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->mu);
    if (rc != REDSEM_OK) {
        redsem__free(e);
        return redsem__set_err(c, rc, "out of memory");
    }
    p->renewal = e;
    return REDSEM_OK;
}

int redsem_permit_stop_renewal(redsem_permit *p)
{
    if (p == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(p->client);
    if (rc != REDSEM_OK)
        return rc;
    if (p->renewal != NULL)
        renewal_detach(p);
    return REDSEM_OK;
}

int redsem_client_renew_stats(redsem_client *c, redsem_renew_stats *st)
{
    if (c == NULL || st == NULL)
        return REDSEM_EINVAL;
    memset(st, 0, sizeof *st);
    redsem__renewer *r = redsem__renewer_of(c);
    if (r != NULL && c->pid == getpid()) {
        pthread_mutex_lock(&r->mu);
        *st = r->stats;
        pthread_mutex_unlock(&r->mu);
    }
    return REDSEM_OK;
}

