/* redsem - automatic renewal: one renewer thread per client, on the client's own request
 * connections (its renewals go first in their queue), and a timer queue (a binary min-heap
 * ordered by next wake-up time), like the seed's DelayQueue watchdog but for semaphore
 * permits as well as locks, beside a second heap ordered by lost time that bounds each round.
 * The permits granted on the event-loop engine's loop (drive_loop.c) have a renewer of that
 * loop instead, with the same queues, rounds and judgement but no thread: the loop's timer
 * runs its rounds (redsem__renew_loop_run) and its requests go on the engine's pipe.
 * See include/redsem/renew.h. */
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
    size_t heap_index; /* in the timer queue; SIZE_MAX when not queued */
    size_t lost_index; /* in the queue by lost time; SIZE_MAX when not queued */
    /* Its keys in the two queues: its next wake-up and its lost time, as they were when it
     * was queued. A refresh by the caller may move its deadline (never back) while it is
     * queued, so they are lower bounds of the live values: heap_top() re-keys a stale top,
     * which keeps both heaps in order (a key changed in place would break it). */
    int64_t wake_key, lost_key;
    /* In the renewer's list of the entries its permits point to (queued, in flight, or
     * found lost), which freeing a handle or the client walks. */
    struct renew_entry *prev, *next;
    struct redsem__renewer *owner; /* the renewer it is queued in */
    int script;     /* a loop's renewal in flight: its script, for the judgement */
    int64_t cap_ns; /* ... and the moment its request must end by */
    bool in_flight; /* the renewer is working on it (outside the lock, or in a callback) */
    /* Let go of by its permit while in flight, from a lost callback on the renewer thread
     * (which cannot wait for itself): permit is NULL, and the renewer frees it once done. */
    bool detached;
} renew_entry;

/* A binary min-heap of entries: the timer queue (by next wake-up: renewal or lost time), or
 * the same entries by lost time, which bounds how long a round of renewals may take. */
typedef struct renew_heap {
    renew_entry **v;
    size_t n, cap;
    bool by_lost;
} renew_heap;

struct redsem__renewer {
    redsem_client *owner; /* the client whose permits it renews, and whose connections */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* the queue changed, or stop */
    pthread_cond_t idle; /* an entry stopped being in flight */
    bool stop;
    /* its client was freed from a lost callback: the thread frees the renewer as it ends */
    bool orphaned;
    renew_entry *attached; /* every entry a permit points to (see renew_entry.prev) */
    renew_heap q;  /* queued entries by next wake-up */
    renew_heap lq; /* the same by lost time */
    redsem_renew_stats stats;
    /* Entries let go of while in flight (drop): freed when the renewer is done with them. */
    renew_entry *gone;
    /* An event loop's renewer (redsem__renew_loop_new): no thread, and it never waits for a
     * renewal in flight (its loop's thread may be the one waiting): one let go of is
     * detached, its reply ignored. */
    bool loop;
    bool sending; /* the loop's thread sends a renewal, mu held (a reply there finds it so) */
    bool closed;  /* its redsem_async was freed: auto_renew of its permits takes the thread */
    int poke_fd;  /* written to when a permit falls due earlier than the loop's timer */
    int nflight;  /* its renewals in flight */
    atomic_int refs;        /* its redsem_async's, and one per permit granted there */
    redsem__home home;      /* what those permits point to (p->home) */
    redsem__renewer *next_loop; /* in its client's loop_renewers (c->renew_mu) */
};

/* ------------------------------------------------------------------ timer queues (min-heaps) */

static int64_t lost_at(const renew_entry *e)
{
    return atomic_load(&e->permit->deadline_ns) - lost_early_ns(e->permit->lease_ms);
}

static int64_t wake_at(const renew_entry *e)
{
    int64_t l = lost_at(e);
    return e->next_ns < l ? e->next_ns : l;
}

static int64_t heap_key(const renew_heap *h, const renew_entry *e)
{
    return h->by_lost ? e->lost_key : e->wake_key;
}

static size_t *heap_slot(const renew_heap *h, renew_entry *e)
{
    return h->by_lost ? &e->lost_index : &e->heap_index;
}

static void heap_swap(renew_heap *h, size_t i, size_t j)
{
    renew_entry *t = h->v[i];
    h->v[i] = h->v[j];
    h->v[j] = t;
    *heap_slot(h, h->v[i]) = i;
    *heap_slot(h, h->v[j]) = j;
}

static void heap_up(renew_heap *h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (heap_key(h, h->v[p]) <= heap_key(h, h->v[i]))
            break;
        heap_swap(h, i, p);
        i = p;
    }
}

static void heap_down(renew_heap *h, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < h->n && heap_key(h, h->v[l]) < heap_key(h, h->v[m]))
            m = l;
        if (l + 1 < h->n && heap_key(h, h->v[l + 1]) < heap_key(h, h->v[m]))
            m = l + 1;
        if (m == i)
            return;
        heap_swap(h, i, m);
        i = m;
    }
}

static int heap_push(renew_heap *h, renew_entry *e)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 16;
        renew_entry **v = redsem__realloc(h->v, cap * sizeof *v);
        if (v == NULL)
            return REDSEM_ENOMEM;
        h->v = v;
        h->cap = cap;
    }
    *heap_slot(h, e) = h->n;
    h->v[h->n++] = e;
    heap_up(h, h->n - 1);
    return REDSEM_OK;
}

static void heap_remove(renew_heap *h, renew_entry *e)
{
    size_t i = *heap_slot(h, e);
    if (i == SIZE_MAX)
        return;
    *heap_slot(h, e) = SIZE_MAX;
    h->n--;
    if (i == h->n)
        return;
    h->v[i] = h->v[h->n];
    *heap_slot(h, h->v[i]) = i;
    heap_down(h, i);
    heap_up(h, i);
}

/* The top of h with its key up to date (NULL if h is empty): a top whose key is stale (its
 * deadline moved since it was queued) is re-keyed and sifted down until the top's key is
 * its live value, which no other entry's live value is below. */
static renew_entry *heap_top(renew_heap *h)
{
    while (h->n > 0) {
        renew_entry *e = h->v[0];
        int64_t live = h->by_lost ? lost_at(e) : wake_at(e);
        int64_t *key = h->by_lost ? &e->lost_key : &e->wake_key;
        if (*key >= live)
            return e;
        *key = live;
        heap_down(h, 0);
    }
    return NULL;
}

/* Queue e in both heaps (REDSEM_ENOMEM: in neither), or take it out of both. */
static int enqueue(redsem__renewer *r, renew_entry *e)
{
    e->lost_key = lost_at(e);
    e->wake_key = wake_at(e);
    if (heap_push(&r->q, e) != REDSEM_OK)
        return REDSEM_ENOMEM;
    if (heap_push(&r->lq, e) != REDSEM_OK) {
        heap_remove(&r->q, e);
        return REDSEM_ENOMEM;
    }
    return REDSEM_OK;
}

static void dequeue(redsem__renewer *r, renew_entry *e)
{
    heap_remove(&r->q, e);
    heap_remove(&r->lq, e);
}

/* ------------------------------------------------------------------ entries and permits */

/* The renewer whose thread this is (NULL on other threads): a call from its lost callback
 * must not wait for the renewer, itself. */
static _Thread_local const redsem__renewer *this_renewer;

/* Link e at the head of the list *head (r->attached or r->gone), or unlink it from there. */
static void link_entry(renew_entry **head, renew_entry *e)
{
    e->prev = NULL;
    e->next = *head;
    if (*head != NULL)
        (*head)->prev = e;
    *head = e;
}

static void unlink_entry(renew_entry **head, renew_entry *e)
{
    if (e->prev != NULL)
        e->prev->next = e->next;
    else
        *head = e->next;
    if (e->next != NULL)
        e->next->prev = e->prev;
}

/* Point e's permit at e (with r->mu held): e joins the renewer's list and its handle's count. */
static void attach(redsem__renewer *r, renew_entry *e)
{
    link_entry(&r->attached, e);
    redsem_permit *p = e->permit;
    atomic_fetch_add(p->kind->renewed(p->handle), 1);
    __atomic_store_n(&p->renewal, e, __ATOMIC_RELEASE);
}

/* Let go of e (with r->mu held, e not in flight on another thread): its permit is no longer
 * renewed. Freed now, or, in flight on this thread (a lost callback's call), marked detached
 * for the renewer to free when it is done with it. */
static void drop(redsem__renewer *r, renew_entry *e)
{
    unlink_entry(&r->attached, e);
    redsem_permit *p = e->permit;
    atomic_fetch_sub(p->kind->renewed(p->handle), 1);
    __atomic_store_n(&p->renewal, NULL, __ATOMIC_RELEASE);
    if (e->in_flight) {
        e->detached = true;
        e->permit = NULL;
        link_entry(&r->gone, e); /* for the renewer to free (or its loop's end) */
    } else {
        dequeue(r, e);
        redsem__free(e);
    }
}

/* The renewer is done with e for now (with r->mu held): one let go of meanwhile is freed. */
static void settle(redsem__renewer *r, renew_entry *e)
{
    if (!e->detached) {
        e->in_flight = false;
        return;
    }
    unlink_entry(&r->gone, e);
    redsem__free(e);
}

/* ------------------------------------------------------------------ the thread */

static void declare_lost(redsem__renewer *r, renew_entry *e, redsem_lost_reason why)
{
    /* Called with the lock held and e in flight (so detach waits); unlocks for the callback,
     * which may let go of e or of others in flight (drop), or free the client (orphaned):
     * the caller then touches none of their permits, nor the client. */
    if (atomic_exchange(&e->permit->state, REDSEM__LOST) == REDSEM__HELD) {
        if (why == REDSEM_LOST_EXPIRED)
            redsem__metrics_lost_held(e->permit);
        else
            redsem__metrics_lost(e->permit->metrics, REDSEM__ML_RENEWAL);
    }
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

/* Queue e again after its round. Out of memory (auto_renew may have used the places this
 * round freed), it is declared lost rather than left in neither queue, never renewed and
 * never reported (found by review). */
static void requeue(redsem__renewer *r, renew_entry *e)
{
    if (enqueue(r, e) != REDSEM_OK)
        declare_lost(r, e, REDSEM_LOST_DEADLINE);
}

/* The outcome of one renewal (with the lock held, e in flight). */
static void renewed(redsem__renewer *r, renew_entry *e, int rc, int64_t sent)
{
    redsem_permit *p = e->permit;
    if (!e->detached)
        redsem__metrics_renewal(p->metrics, rc);
    if (e->detached) {
        /* let go of by an earlier lost callback of this round: its permit may be gone */
    } else if (rc == REDSEM_OK) {
        r->stats.renewals++;
        int64_t d = redsem__validity_deadline(sent, p->lease_ms);
        int64_t cur = atomic_load(&p->deadline_ns);
        while (d > cur && !atomic_compare_exchange_weak(&p->deadline_ns, &cur, d))
            ;
        e->next_ns = sent + e->interval_ns;
        e->backoff_ns = 0;
        requeue(r, e);
    } else if (rc == REDSEM_ELOST) {
        declare_lost(r, e, REDSEM_LOST_EXPIRED);
    } else if (redsem__now_ns() >= lost_at(e)) {
        /* failed at its lost time (a renewal's cap is that time): told now, not a timer's
         * turn later (a loop's timer goes round once more first: told late under valgrind) */
        r->stats.failures++;
        declare_lost(r, e, REDSEM_LOST_DEADLINE);
    } else {
        /* Redis unreachable, slow or restarting: retry soon; the deadline check declares the
         * permit lost in time if this never succeeds. */
        r->stats.failures++;
        e->backoff_ns = e->backoff_ns ? e->backoff_ns * 2 : 25 * REDSEM__NS_PER_MS;
        if (e->backoff_ns > e->interval_ns / 2)
            e->backoff_ns = e->interval_ns / 2 > 0 ? e->interval_ns / 2 : 1;
        e->next_ns = redsem__now_ns() + redsem__rand_between(e->backoff_ns / 2, e->backoff_ns);
        requeue(r, e);
    }
    settle(r, e);
}

/* Renewals due within this much of the first one go in the same round trip (early by at
 * most this: harmless, a lease is extended from when its refresh is sent). */
#define RENEW_TOGETHER_NS (10 * REDSEM__NS_PER_MS)

/* The moment a renewal must end by (with the lock held), lost being the first lost time of
 * its round. Never past the moment the first holder must be told: of this round, or, on the
 * thread, of the permits left in the queue, whose lost notices wait for this round's end
 * (found by review: a 30 s lease's renewal to a stalled server held a 3 s lease's notice 3 s
 * past its validity; a loop's queue does not wait for its renewals in flight); and never
 * past one command timeout (a renewal that fails is retried after a short backoff). */
static int64_t round_cap(redsem__renewer *r, int64_t lost)
{
    renew_entry *first_lost = r->loop ? NULL : heap_top(&r->lq);
    if (first_lost != NULL && first_lost->lost_key < lost)
        lost = first_lost->lost_key;
    int64_t ct = redsem__now_ns() + r->owner->command_timeout_ms * REDSEM__NS_PER_MS;
    return ct < lost ? ct : lost;
}

/* Take a round (with the lock held, something due): every entry due now, and those due
 * within RENEW_TOGETHER_NS, up to a batch, into batch, each dequeued and in flight; one past
 * its lost time is declared lost instead (which may unlock for its callback). Returns how
 * many are to be sent, and in *cap the moment the round must end by (round_cap). */
static int take_due(redsem__renewer *r, renew_entry **batch, int64_t *cap)
{
    int k = 0;
    *cap = INT64_MAX;
    renew_entry *e;
    while (k < REDSEM__BATCH_MAX && !r->stop && (e = heap_top(&r->q)) != NULL) {
        int64_t now = redsem__now_ns();
        if (e->wake_key > now + (k == 0 ? 0 : RENEW_TOGETHER_NS))
            break;
        dequeue(r, e);
        e->in_flight = true;
        int64_t lost = lost_at(e);
        if (now >= lost) {
            declare_lost(r, e, REDSEM_LOST_DEADLINE); /* may unlock for the callback */
            settle(r, e);
            pthread_cond_broadcast(&r->idle);
            continue;
        }
        int64_t late = (now - e->next_ns) / REDSEM__NS_PER_MS;
        if (late > r->stats.max_lateness_ms)
            r->stats.max_lateness_ms = late;
        if (lost < *cap)
            *cap = lost;
        batch[k++] = e;
    }
    /* A lost callback above may have let go of entries of this batch (their permits may be
     * gone), or freed the client (then all of them, and r->stop is set): not sent. */
    int kept = 0;
    for (int i = 0; i < k; i++) {
        if (batch[i]->detached || r->orphaned)
            settle(r, batch[i]);
        else
            batch[kept++] = batch[i];
    }
    *cap = round_cap(r, *cap);
    if (kept == 0)
        pthread_cond_broadcast(&r->idle);
    return kept;
}

static void renewer_free(redsem__renewer *r);

static void *renewer_main(void *arg)
{
    redsem__renewer *r = arg;
    this_renewer = r;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        renew_entry *top = heap_top(&r->q);
        if (top == NULL) {
            pthread_cond_wait(&r->wake, &r->mu);
            continue;
        }
        if (redsem__now_ns() < top->wake_key) {
            timed_wait(r, top->wake_key);
            continue;
        }
        renew_entry *batch[REDSEM__BATCH_MAX];
        redsem_permit *ps[REDSEM__BATCH_MAX];
        int64_t cap;
        int k = take_due(r, batch, &cap);
        if (k == 0)
            continue;
        for (int i = 0; i < k; i++)
            ps[i] = batch[i]->permit;
        pthread_mutex_unlock(&r->mu);
        redsem__call_cap_set(r->owner, cap);
        int rcs[REDSEM__BATCH_MAX];
        int64_t sent[REDSEM__BATCH_MAX];
        if (k == 1)
            rcs[0] = redsem__refresh(r->owner, ps[0], &sent[0]);
        else
            redsem__refresh_many(r->owner, ps, k, rcs, sent);
        redsem__call_cap_set(r->owner, 0);
        pthread_mutex_lock(&r->mu);
        /* together in one round trip on one server (with sync replicas, one WAIT after
         * them all: the engine's group commit); one by one in a Redis Cluster */
        bool together = r->owner->ep.kind != REDSEM__EP_CLUSTER;
        r->stats.round_trips += together ? 1 : (uint64_t)k;
        for (int i = 0; i < k; i++)
            renewed(r, batch[i], rcs[i], sent[i]);
        pthread_cond_broadcast(&r->idle);
    }
    bool orphaned = r->orphaned;
    pthread_mutex_unlock(&r->mu);
    if (orphaned)
        renewer_free(r); /* its client is gone, and nobody joins this thread */
    return NULL;
}

/* ------------------------------------------------------------------ start / stop */

static void renewer_stop(redsem_client *c);
static void renewal_detach(redsem_permit *p);
static void renewal_forget(redsem_client *c, const void *handle);
/* The renewer of c, or NULL (an atomic read: another thread may be starting it). */
static redsem__renewer *renewer_of(const redsem_client *c)
{
    return __atomic_load_n(&c->renewer, __ATOMIC_ACQUIRE);
}

static const redsem__renew_ops renew_ops = {renewer_stop, renewal_detach, renewal_forget};

/* A renewer of c with empty queues (no thread yet), or NULL: out of memory. */
static redsem__renewer *renewer_new(redsem_client *c)
{
    redsem__renewer *r = redsem__calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->owner = c;
    r->lq.by_lost = true;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->wake, &ca);
    pthread_cond_init(&r->idle, &ca);
    pthread_condattr_destroy(&ca);
    return r;
}

/* With c->renew_mu held. */
static int renewer_start(redsem_client *c)
{
    redsem__renewer *r = renewer_new(c);
    if (r == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    /* The renewer takes no signals: they keep going to the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int prc = pthread_create(&r->thread, NULL, renewer_main, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc != 0) {
        renewer_free(r);
        return redsem__set_err(c, REDSEM_ENOMEM, "cannot start the renewer thread: %s",
                               strerror(prc));
    }
    c->renew_ops = &renew_ops;
    __atomic_store_n(&c->renewer, r, __ATOMIC_RELEASE);
    return REDSEM_OK;
}

/* Stop the renewer of c and let go of every permit it still renews (queued, or found lost:
 * found by review, a lost one kept its entry, and its free then reached into the freed
 * client): they may then be freed after the client. */
static void renewer_stop(redsem_client *c)
{
    redsem__renewer *r = c->renewer;
    __atomic_store_n(&c->renewer, NULL, __ATOMIC_RELEASE);
    if (r == NULL || c->pid != getpid())
        return; /* in a forked child the thread does not exist: leave its memory alone */
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    if (this_renewer == r) {
        /* From one of its own lost callbacks: it cannot join itself. The entries in flight
         * are freed by the thread when the callback returns, and the renewer as it ends. */
        while (r->attached != NULL)
            drop(r, r->attached);
        r->orphaned = true;
        pthread_detach(pthread_self());
        pthread_mutex_unlock(&r->mu);
        return;
    }
    pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL); /* it finishes its round, callbacks included */
    while (r->attached != NULL)
        drop(r, r->attached);
    renewer_free(r);
}

static void renewer_free(redsem__renewer *r)
{
    while (r->gone != NULL) { /* a loop's, whose loop ended with them in flight */
        renew_entry *e = r->gone;
        r->gone = e->next;
        redsem__free(e);
    }
    redsem__free(r->q.v);
    redsem__free(r->lq.v);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->wake);
    pthread_cond_destroy(&r->idle);
    redsem__free(r);
}

/* The loop renewer p was granted by, locked, if it is still open (else NULL: p's renewal, if
 * any, is the client's renewer's). */
static redsem__renewer *open_home(const redsem_permit *p)
{
    if (p->home == NULL)
        return NULL;
    redsem__renewer *r = (redsem__renewer *)((char *)p->home - offsetof(redsem__renewer, home));
    pthread_mutex_lock(&r->mu);
    if (!r->closed)
        return r;
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void renewal_detach(redsem_permit *p)
{
    if (p->client->pid != getpid()) {
        /* forked child: the parent's renewer is not ours to touch */
        __atomic_store_n(&p->renewal, NULL, __ATOMIC_RELEASE);
        return;
    }
    redsem__renewer *r = open_home(p);
    if (r == NULL) {
        r = renewer_of(p->client);
        if (r == NULL) {
            __atomic_store_n(&p->renewal, NULL, __ATOMIC_RELEASE);
            return;
        }
        pthread_mutex_lock(&r->mu);
    }
    /* Wait for a renewal in flight, except on the renewer thread (a lost callback: its
     * renewal is then over but for its outcome, which drop() tells the renewer to skip) and
     * on a loop (whose thread may be this one: drop() tells it to skip the outcome, and a
     * refresh cannot bring back a lease released meanwhile). The entry is read anew after
     * each wait: another thread may have let go of it. */
    renew_entry *e;
    while ((e = __atomic_load_n(&p->renewal, __ATOMIC_ACQUIRE)) != NULL && e->in_flight &&
           this_renewer != r && !r->loop)
        pthread_cond_wait(&r->idle, &r->mu);
    if (e != NULL)
        drop(r, e);
    /* not woken: it wakes when it planned to and finds the next entry due then, or none */
    pthread_mutex_unlock(&r->mu);
}

/* Let go of r's entries of handle (with r->mu held); whether one is in flight on another
 * thread, to be waited for (never on a loop's renewer: see renewal_detach). */
static bool forget_in(redsem__renewer *r, const void *handle)
{
    bool busy = false;
    renew_entry *next;
    for (renew_entry *e = r->attached; e != NULL; e = next) {
        next = e->next;
        if (e->permit->handle != handle)
            continue;
        if (e->in_flight && this_renewer != r && !r->loop)
            busy = true;
        else
            drop(r, e);
    }
    return busy;
}

/* Stop renewing every permit of a handle that is being freed, waiting for their renewals in
 * flight (which read the handle's keys), except on the renewer thread (as renewal_detach). */
static void renewal_forget(redsem_client *c, const void *handle)
{
    if (c->pid != getpid())
        return;
    pthread_mutex_lock(&c->renew_mu);
    for (redsem__renewer *r = c->loop_renewers; r != NULL; r = r->next_loop) {
        pthread_mutex_lock(&r->mu);
        (void)forget_in(r, handle);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&c->renew_mu);
    redsem__renewer *r = renewer_of(c);
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    while (forget_in(r, handle))
        pthread_cond_wait(&r->idle, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* ------------------------------------------------------------------ an event loop's renewer */

/* A renewal of a loop's is one request on the loop's pipe (its renewals due together go out
 * in one write), built by the same call as the thread's and ended by the same judgement.
 * Its reply is judged under the lock, which the loop's thread holds already when the request
 * failed as it was sent (r->sending). */
static int loop_judge(void *arg, int rc, struct redisReply **reply,
                      const redsem__req_info *info)
{
    renew_entry *e = arg;
    redsem__renewer *r = e->owner;
    bool lock = !r->sending;
    if (lock)
        pthread_mutex_lock(&r->mu);
    r->nflight--;
    if (e->detached) {
        settle(r, e); /* let go of meanwhile: its permit may be gone */
    } else {
        int64_t sent = 0;
        rc = redsem__refresh_reply(r->owner, e->permit, e->script, rc, *reply, info, &sent);
        renewed(r, e, rc, sent);
    }
    if (lock)
        pthread_mutex_unlock(&r->mu);
    return rc;
}

static void loop_build(void *arg, redsem__call *call)
{
    renew_entry *e = arg;
    redsem__refresh_call(e->permit, call);
    call->cap_ns = e->cap_ns;
    e->script = call->script;
}

static void loop_sent(void *arg, int rc, redsem_permit *p)
{
    (void)arg, (void)rc, (void)p; /* judged by loop_judge */
}

static void loop_unref(redsem__home *h)
{
    redsem__renewer *r = (redsem__renewer *)((char *)h - offsetof(redsem__renewer, home));
    if (atomic_fetch_sub(&r->refs, 1) == 1)
        renewer_free(r);
}

int redsem__renew_loop_new(redsem_client *c, int poke_fd, redsem__renewer **ret)
{
    redsem__renewer *r = renewer_new(c);
    if (r == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    r->loop = true;
    r->poke_fd = poke_fd;
    atomic_init(&r->refs, 1);
    r->home.unref = loop_unref;
    pthread_mutex_lock(&c->renew_mu);
    c->renew_ops = &renew_ops;
    r->next_loop = c->loop_renewers;
    c->loop_renewers = r;
    pthread_mutex_unlock(&c->renew_mu);
    *ret = r;
    return REDSEM_OK;
}

void redsem__renew_loop_adopt(redsem__renewer *r, redsem_permit *p)
{
    atomic_fetch_add(&r->refs, 1);
    p->home = &r->home;
}

int64_t redsem__renew_loop_next(redsem__renewer *r, bool *busy)
{
    pthread_mutex_lock(&r->mu);
    const renew_entry *top = heap_top(&r->q);
    int64_t at = top != NULL ? top->wake_key : REDSEM__FOREVER;
    if (busy != NULL)
        *busy = r->nflight > 0;
    pthread_mutex_unlock(&r->mu);
    return at;
}

void redsem__renew_loop_run(redsem__renewer *r, redsem__loop *l)
{
    pthread_mutex_lock(&r->mu);
    renew_entry *batch[REDSEM__BATCH_MAX];
    int64_t cap; /* the thread's: each renewal here has a cap of its own */
    int k;
    while ((k = take_due(r, batch, &cap)) > 0) {
        r->stats.round_trips++; /* its requests go out in one write */
        for (int i = 0; i < k; i++) {
            renew_entry *e = batch[i];
            if (e->detached) { /* by a lost callback of a renewal sent before it */
                settle(r, e);
                continue;
            }
            e->cap_ns = round_cap(r, lost_at(e)); /* its own: each is a request of its own */
            r->nflight++;
            r->sending = true;
            int rc = redsem__loop_call(l, loop_build, loop_judge, loop_sent, e);
            if (rc != REDSEM_OK) /* not queued (no memory): a failed renewal */
                (void)loop_judge(e, rc, NULL, &(redsem__req_info){.replicas_acked = -1});
            r->sending = false;
        }
    }
    pthread_mutex_unlock(&r->mu);
}

void redsem__renew_loop_close(redsem__renewer *r)
{
    redsem_client *c = r->owner;
    pthread_mutex_lock(&c->renew_mu);
    for (redsem__renewer **pp = &c->loop_renewers; *pp != NULL; pp = &(*pp)->next_loop)
        if (*pp == r) {
            *pp = r->next_loop;
            break;
        }
    pthread_mutex_unlock(&c->renew_mu);
    pthread_mutex_lock(&r->mu);
    r->closed = true;
    while (r->attached != NULL)
        drop(r, r->attached);
    pthread_mutex_unlock(&r->mu);
}

void redsem__renew_loop_put(redsem__renewer *r)
{
    loop_unref(&r->home);
}

/* ------------------------------------------------------------------ public API */

int redsem_permit_auto_renew(redsem_permit *p, int64_t interval_ms, redsem_lost_fn on_lost,
                             void *user_data)
{
    if (p == NULL)
        return REDSEM_EINVAL;
    redsem_client *c = p->client;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    /* A renewal must reach the server while the lease still has the refresh margin left
     * (refresh.lua refuses it otherwise), so the first one, an interval after the grant was
     * sent, must come before lease - margin (found by review: 1..lease - drift was accepted,
     * and an interval in the last ~60 ms of a 1 s lease lost the permit every time). */
    int64_t max_ms = p->lease_ms - redsem__refresh_margin_ms(p->lease_ms) - 1;
    if (interval_ms == 0)
        interval_ms = p->lease_ms / 3;
    if (interval_ms < 1 || interval_ms > max_ms)
        return redsem__set_err(c, REDSEM_EINVAL,
                               "renewal interval %lld ms: use 0 (a third of the lease) or "
                               "1..%lld ms (the lease less its refresh margin)",
                               (long long)interval_ms, (long long)max_ms);
    if (__atomic_load_n(&p->renewal, __ATOMIC_ACQUIRE) != NULL)
        return redsem__set_err(c, REDSEM_ESTATE, "permit %s is already renewed", p->id);
    if (!redsem_permit_held(p))
        return redsem__set_err(c, REDSEM_ESTATE, "permit %s is not held", p->id);
    renew_entry *e = redsem__calloc(1, sizeof *e);
    if (e == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    /* granted on a loop that still runs: renewed there; else by the client's thread */
    redsem__renewer *r = open_home(p);
    if (r == NULL && renewer_of(c) == NULL) {
        /* threads sharing c may enable renewal at once: one starts the renewer */
        pthread_mutex_lock(&c->renew_mu);
        if (c->renewer == NULL)
            rc = renewer_start(c);
        pthread_mutex_unlock(&c->renew_mu);
        if (rc != REDSEM_OK) {
            redsem__free(e);
            return rc;
        }
    }
    if (r == NULL) {
        r = renewer_of(c);
        pthread_mutex_lock(&r->mu);
    }
    e->permit = p;
    e->owner = r;
    e->interval_ns = interval_ms * REDSEM__NS_PER_MS;
    /* first renewal one interval after the grant was sent */
    e->next_ns = atomic_load(&p->deadline_ns) -
                 (p->lease_ms - (p->lease_ms / 100 + 2)) * REDSEM__NS_PER_MS + e->interval_ns;
    e->on_lost = on_lost;
    e->user_data = user_data;
    e->heap_index = SIZE_MAX;
    e->lost_index = SIZE_MAX;
    rc = enqueue(r, e);
    if (rc == REDSEM_OK)
        attach(r, e); /* before the lock is let go: its lost callback may come at once */
    /* Wake the renewer only if it must wake earlier than it planned (or had nothing to do):
     * a thread switch per renewed permit costs the application's threads more than the
     * renewal itself (bench -w threads --shared --renew). A loop's is told through its
     * redsem_async's pipe: its next report sets the timer anew. */
    if (rc == REDSEM_OK && e->heap_index == 0 && !r->loop)
        pthread_cond_broadcast(&r->wake);
    if (rc == REDSEM_OK && e->heap_index == 0 && r->loop) {
        char b = 1;
        ssize_t w;
        do
            w = write(r->poke_fd, &b, 1);
        while (w < 0 && errno == EINTR);
    }
    pthread_mutex_unlock(&r->mu);
    if (rc != REDSEM_OK) {
        redsem__free(e);
        return redsem__set_err(c, rc, "out of memory");
    }
    return REDSEM_OK;
}

int redsem_permit_stop_renewal(redsem_permit *p)
{
    if (p == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(p->client);
    if (rc != REDSEM_OK)
        return rc;
    if (__atomic_load_n(&p->renewal, __ATOMIC_ACQUIRE) != NULL)
        renewal_detach(p);
    return REDSEM_OK;
}

/* Add r's counters to st (with r->mu held). */
static void stats_add(redsem_renew_stats *st, const redsem__renewer *r)
{
    st->renewals += r->stats.renewals;
    st->failures += r->stats.failures;
    st->lost_expired += r->stats.lost_expired;
    st->lost_deadline += r->stats.lost_deadline;
    st->round_trips += r->stats.round_trips;
    if (r->stats.max_lateness_ms > st->max_lateness_ms)
        st->max_lateness_ms = r->stats.max_lateness_ms;
}

int redsem_client_renew_stats(redsem_client *c, redsem_renew_stats *st)
{
    if (c == NULL || st == NULL)
        return REDSEM_EINVAL;
    memset(st, 0, sizeof *st);
    if (c->pid != getpid())
        return REDSEM_OK;
    redsem__renewer *r = renewer_of(c);
    if (r != NULL) {
        pthread_mutex_lock(&r->mu);
        stats_add(st, r);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_lock(&c->renew_mu); /* and those of its event loops' (running) */
    for (r = c->loop_renewers; r != NULL; r = r->next_loop) {
        pthread_mutex_lock(&r->mu);
        stats_add(st, r);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&c->renew_mu);
    return REDSEM_OK;
}
