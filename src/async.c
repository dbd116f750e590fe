/* redsem - the event-loop API (include/redsem/async.h).
 *
 * Two engines run its operations. The loop engine (REDSEM_ASYNC_LOOP, the default build; the
 * parts under #if REDSEM_ASYNC_LOOP): a one-server client's operations are state machines of
 * drive_loop.c stepped on the loop's thread, their descriptors and a timerfd in one epoll
 * set the loop watches, no thread (docs/design.md sections 12 and 16). The workers (the
 * rest of this file; every client in a -Dasync_engine=threads build, Sentinel and Cluster
 * clients in the default one): an operation is its blocking twin run on a worker thread:
 * the same call path, scripts and guarantees (sync and async share one path). Workers are started on demand, up to
 * REDSEM_ASYNC_WORKERS_MAX; idle ones sleep on a stack, work wakes the last to go idle, and
 * one ends after WORKER_IDLE_MS without work (or sooner: see worker_main). Two queues: the
 * operations that wait (blocking acquires) and the quick ones (the rest); a worker takes a
 * quick one first, and at most REDSEM_ASYNC_WORKERS_MAX - 1 workers run waiting ones, so a
 * release always finds a worker. A finished operation goes on the done list and writes one
 * byte to a pipe (only when the list was empty) whose read end the loop watches;
 * redsem_async_action() drains it and runs the callbacks, on the loop's thread.
 *
 * A waiting acquire does not keep its worker while it waits: where the blocking call would
 * sleep in the client's shared wait (wake.c), the worker parks it instead (its loop's state
 * kept, acquire.c's redsem__park_slot; the wait registered with redsem__wake_park) and takes
 * other work. When the wait ends, the shared wait's leader queues it again (at the front of
 * the waiting queue) and a worker continues its loop (redsem__acquire_resume). So thousands
 * of acquires can wait at once on a few threads. The shared wait needs a thread to lead it:
 * the worker that parks the first wait leads it until no parked wait is left; when a lead
 * ends with only parked waits left, a worker is asked to take it (need_lead). A cluster
 * client's waits are not parked (one connection each): they keep their worker.
 *
 * Cancellation of a running or parked acquire: its cancel flag is the thread-local
 * redsem__cancel of the worker running it; the acquire loop (acquire.c) checks it before each
 * wait, and the shared wait (wake.c) ends a cancelled waiter's wait (redsem__wake_cancelled(),
 * run by a worker as an internal quick job, since it may send one request). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "redsem/async.h"
#include "internal.h"

#if REDSEM_ASYNC_LOOP
#include <poll.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#endif

#define WORKER_IDLE_MS 2000
/* an idle worker also ends when it wakes WORKER_LINGER_MS or more after going idle (then, or
 * later for work another took, or a deadline) and WORKERS_IDLE_KEEP others are idle: a
 * burst of wake-ups (many parked acquires' backoffs ending in one round of the shared wait)
 * takes as many workers, and the pool shrinks back after it */
#define WORKER_LINGER_MS 50
#define WORKERS_IDLE_KEEP 2
/* waiting acquires with a wake-up list of their own (fair and locked semaphores on a
 * cluster client, whose waits have a wait connection and a worker each) started at once
 * (running; more wait in the queue, unstarted). On one server (0.4.3) a fair waiter shares
 * its client's id list (wake.c), and ASYNC_WAITS_ALL bounds it as a basic one. */
#ifndef ASYNC_WAITS_MAX
#define ASYNC_WAITS_MAX (REDSEM_ASYNC_WORKERS_MAX - 1)
#endif
/* waiting acquires of every kind started at once: on one server they share one list per
 * semaphore or lock (no more keys for more waits), so only memory bounds them (a few KiB
 * each while parked) */
#define ASYNC_WAITS_ALL 1024

typedef enum op_kind {
    OP_SEM_ACQUIRE,
    OP_LOCK_ACQUIRE,
    OP_REFRESH,
    OP_RELEASE,
    OP_SEM_STATUS,
    OP_LOCK_STATUS,
    OP_WAKE_CANCELLED, /* internal: redsem__wake_cancelled(); no callback */
    OP_LEAD,           /* internal: redsem__wake_lead() (the one struct a->lead_op) */
} op_kind;

typedef enum op_state { ST_QUEUED, ST_RUNNING, ST_PARKED, ST_DONE } op_state;

struct redsem_async;

typedef struct op {
    struct op *next; /* in a queue, the running list or the done list */
    uint64_t id;
    op_kind kind;
    op_state state;
    bool waits; /* a blocking acquire: the waiting queue, cancellable while running */
    bool own_list; /* a waiting acquire with a wake-up list of its own (ASYNC_WAITS_MAX) */
    void *handle;
    uint32_t n;
    int64_t timeout_ms;
    /* a waiting acquire's deadline, counted from its submission (redsem__now_ns(); 0: none,
     * REDSEM_WAIT_FOREVER); late: it started at or after it, as one try-acquire */
    int64_t deadline_ns;
    int64_t submit_ns; /* when it was submitted (redsem__now_ns()) */
    bool late;
    size_t max_entries;
    redsem_async_cb cb;
    void *user;
    atomic_bool cancel;
    int rc;
    char errmsg[REDSEM__ERRMSG_LEN];
    redsem_permit *permit;
    redsem_status *status;
    /* a parked acquire: its loop's state, and how its last wait ended */
    struct redsem_async *async;
    redsem__acq_state *park;
    int wait_rc;
    bool wait_signaled;
    char wait_err[REDSEM__ERRMSG_LEN];
    atomic_bool *loop_cancel; /* an acquire on the loop engine: its cancel flag */
    int loop_script;          /* a call on the loop engine: its script */
} op;

typedef struct op_list {
    op *head, *tail;
} op_list;

typedef struct worker_slot {
    pthread_t t;
    bool used, exited;
    /* idle: on the idle stack (next_idle below it), asleep on cv until popped (woken) */
    pthread_cond_t cv;
    bool woken;
    struct worker_slot *next_idle;
} worker_slot;

struct redsem_async {
    redsem_client *c;
    pid_t pid;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    op_list quick, waiting, running, done, delivering;
    op_list parked; /* acquires whose wait is registered in the shared wait */
    op_list resume; /* parked acquires whose wait ended: they go on before new ones */
    worker_slot slots[REDSEM_ASYNC_WORKERS_MAX];
    int nworkers, nwaiting_running, nparked;
    /* idle workers: asleep or woken and not yet at work (maybe_spawn counts them) */
    int nidle;
    /* the idle ones still asleep, the last to go idle on top: work wakes the top one, so
     * that only as many workers as the work needs keep busy and the rest end after
     * WORKER_IDLE_MS (with one shared condition variable a wake-up reached any of them and
     * kept every one alive, so the pool was trimmed by ending workers at once, and under
     * load threads were started and ended thousands of times a second) */
    worker_slot *idle_top;
    bool expiry_moved;    /* expiry_ns came earlier since a worker last went to sleep */
    int nwatching;        /* sleeping workers that went to sleep with a deadline queued */
    int nstarted; /* waiting acquires started and not finished (parked ones included) */
    int nstarted_own; /* those of them with a list of their own */
    int lead_requests; /* need_lead() calls not yet taken by a worker */
    /* no unstarted waiting acquire's deadline comes before this (INT64_MAX: none known) */
    int64_t expiry_ns;
    op lead_op;        /* what take() returns for them */
    bool closing, notified;
    /* set by redsem_async_free(): a worker leading the client's shared wait for parked
     * acquires (maybe of another redsem_async of the same client) hands the lead on */
    atomic_bool stopping;
    int pipefd[2];
    redsem_async_socket_fn socket_fn;
    redsem_async_timer_fn timer_fn;
    void *loop_data;
    bool loop_set;
    uint64_t next_id;
    atomic_size_t pending;
#if REDSEM_ASYNC_LOOP
    /* The loop engine (drive_loop.c): the loop watches epfd, an epoll set of the pipe and
     * the engine's descriptors (its connections, and while one opens c-ares' sockets: one
     * descriptor for the loop, as 0.4's adapters watch), and of a timerfd at the engine's
     * deadline (tfd). loop NULL: every operation on the workers. */
    int epfd;
    redsem__loop *loop;
    int loop_fd[REDSEM__LOOP_WATCH_MAX];      /* the descriptors in the set (-1: none) */
    uint32_t loop_ev[REDSEM__LOOP_WATCH_MAX]; /* and their epoll events */
    unsigned loop_gen;    /* the engine's connections' generation they are of */
    int64_t timer_ns;     /* the time tfd is armed at (0: disarmed, or it fired) */
    /* the engine's timer: a timerfd in the epoll set, so that epfd becomes readable when a
     * deadline is due (the loop's timer_fn is not used: docs/design.md 16) */
    int tfd;
    op_list looping;      /* acquires on the engine */
    /* submitted outside a callback of redsem_async_action() (another thread, or the loop's
     * own between two reports): started by the loop's next report (loop_take), in order */
    op_list incoming;
    redsem__renewer *renewer; /* renews the permits granted on the engine (renew.c) */
#endif
};

#if REDSEM_ASYNC_LOOP
/* The redsem_async whose redsem_async_action() runs on this thread (NULL: none): an
 * operation started from one of its callbacks starts on the engine at once. */
static _Thread_local redsem_async *acting;
#endif

static void list_push(op_list *l, op *o)
{
    o->next = NULL;
    if (l->tail != NULL)
        l->tail->next = o;
    else
        l->head = o;
    l->tail = o;
}

static op *list_pop(op_list *l)
{
    op *o = l->head;
    if (o != NULL) {
        l->head = o->next;
        if (l->head == NULL)
            l->tail = NULL;
        o->next = NULL;
    }
    return o;
}

static bool list_remove(op_list *l, op *o)
{
    op *prev = NULL;
    for (op *x = l->head; x != NULL; prev = x, x = x->next) {
        if (x != o)
            continue;
        if (prev != NULL)
            prev->next = x->next;
        else
            l->head = x->next;
        if (l->tail == x)
            l->tail = prev;
        x->next = NULL;
        return true;
    }
    return false;
}

static op *list_find(const op_list *l, uint64_t id)
{
    for (op *x = l->head; x != NULL; x = x->next)
        if (x->id == id)
            return x;
    return NULL;
}

/* One byte on the pipe: the loop reports (a full pipe, EAGAIN, is fine: it has one). */
static void ring(redsem_async *a)
{
    char b = 1;
    ssize_t w;
    do
        w = write(a->pipefd[1], &b, 1);
    while (w < 0 && errno == EINTR);
}

/* Under mu: ring, unless the loop was told since its last report (redsem_async_action()
 * then looks at the done list, and the incoming one, before it returns). */
static void notify(redsem_async *a)
{
    if (!a->notified) {
        a->notified = true;
        ring(a);
    }
}

/* Under mu: o is done; tell the loop if the done list was empty. */
static void finish(redsem_async *a, op *o)
{
    o->state = ST_DONE;
    if (o->kind == OP_WAKE_CANCELLED) {
        redsem__free(o);
        return;
    }
    list_push(&a->done, o);
    notify(a);
}

/* Under mu: o, not started (or given up), ends with REDSEM_ECANCELED. */
static void drop(redsem_async *a, op *o, const char *why)
{
    atomic_store(&o->cancel, true);
    o->rc = REDSEM_ECANCELED;
    redsem__text_copy(o->errmsg, why);
    finish(a, o);
}

/* What is left of o's timeout (o->deadline_ns set), in ms: 0 at or after its deadline. */
static int64_t time_left_ms(const op *o)
{
    int64_t left = o->deadline_ns - redsem__now_ns();
    return left <= 0 ? 0 : (left + REDSEM__NS_PER_MS - 1) / REDSEM__NS_PER_MS;
}

/* The blocking twin of o, on this worker thread. */
static void run(redsem_async *a, op *o)
{
    redsem_client *c = a->c;
    int rc = REDSEM_OK;
    redsem__cancel = o->waits ? &o->cancel : NULL;
    redsem__park_slot = o->waits ? &o->park : NULL;
    if (o->park != NULL) {
        /* a parked acquire whose wait ended: its loop goes on here */
        if (o->wait_rc != REDSEM_OK)
            redsem__text_copy(redsem__errbuf(c), o->wait_err);
        o->park->wait_rc = o->wait_rc;
        o->park->signaled = o->wait_signaled;
        rc = redsem__acquire_resume(o->park, &o->permit);
        goto out;
    }
    int64_t timeout_ms = o->timeout_ms;
    if (o->deadline_ns > 0) {
        /* the timeout counts from the submission: what is left of it (an acquire started
         * at its deadline makes one attempt, as a try-acquire) */
        timeout_ms = time_left_ms(o);
        o->late = timeout_ms == 0;
    }
    switch (o->kind) {
    case OP_SEM_ACQUIRE:
        rc = timeout_ms == 0
                 ? redsem_sem_try_acquire_n(o->handle, o->n, &o->permit)
                 : redsem_sem_acquire_n(o->handle, o->n, timeout_ms, &o->permit);
        break;
    case OP_LOCK_ACQUIRE:
        rc = timeout_ms == 0 ? redsem_lock_try_acquire(o->handle, &o->permit)
                             : redsem_lock_acquire(o->handle, timeout_ms, &o->permit);
        break;
    case OP_REFRESH:
        rc = redsem_permit_refresh(o->handle);
        break;
    case OP_RELEASE:
        rc = redsem_permit_release(o->handle);
        break;
    case OP_SEM_STATUS:
        rc = redsem_sem_status(o->handle, o->max_entries, &o->status);
        break;
    case OP_LOCK_STATUS:
        rc = redsem_lock_status(o->handle, o->max_entries, &o->status);
        break;
    case OP_WAKE_CANCELLED:
        redsem__wake_cancelled(c);
        break;
    case OP_LEAD:
        redsem__wake_lead(c, &a->stopping);
        break;
    }
out:
    redsem__cancel = NULL;
    redsem__park_slot = NULL;
    o->rc = rc;
    if (rc == REDSEM_EBUSY && o->late)
        snprintf(o->errmsg, sizeof o->errmsg,
                 "no permit free at the deadline (the acquire waited its whole timeout, "
                 "%lld ms, for its turn to start behind other waiting acquires of this "
                 "redsem_async; one try was made)",
                 (long long)o->timeout_ms);
    else if (rc != REDSEM_OK && rc != REDSEM__PARKED)
        redsem__text_copy(o->errmsg, redsem_client_errmsg(c));
}

/* Under mu: a waiting acquire that could not start (as many as may be are under way: see
 * head_may_start) and whose deadline has passed, taken out of the waiting queue to run as one try-acquire: it never
 * waits, so it is not counted as under way (a try never parks). NULL if none. Scans the
 * queue only once a known deadline has passed. */
static op *take_expired(redsem_async *a)
{
    if (a->waiting.head == NULL || a->expiry_ns == INT64_MAX)
        return NULL;
    int64_t now = redsem__now_ns();
    if (now < a->expiry_ns)
        return NULL;
    op *found = NULL;
    int64_t next = INT64_MAX;
    for (op *x = a->waiting.head; x != NULL; x = x->next) {
        if (x->deadline_ns == 0)
            continue;
        if (found == NULL && x->deadline_ns <= now)
            found = x;
        else if (x->deadline_ns < next)
            next = x->deadline_ns;
    }
    a->expiry_ns = next;
    if (found != NULL) {
        list_remove(&a->waiting, found);
        found->waits = false;
    }
    return found;
}

/* Under mu: whether the first queued waiting acquire may start (the queue is FIFO: the ones
 * behind it wait for it). */
static bool head_may_start(const redsem_async *a)
{
    const op *h = a->waiting.head;
    return h != NULL && a->nstarted < ASYNC_WAITS_ALL &&
           (!h->own_list || a->nstarted_own < ASYNC_WAITS_MAX);
}

/* Under mu: the next operation a worker may take (quick ones first). */
static op *take(redsem_async *a)
{
    if (a->lead_requests > 0) {
        a->lead_requests = 0;
        return &a->lead_op;
    }
    op *o = list_pop(&a->quick);
    if (o == NULL)
        o = take_expired(a);
    if (o == NULL && a->nwaiting_running < REDSEM_ASYNC_WORKERS_MAX - 1) {
        o = list_pop(&a->resume);
        if (o == NULL && head_may_start(a)) {
            o = list_pop(&a->waiting);
            a->nstarted++;
            a->nstarted_own += o->own_list;
        }
        if (o != NULL)
            a->nwaiting_running++;
    }
    return o;
}

static void *worker_main(void *arg);

/* Under mu: wake the worker that went idle last, if one sleeps (work was queued). */
static void wake_worker(redsem_async *a)
{
    worker_slot *s = a->idle_top;
    if (s == NULL)
        return;
    a->idle_top = s->next_idle;
    s->next_idle = NULL;
    s->woken = true;
    pthread_cond_signal(&s->cv);
}

/* Under mu: wake every sleeping worker, and redsem_async_free() waiting on work_cv. */
static void wake_all(redsem_async *a)
{
    while (a->idle_top != NULL)
        wake_worker(a);
    pthread_cond_broadcast(&a->work_cv);
}

/* Under mu: whether an acquire waits in the queue with a deadline a worker must take it at
 * (take_expired). */
static bool deadline_queued(const redsem_async *a)
{
    return a->waiting.head != NULL && a->expiry_ns != INT64_MAX;
}

/* Under mu, from a worker that stops sleeping for good or for a while (it ends, or takes
 * work): if it watched a queued deadline (it slept until it), or the sleeping workers may
 * not know the earliest one (expiry_moved), wake another to watch it. The sleeping workers'
 * wake-up times were set when each went to sleep: without this, a deadline queued after
 * they did could be seen by none of them until their idle end, up to 2 s late. */
static void pass_watch(redsem_async *a, bool *watching)
{
    /* another sleeper that watches it (it went to sleep after the deadline was queued,
     * and none came earlier since) is enough */
    bool need = ((*watching && a->nwatching == 0) || a->expiry_moved) && deadline_queued(a);
    *watching = false;
    a->expiry_moved = false;
    if (need)
        wake_worker(a);
}

/* Under mu: start a worker if work may be left without one. */
static void maybe_spawn(redsem_async *a)
{
    /* a queued waiting acquire with a deadline needs a worker to take it at that deadline
     * even if it may not start before (take_expired): say, when every other worker runs a
     * waiting acquire that holds it (a cluster client's waits are not parked) */
    bool work = a->quick.head != NULL || a->lead_requests > 0 ||
                (a->waiting.head != NULL && a->expiry_ns != INT64_MAX) ||
                (a->nwaiting_running < REDSEM_ASYNC_WORKERS_MAX - 1 &&
                 (a->resume.head != NULL || head_may_start(a)));
    /* also while closing: parked acquires come back to leave their queues */
    if (!work || a->nidle > 0 || a->nworkers >= REDSEM_ASYNC_WORKERS_MAX)
        return;
    for (int i = 0; i < REDSEM_ASYNC_WORKERS_MAX; i++) {
        worker_slot *s = &a->slots[i];
        if (s->used && !s->exited)
            continue;
        if (s->used) { /* an idle worker that ended: reap it (it has unlocked mu for good) */
            pthread_join(s->t, NULL);
            s->used = false;
        }
        s->exited = false;
        /* Workers take no signals, as the renewer: they keep going to the application's
         * threads (since 0.4.6; a process-directed signal could land on a worker before). */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int prc = pthread_create(&s->t, NULL, worker_main, a);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (prc == 0) {
            s->used = true;
            a->nworkers++;
        }
        /* on failure the work waits for a running worker (there is one unless nworkers 0:
         * then the next submit or finish tries again) */
        return;
    }
}

/* The shared wait's callback (wake.c, under its lock, on its leader's thread): the parked
 * acquire's wait ended; queue it to go on, ahead of the acquires not started yet. */
static void on_woken(void *arg, int rc, bool signaled)
{
    op *o = arg;
    redsem_async *a = o->async;
    pthread_mutex_lock(&a->mu);
    o->wait_rc = rc;
    o->wait_signaled = signaled;
    list_remove(&a->parked, o);
    a->nparked--;
    o->state = ST_QUEUED;
    list_push(&a->resume, o);
    if (a->closing)
        wake_all(a); /* redsem_async_free() waits for nparked 0 */
    else
        wake_worker(a);
    maybe_spawn(a);
    pthread_mutex_unlock(&a->mu);
}

/* The shared wait's callback when its lead must pass and only parked waits are left: a
 * worker takes it, unless this redsem_async is being freed (then another owner is asked). */
static bool need_lead(void *arg)
{
    op *o = arg;
    redsem_async *a = o->async;
    if (atomic_load(&a->stopping))
        return false;
    pthread_mutex_lock(&a->mu);
    a->lead_requests++;
    wake_worker(a);
    maybe_spawn(a);
    pthread_mutex_unlock(&a->mu);
    return true;
}

/* Under mu, after run() said REDSEM__PARKED: register o's wait (a->mu released meanwhile; the
 * worker may lead the shared wait for a while, counted as running a waiting operation until
 * it returns) and leave o to the shared wait. */
static void park(redsem_async *a, op *o)
{
    list_remove(&a->running, o);
    o->state = ST_PARKED;
    o->wait_err[0] = '\0';
    list_push(&a->parked, o);
    a->nparked++;
    const redsem__acq_state *s = o->park;
    const char *key = s->wkey;
    size_t keylen = s->keylen;
    const char *elem = s->q.wake_meta != NULL ? s->elem : NULL;
    int64_t wait_ms = s->wait_ms, cut_ns = s->cut_ns, since_ns = s->since_ns;
    redsem__wake_grant *grant = &o->park->grant; /* written by the wait, read on resuming */
    pthread_mutex_unlock(&a->mu);
    /* from the registration on, o may be woken and go on on another worker: not touched here
     * after this call (wake.c copies the key before registering) */
    int rc = redsem__wake_park(a->c, key, keylen, elem, wait_ms, cut_ns, since_ns, &o->cancel,
                               o->wait_err, grant, on_woken, need_lead, o, &a->stopping);
    if (rc != REDSEM_OK) {
        /* not registered: cancelled already (1: its loop sees the flag), its wake-up came
         * already (2), or out of memory */
        if (rc == REDSEM_ENOMEM)
            redsem__text_copy(o->wait_err, "out of memory (a parked wait)");
        on_woken(o, rc == 1 || rc == 2 ? REDSEM_OK : rc, rc == 2);
    }
    pthread_mutex_lock(&a->mu);
    a->nwaiting_running--;
}

static worker_slot *my_slot(redsem_async *a)
{
    for (int i = 0; i < REDSEM_ASYNC_WORKERS_MAX; i++)
        if (a->slots[i].used && pthread_equal(a->slots[i].t, pthread_self()))
            return &a->slots[i];
    return NULL;
}

static void *worker_main(void *arg)
{
    redsem_async *a = arg;
    int64_t idle_until = 0; /* idle since then + WORKER_IDLE_MS: end (0: not idle) */
    bool watching = false;  /* its last sleep was until a queued acquire's deadline */
    pthread_mutex_lock(&a->mu);
    /* maybe_spawn() held mu around pthread_create: the slot records this thread now */
    worker_slot *me = my_slot(a);
    for (;;) {
        op *o = take(a);
        if (o != NULL) { /* at work: no longer idle, nor watching a deadline */
            idle_until = 0;
            pass_watch(a, &watching);
        }
        if (o == &a->lead_op) {
            /* leading may last: it counts as a waiting operation, so that one worker stays
             * for the quick ones, and queued work may need another worker */
            a->nwaiting_running++;
            maybe_spawn(a);
            pthread_mutex_unlock(&a->mu);
            redsem__wake_lead(a->c, &a->stopping);
            pthread_mutex_lock(&a->mu);
            a->nwaiting_running--;
            continue;
        }
        if (o == NULL) {
            if (a->closing && a->nparked == 0)
                break;
            int64_t now = redsem__now_ns();
            if (idle_until == 0)
                idle_until = now + WORKER_IDLE_MS * REDSEM__NS_PER_MS;
            int64_t linger_end =
                idle_until - (WORKER_IDLE_MS - WORKER_LINGER_MS) * REDSEM__NS_PER_MS;
            /* others idle now: they take what comes (a queued acquire's deadline too: an
             * ending worker wakes one of them to watch it, pass_watch) */
            bool others = a->nidle >= WORKERS_IDLE_KEEP;
            bool queued = a->quick.head != NULL || a->waiting.head != NULL ||
                          a->resume.head != NULL || a->lead_requests > 0;
            /* End: idle for WORKER_LINGER_MS with others idle, or for WORKER_IDLE_MS unless
             * work it may not take yet is queued and fewer others are idle (then it idles
             * anew, not in a spin: a queued acquire's deadline needs a worker then). Rounds of
             * parked acquires' wake-ups (their backoffs ending together) each take as many
             * workers as the round has wake-ups, which end 50 ms later: with 1,000 parked
             * acquires about 370 started a second (0.4.3: 410). Keeping them longer would
             * keep a pool as large as the largest round of the last while acquires wait
             * (async/waiting_acquires_hold_no_thread_* allows 4 threads more for 40). */
            if ((now >= linger_end && others) || (now >= idle_until && (!queued || others))) {
                pass_watch(a, &watching);
                break;
            }
            if (now >= idle_until)
                idle_until = now + WORKER_IDLE_MS * REDSEM__NS_PER_MS;
            /* asleep on the idle stack until work wakes it (the last to go idle first), or
             * the first deadline of an acquire that cannot start yet, or its idle end */
            int64_t wake = a->waiting.head != NULL && a->expiry_ns < idle_until ? a->expiry_ns
                                                                                 : idle_until;
            if (now < linger_end && linger_end < wake)
                wake = linger_end;
            struct timespec ts = {(time_t)(wake / 1000000000), (long)(wake % 1000000000)};
            /* it wakes by the earliest queued deadline (or earlier, to look again): it
             * watches it, and passes that on if it ends or takes work first */
            watching = deadline_queued(a);
            if (watching) {
                a->expiry_moved = false;
                a->nwatching++;
            }
            me->woken = false;
            me->next_idle = a->idle_top;
            a->idle_top = me;
            a->nidle++;
            while (!me->woken && redsem__now_ns() < wake)
                pthread_cond_timedwait(&me->cv, &a->mu, &ts);
            a->nidle--;
            if (watching)
                a->nwatching--; /* awake: no longer a sleeper that watches */
            if (!me->woken) { /* not popped: take itself off the stack */
                worker_slot **p = &a->idle_top;
                while (*p != NULL && *p != me)
                    p = &(*p)->next_idle;
                if (*p == me)
                    *p = me->next_idle;
                me->next_idle = NULL;
            }
            continue;
        }
        o->state = ST_RUNNING;
        list_push(&a->running, o);
        maybe_spawn(a); /* more queued work, no idle worker: grow */
        pthread_mutex_unlock(&a->mu);
        run(a, o);
        pthread_mutex_lock(&a->mu);
        if (o->rc == REDSEM__PARKED) {
            park(a, o);
            continue;
        }
        if (atomic_load(&o->cancel) && o->waits) {
            /* cancelled: a permit granted meanwhile goes back */
            if (o->rc == REDSEM_OK && o->permit != NULL) {
                pthread_mutex_unlock(&a->mu);
                (void)redsem_permit_release(o->permit);
                redsem_permit_free(o->permit);
                pthread_mutex_lock(&a->mu);
                o->permit = NULL;
            }
            /* an unknown outcome stays what it is: the acquire may hold a permit (until its
             * lease ends), which the caller must be told */
            if (o->rc != REDSEM_EUNKNOWN) {
                o->rc = REDSEM_ECANCELED;
                redsem__text_copy(o->errmsg, "cancelled");
            }
        }
        list_remove(&a->running, o);
        if (o->waits) {
            a->nwaiting_running--;
            a->nstarted--;
            a->nstarted_own -= o->own_list;
        }
        finish(a, o);
    }
    a->nworkers--;
    me->exited = true;
    pthread_cond_broadcast(&a->work_cv); /* redsem_async_free() waits for nworkers 0 */
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

int redsem_async_new(redsem_client *client, redsem_async **ret_async)
{
    if (ret_async == NULL || client == NULL)
        return client != NULL ? redsem__set_err(client, REDSEM_EINVAL, "ret_async is NULL")
                              : REDSEM_EINVAL;
    int rc = redsem__check_owner(client);
    if (rc != REDSEM_OK)
        return rc;
    redsem_async *a = redsem__calloc(1, sizeof *a);
    if (a == NULL)
        return redsem__set_err(client, REDSEM_ENOMEM, "out of memory");
    if (pipe2(a->pipefd, O_NONBLOCK | O_CLOEXEC) != 0) {
        int e = errno;
        redsem__free(a);
        return redsem__set_err(client, REDSEM_ECONN, "pipe: %s", strerror(e));
    }
#if REDSEM_ASYNC_LOOP
    a->epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event pe = {.events = EPOLLIN, .data.fd = a->pipefd[0]};
    if (a->epfd < 0 || epoll_ctl(a->epfd, EPOLL_CTL_ADD, a->pipefd[0], &pe) != 0) {
        int e = errno;
        if (a->epfd >= 0)
            close(a->epfd);
        close(a->pipefd[0]);
        close(a->pipefd[1]);
        redsem__free(a);
        return redsem__set_err(client, REDSEM_ECONN, "epoll: %s", strerror(e));
    }
    for (int j = 0; j < REDSEM__LOOP_WATCH_MAX; j++)
        a->loop_fd[j] = -1;
    a->tfd = -1;
#endif
    a->c = client;
    a->pid = getpid();
    pthread_mutex_init(&a->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->work_cv, &ca);
    for (int i = 0; i < REDSEM_ASYNC_WORKERS_MAX; i++)
        pthread_cond_init(&a->slots[i].cv, &ca);
    pthread_condattr_destroy(&ca);
    a->next_id = 1;
    a->expiry_ns = INT64_MAX;
    atomic_init(&a->pending, 0);
    atomic_init(&a->stopping, false);
    a->lead_op.kind = OP_LEAD;
    a->lead_op.async = a;
    atomic_init(&a->lead_op.cancel, false);
    *ret_async = a;
    return REDSEM_OK;
}

#if REDSEM_ASYNC_LOOP
static int loop_timerfd_new(redsem_async *a);
#endif

int redsem_async_set_loop(redsem_async *async, redsem_async_socket_fn socket_fn,
                          redsem_async_timer_fn timer_fn, void *loop_data)
{
    if (async == NULL || socket_fn == NULL)
        return async != NULL ? redsem__set_err(async->c, REDSEM_EINVAL, "socket_fn is NULL")
                             : REDSEM_EINVAL;
    if (async->pid != getpid()) /* its mutex may have been held by a thread of the parent */
        return redsem__set_err(async->c, REDSEM_EFORKED,
                               "this redsem_async was created by process %ld (after fork)",
                               (long)async->pid);
#if REDSEM_ASYNC_LOOP
    /* the engine takes the operations of every client (one server, Sentinel, Cluster), its timer a
     * timerfd in the epoll set (timer_fn given or not); made before the loop is published, since other
     * threads may submit from then on */
    redsem_client *c = async->c;
    redsem__loop *engine = NULL;
    redsem__renewer *renewer = NULL;
    int tfd = -1;
    if ((c->ep.kind == REDSEM__EP_TCP || c->ep.kind == REDSEM__EP_UNIX ||
         c->ep.kind == REDSEM__EP_SENTINEL || c->ep.kind == REDSEM__EP_CLUSTER) &&
        redsem__loop_new(c, &engine) != REDSEM_OK)
        engine = NULL;
    if (engine != NULL && ((tfd = loop_timerfd_new(async)) < 0 ||
                           redsem__renew_loop_new(c, async->pipefd[1], &renewer) != REDSEM_OK)) {
        redsem__loop_free(engine);
        engine = NULL;
    }
#endif
    pthread_mutex_lock(&async->mu);
    bool was = async->loop_set;
    if (!was) {
        async->socket_fn = socket_fn;
        async->timer_fn = timer_fn;
        async->loop_data = loop_data;
        async->loop_set = true;
#if REDSEM_ASYNC_LOOP
        async->loop = engine;
        async->renewer = renewer;
        async->tfd = engine != NULL ? tfd : -1;
        if (engine != NULL)
            tfd = -1;
        engine = NULL;
        renewer = NULL;
#endif
    }
    pthread_mutex_unlock(&async->mu);
#if REDSEM_ASYNC_LOOP
    redsem__loop_free(engine);
    if (renewer != NULL) { /* off the client's list of loop renewers, then freed */
        redsem__renew_loop_close(renewer);
        redsem__renew_loop_put(renewer);
    }
    if (tfd >= 0) { /* not taken */
        (void)epoll_ctl(async->epfd, EPOLL_CTL_DEL, tfd, NULL);
        close(tfd);
    }
#endif
    if (was)
        return redsem__set_err(async->c, REDSEM_ESTATE, "a loop is set already");
#if REDSEM_ASYNC_LOOP
    socket_fn(async, async->epfd, REDSEM_WATCH_IN, loop_data);
#else
    socket_fn(async, async->pipefd[0], REDSEM_WATCH_IN, loop_data);
#endif
    if (timer_fn != NULL)
        timer_fn(async, -1, loop_data);
    return REDSEM_OK;
}

/* Run the callbacks of the done list; returns how many ran. */
static int run_callbacks(redsem_async *a)
{
    pthread_mutex_lock(&a->mu);
    /* taken over as a whole (what finishes from now on waits for the next report), but
     * popped one by one under mu, so that a cancel from a callback finds its sibling still
     * delivering (REDSEM_ESTATE) */
    if (a->delivering.tail != NULL) {
        a->delivering.tail->next = a->done.head;
        if (a->done.tail != NULL)
            a->delivering.tail = a->done.tail;
    } else {
        a->delivering = a->done;
    }
    a->done.head = a->done.tail = NULL;
    a->notified = false;
    char buf[64];
    while (read(a->pipefd[0], buf, sizeof buf) > 0)
        ;
    pthread_mutex_unlock(&a->mu);
    int k = 0;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        op *o = list_pop(&a->delivering);
        pthread_mutex_unlock(&a->mu);
        if (o == NULL)
            break;
        redsem_result r = {o->id, o->rc, o->rc == REDSEM_OK ? "" : o->errmsg, o->permit,
                           o->status};
        o->cb(a, &r, o->user);
        atomic_fetch_sub(&a->pending, 1);
        redsem__free(o);
        k++;
    }
    return k;
}

#if REDSEM_ASYNC_LOOP
/* ---------------------------------------------------------------- the loop engine */

/* A timerfd in a's epoll set (the engine's timer), or -1. */
static int loop_timerfd_new(redsem_async *a)
{
    int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
    if (fd >= 0 && epoll_ctl(a->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Set the engine's timer to `at` (redsem__now_ns()'s clock, CLOCK_MONOTONIC; 0: none): the
 * timerfd armed at that time (one in the past fires at once; re-arming clears an expiry not
 * read yet), or disarmed. The loop's thread. */
static void loop_timer(redsem_async *a, int64_t at)
{
    struct itimerspec its = {.it_value = {(time_t)(at / 1000000000), (long)(at % 1000000000)}};
    (void)timerfd_settime(a->tfd, TFD_TIMER_ABSTIME, &its, NULL); /* fails on bad args only */
}

/* Whether the timerfd fired since it was armed (reading it ends its readiness). */
static bool loop_timer_fired(redsem_async *a)
{
    uint64_t expirations;
    return read(a->tfd, &expirations, sizeof expirations) == sizeof expirations;
}

/* Tell the loop what the engine wants now: its descriptors in the epoll set with the events
 * they wait for, and its earliest deadline on the timerfd in the set. The loop's thread. */
static void loop_sync(redsem_async *a)
{
    redsem__loop_watch w[REDSEM__LOOP_WATCH_MAX];
    int64_t deadline = REDSEM__FOREVER;
    int n = redsem__loop_wants(a->loop, w, &deadline);
    int64_t renew_at = redsem__renew_loop_next(a->renewer, NULL);
    if (renew_at < deadline)
        deadline = renew_at;
    unsigned gen = redsem__loop_generation(a->loop);
    for (int j = 0; j < REDSEM__LOOP_WATCH_MAX; j++) { /* a registration no longer wanted, or of an old socket */
        bool wanted = false;
        for (int i = 0; i < n; i++)
            wanted = wanted || w[i].fd == a->loop_fd[j];
        if (a->loop_fd[j] >= 0 && (!wanted || gen != a->loop_gen)) {
            (void)epoll_ctl(a->epfd, EPOLL_CTL_DEL, a->loop_fd[j], NULL); /* may be closed */
            a->loop_fd[j] = -1;
            a->loop_ev[j] = 0;
        }
    }
    a->loop_gen = gen;
    for (int i = 0; i < n; i++) {
        uint32_t want = (w[i].events & POLLIN ? EPOLLIN : 0u) |
                        (w[i].events & POLLOUT ? EPOLLOUT : 0u);
        int j = -1; /* its slot, else a free one (every slot taken is wanted: one is) */
        for (int k = 0; k < REDSEM__LOOP_WATCH_MAX && (j < 0 || a->loop_fd[j] != w[i].fd); k++)
            if (a->loop_fd[k] == w[i].fd || (j < 0 && a->loop_fd[k] < 0))
                j = k;
        if (j < 0 || (a->loop_fd[j] == w[i].fd && a->loop_ev[j] == want))
            continue;
        struct epoll_event e = {.events = want, .data.fd = w[i].fd};
        if (epoll_ctl(a->epfd, EPOLL_CTL_ADD, w[i].fd, &e) != 0 && errno == EEXIST)
            (void)epoll_ctl(a->epfd, EPOLL_CTL_MOD, w[i].fd, &e);
        a->loop_fd[j] = w[i].fd;
        a->loop_ev[j] = want;
    }
    int64_t at = deadline == REDSEM__FOREVER ? 0 : deadline;
    if (at != a->timer_ns) {
        a->timer_ns = at;
        loop_timer(a, at);
    }
}

/* o, on the engine, ends: its callback is queued as a worker's would be. */
static void loop_end(op *o)
{
    redsem_async *a = o->async;
    pthread_mutex_lock(&a->mu);
    list_remove(&a->looping, o);
    finish(a, o);
    pthread_mutex_unlock(&a->mu);
}

static void loop_release_call(void *arg, redsem__call *call);
static int loop_release_reply(void *arg, int rc, const struct redisReply *r,
                              const redsem__req_info *info);

/* The permit of a cancelled acquire is given back: it reports REDSEM_ECANCELED. */
static void loop_given_back(void *arg, int rc, redsem_permit *unused)
{
    (void)rc;
    (void)unused;
    op *o = arg;
    redsem_permit_free(o->permit);
    o->permit = NULL;
    loop_end(o);
}

/* An operation on the engine is decided. An acquire cancelled meanwhile reports
 * REDSEM_ECANCELED (an unknown outcome stays REDSEM_EUNKNOWN), and a permit granted to it
 * at the last moment (leaving its queue) is first released on the engine, as a worker
 * releases it. */
static void loop_done(void *arg, int rc, redsem_permit *p)
{
    op *o = arg;
    redsem_async *a = o->async;
    o->rc = rc;
    o->permit = p;
    if (p != NULL) /* granted here: renewed here */
        redsem__renew_loop_adopt(a->renewer, p);
    if (rc != REDSEM_OK)
        redsem__text_copy(o->errmsg, redsem__errbuf(a->c));
    pthread_mutex_lock(&a->mu);
    o->loop_cancel = NULL;
    bool cancelled = o->waits && o->state != ST_DONE && atomic_load(&o->cancel) &&
                     rc != REDSEM_EUNKNOWN;
    o->state = ST_DONE; /* past cancelling */
    pthread_mutex_unlock(&a->mu);
    if (cancelled) {
        o->rc = REDSEM_ECANCELED;
        redsem__text_copy(o->errmsg, "cancelled");
        if (p != NULL) {
            o->handle = p; /* for loop_release_call */
            if (redsem__release_begin(p) == REDSEM_OK &&
                redsem__loop_call(a->loop, loop_release_call, loop_release_reply,
                                  loop_given_back, o) == REDSEM_OK)
                return;
            loop_given_back(o, REDSEM_OK, NULL); /* its lease lapses */
            return;
        }
    }
    loop_end(o);
}

/* A release on the engine: its permit's call, and its outcome. */
static void loop_release_call(void *arg, redsem__call *call)
{
    redsem_permit *p = ((op *)arg)->handle;
    p->kind->release_call(p->handle, p, call);
}

static int loop_release_reply(void *arg, int rc, const struct redisReply *r,
                              const redsem__req_info *info)
{
    redsem_permit *p = ((op *)arg)->handle;
    rc = p->kind->release_reply(p->client, p->handle, p, rc, r, info);
    return redsem__release_end(p, rc);
}

/* A refresh on the engine, and a status. */
static void loop_refresh_call(void *arg, redsem__call *call)
{
    op *o = arg;
    redsem__refresh_call(o->handle, call);
    o->loop_script = call->script;
}

static int loop_refresh_reply(void *arg, int rc, const struct redisReply *r,
                              const redsem__req_info *info)
{
    op *o = arg;
    redsem_permit *p = o->handle;
    int64_t sent = 0;
    rc = redsem__refresh_reply(p->client, p, o->loop_script, rc, r, info, &sent);
    return redsem__refresh_end(p, rc, sent);
}

static void loop_status_call(void *arg, redsem__call *call)
{
    op *o = arg;
    if (o->kind == OP_SEM_STATUS)
        redsem__sem_status_call(o->handle, redsem__sem_status_kind(o->handle), o->max_entries,
                                call);
    else
        redsem__lock_status_call(o->handle, o->max_entries, call);
}

static int loop_status_reply(void *arg, int rc, const struct redisReply *r,
                             const redsem__req_info *info)
{
    (void)info;
    op *o = arg;
    redsem_client *c = o->async->c;
    const char *key = o->kind == OP_SEM_STATUS ? ((redsem_sem *)o->handle)->k_meta
                                               : ((redsem_lock *)o->handle)->k_mutex;
    return rc != REDSEM_OK ? rc : redsem__status_from_reply(c, key, r, &o->status);
}

/* Start o, a call (release, refresh, status) on the engine (o on a->looping). */
static void loop_start_call(redsem_async *a, op *o)
{
    int rc = o->kind == OP_RELEASE   ? redsem__release_begin(o->handle)
             : o->kind == OP_REFRESH ? redsem__refresh_begin(o->handle)
                                     : redsem__check_owner(a->c);
    if (rc == REDSEM_OK && o->kind == OP_RELEASE)
        rc = redsem__loop_call(a->loop, loop_release_call, loop_release_reply, loop_done, o);
    else if (rc == REDSEM_OK && o->kind == OP_REFRESH)
        rc = redsem__loop_call(a->loop, loop_refresh_call, loop_refresh_reply, loop_done, o);
    else if (rc == REDSEM_OK)
        rc = redsem__loop_call(a->loop, loop_status_call, loop_status_reply, loop_done, o);
    if (rc != REDSEM_OK)
        loop_done(o, rc, NULL);
    loop_sync(a);
}

/* Start o, an acquire or a call, on the engine (o on a->looping). */
static void loop_start(redsem_async *a, op *o)
{
    if (o->kind != OP_SEM_ACQUIRE && o->kind != OP_LOCK_ACQUIRE) {
        loop_start_call(a, o);
        return;
    }
    pthread_mutex_lock(&a->mu);
    bool cancelled = atomic_load(&o->cancel); /* since loop_take took it: nothing sent */
    if (cancelled) {
        list_remove(&a->looping, o);
        drop(a, o, "cancelled before it started");
    }
    pthread_mutex_unlock(&a->mu);
    if (cancelled)
        return;
    redsem__acquirer q;
    const redsem__kind *kind = NULL;
    char id[REDSEM_ID_BUFSIZE];
    redsem_permit *unused = NULL;
    int64_t lease_ms, timeout_ms = o->timeout_ms;
    int rc;
    if (o->deadline_ns > 0 && (timeout_ms = time_left_ms(o)) == 0) {
        pthread_mutex_lock(&a->mu);
        o->waits = false; /* started at its deadline: one try, past cancelling */
        pthread_mutex_unlock(&a->mu);
    }
    if (o->kind == OP_SEM_ACQUIRE) {
        redsem_sem *s = o->handle;
        lease_ms = s->lease_ms;
        rc = redsem__sem_prepare(s, NULL, false, o->n, timeout_ms, &unused, &q, &kind, id);
    } else {
        redsem_lock *l = o->handle;
        lease_ms = l->lease_ms;
        rc = redsem__lock_prepare(l, NULL, false, timeout_ms, &unused, &q, &kind, id);
    }
    atomic_bool *cancel = NULL;
    if (rc == REDSEM_OK)
        rc = redsem__loop_acquire(a->loop, &q, kind, id, timeout_ms, lease_ms, o->submit_ns,
                                  loop_done, o, &cancel);
    if (rc != REDSEM_OK)
        loop_done(o, rc, NULL);
    pthread_mutex_lock(&a->mu);
    if (o->state != ST_DONE) { /* under way: a cancel reaches it through the engine's flag */
        o->loop_cancel = cancel;
        if (atomic_load(&o->cancel))
            atomic_store(cancel, true);
    }
    pthread_mutex_unlock(&a->mu);
    loop_sync(a);
}

/* Start the operations submitted outside the loop's report (submit), in their order: those
 * queued when it began (one that other threads keep queuing does not hold the loop; the
 * later ones have rung the pipe). The loop's thread. */
static void loop_take(redsem_async *a)
{
    pthread_mutex_lock(&a->mu);
    size_t n = 0;
    for (const op *x = a->incoming.head; x != NULL; x = x->next)
        n++;
    pthread_mutex_unlock(&a->mu);
    for (; n > 0; n--) {
        pthread_mutex_lock(&a->mu);
        op *o = list_pop(&a->incoming); /* NULL: cancelled meanwhile */
        if (o != NULL) {
            o->state = ST_RUNNING;
            list_push(&a->looping, o);
        }
        pthread_mutex_unlock(&a->mu);
        if (o == NULL)
            break;
        loop_start(a, o);
    }
}

/* The loop's report on epfd: start what was queued, step the engine (its timer is the
 * timerfd in the set), then run the callbacks (what they start begins at once). */
static int loop_action(redsem_async *a, int fd)
{
    redsem_async *outer = acting;
    acting = a;
    loop_take(a);
    (void)fd; /* the epoll set, or -1: a timer of the loop's (none is asked for) */
    if (loop_timer_fired(a))
        a->timer_ns = 0; /* it fired: the next sync arms it again */
    struct epoll_event ev[REDSEM__LOOP_WATCH_MAX + 2];
    struct pollfd ready[REDSEM__LOOP_WATCH_MAX + 2];
    int n = epoll_wait(a->epfd, ev, REDSEM__LOOP_WATCH_MAX + 2, 0), k = 0;
    for (int i = 0; i < n; i++)
        if (ev[i].data.fd != a->pipefd[0] && ev[i].data.fd != a->tfd)
            ready[k++] = (struct pollfd){
                .fd = ev[i].data.fd,
                .revents = (short)((ev[i].events & EPOLLIN ? POLLIN : 0) |
                                   (ev[i].events & EPOLLOUT ? POLLOUT : 0) |
                                   (ev[i].events & (EPOLLHUP | EPOLLERR) ? POLLERR : 0))};
    redsem__renew_loop_run(a->renewer, a->loop); /* the renewals due, written by the step */
    redsem__loop_step(a->loop, ready, k);
    loop_sync(a);
    int done = run_callbacks(a);
    loop_take(a); /* queued meanwhile: run_callbacks() may have read their byte */
    acting = outer;
    return done;
}

/* Under mu: cancel operation id if it is the engine's (1 if not). One not started yet is
 * dropped (nothing sent); a waiting acquire under way gets its flag (its next step sees it:
 * a wait ends at once) and the pipe's byte makes the loop report soon; a call (release,
 * refresh, status), a try-acquire and a decided acquire are past cancelling. */
static int loop_cancel(redsem_async *a, uint64_t id)
{
    op *o = list_find(&a->incoming, id);
    if (o != NULL) {
        list_remove(&a->incoming, o);
        drop(a, o, "cancelled before it started");
        return REDSEM_OK;
    }
    if ((o = list_find(&a->looping, id)) == NULL)
        return 1;
    if (!o->waits || o->state == ST_DONE)
        return REDSEM_ESTATE;
    atomic_store(&o->cancel, true);
    if (o->loop_cancel != NULL) /* NULL: being started; loop_start passes the flag on */
        atomic_store(o->loop_cancel, true);
    ring(a);
    return REDSEM_OK;
}

/* redsem_async_free(): no more operations are taken (REDSEM_ESTATE), those not started are
 * dropped, the waiting acquires on the engine are cancelled, and all are stepped until they
 * end (one leaves its queue first), for two command timeouts at most; those still under way
 * then end with REDSEM_ECANCELED. */
static void loop_stop(redsem_async *a)
{
    redsem__renew_loop_close(a->renewer); /* renewals in flight end below */
    pthread_mutex_lock(&a->mu);
    a->closing = true;
    for (op *o; (o = list_pop(&a->incoming)) != NULL;)
        drop(a, o, "cancelled: the redsem_async was freed");
    for (op *o = a->looping.head; o != NULL; o = o->next)
        if (o->waits && o->state != ST_DONE) { /* a release goes on, and a try */
            atomic_store(&o->cancel, true);
            if (o->loop_cancel != NULL)
                atomic_store(o->loop_cancel, true);
        }
    pthread_mutex_unlock(&a->mu);
    int64_t end = redsem__now_ns() + 2 * a->c->command_timeout_ms * REDSEM__NS_PER_MS;
    bool busy; /* renewals in flight */
    (void)redsem__renew_loop_next(a->renewer, &busy);
    while ((a->looping.head != NULL || busy) && redsem__now_ns() < end) {
        redsem__loop_watch w[REDSEM__LOOP_WATCH_MAX];
        int64_t deadline;
        struct pollfd p[REDSEM__LOOP_WATCH_MAX];
        int n = redsem__loop_wants(a->loop, w, &deadline);
        for (int i = 0; i < n; i++)
            p[i] = (struct pollfd){.fd = w[i].fd, .events = w[i].events};
        int k = poll(p, (nfds_t)n, 10);
        redsem__loop_step(a->loop, p, k > 0 ? n : 0);
        (void)redsem__renew_loop_next(a->renewer, &busy);
    }
    pthread_mutex_lock(&a->mu);
    redsem__loop *engine = a->loop;
    a->loop = NULL;
    for (op *o = a->looping.head; o != NULL; o = o->next)
        o->loop_cancel = NULL; /* before their engine goes (a cancel may come meanwhile) */
    pthread_mutex_unlock(&a->mu);
    redsem__loop_free(engine); /* the acquires left end without their engine callbacks */
    redsem__renew_loop_put(a->renewer);
    a->renewer = NULL;
    pthread_mutex_lock(&a->mu);
    for (op *o; (o = list_pop(&a->looping)) != NULL;) {
        redsem_permit_free(o->permit); /* one being given back: its lease lapses */
        o->permit = NULL;
        drop(a, o, "cancelled: the redsem_async was freed");
    }
    pthread_mutex_unlock(&a->mu);
    for (int j = 0; j < REDSEM__LOOP_WATCH_MAX; j++)
        if (a->loop_fd[j] >= 0)
            (void)epoll_ctl(a->epfd, EPOLL_CTL_DEL, a->loop_fd[j], NULL);
    loop_timer(a, 0); /* the set stays quiet until the loop is told REDSEM_WATCH_REMOVE */
}
#endif

int redsem_async_action(redsem_async *async, int fd, int events)
{
    (void)events;
    if (async == NULL)
        return REDSEM_EINVAL;
    if (async->pid != getpid())
        return redsem__set_err(async->c, REDSEM_EFORKED,
                               "this redsem_async was created by process %ld (after fork)",
                               (long)async->pid);
#if REDSEM_ASYNC_LOOP
    if (fd != -1 && fd != async->epfd)
        return redsem__set_err(async->c, REDSEM_EINVAL, "descriptor %d was not asked for", fd);
    if (async->loop != NULL)
        return loop_action(async, fd);
    struct epoll_event ev;
    (void)epoll_wait(async->epfd, &ev, 1, 0);
#else
    if (fd != -1 && fd != async->pipefd[0])
        return redsem__set_err(async->c, REDSEM_EINVAL, "descriptor %d was not asked for", fd);
#endif
    return run_callbacks(async);
}

size_t redsem_async_pending(redsem_async *async)
{
    return async != NULL ? atomic_load(&async->pending) : 0;
}

/* Under mu: ask a worker to end the shared waits of cancelled acquires. */
static void queue_wake_cancelled(redsem_async *a)
{
    op *w = redsem__calloc(1, sizeof *w);
    if (w == NULL)
        return; /* the wait ends by itself (at most its backoff, 1 s) */
    w->kind = OP_WAKE_CANCELLED;
    w->state = ST_QUEUED;
    atomic_init(&w->cancel, false);
    list_push(&a->quick, w);
    wake_worker(a);
    maybe_spawn(a);
}

/* Under mu: cancel operation id of the workers (as redsem_async_cancel() returns). */
static int worker_cancel(redsem_async *a, uint64_t id)
{
    int rc;
    op *o;
    if ((o = list_find(&a->parked, id)) != NULL || (o = list_find(&a->resume, id)) != NULL) {
        /* a waiting acquire between two attempts: registered on the server, so its loop
         * must run once more to leave (the leader ends its wait at once) */
        atomic_store(&o->cancel, true);
        queue_wake_cancelled(a);
        rc = REDSEM_OK;
    } else if ((o = list_find(&a->quick, id)) != NULL ||
               (o = list_find(&a->waiting, id)) != NULL) {
        list_remove(o->waits ? &a->waiting : &a->quick, o);
        drop(a, o, "cancelled before it started");
        rc = REDSEM_OK;
    } else if ((o = list_find(&a->running, id)) != NULL) {
        if (o->waits) {
            atomic_store(&o->cancel, true);
            queue_wake_cancelled(a);
            rc = REDSEM_OK;
        } else {
            rc = REDSEM_ESTATE;
        }
    } else {
        rc = list_find(&a->done, id) != NULL || list_find(&a->delivering, id) != NULL
                 ? REDSEM_ESTATE
                 : REDSEM_EINVAL;
    }
    return rc;
}

int redsem_async_cancel(redsem_async *async, uint64_t id)
{
    if (async == NULL)
        return REDSEM_EINVAL;
    redsem_async *a = async;
    if (a->pid != getpid())
        return redsem__set_err(a->c, REDSEM_EFORKED,
                               "this redsem_async was created by process %ld (after fork)",
                               (long)a->pid);
    if (id == 0) /* ids start at 1; 0 is the internal wake-up job's */
        return redsem__set_err(a->c, REDSEM_EINVAL, "no pending operation 0");
    pthread_mutex_lock(&a->mu);
    int rc = 1;
#if REDSEM_ASYNC_LOOP
    rc = loop_cancel(a, id); /* 1: not one of the engine's */
#endif
    if (rc == 1)
        rc = worker_cancel(a, id);
    pthread_mutex_unlock(&a->mu);
    if (rc == REDSEM_ESTATE)
        return redsem__set_err(a->c, rc, "operation %llu is past cancelling",
                               (unsigned long long)id);
    if (rc == REDSEM_EINVAL)
        return redsem__set_err(a->c, rc, "no pending operation %llu", (unsigned long long)id);
    return rc;
}

void redsem_async_free(redsem_async *async)
{
    if (async == NULL)
        return;
    redsem_async *a = async;
    if (a->pid != getpid()) {
        /* a forked child: no worker runs here; free memory only */
        close(a->pipefd[0]);
        close(a->pipefd[1]);
#if REDSEM_ASYNC_LOOP
        /* the engine: its memory, and this process's copies of its descriptors (closing
         * them sends nothing: no TLS close_notify, and the parent's stay open); the epoll
         * set is the parent's too, so it is left as it is */
        redsem__loop_free(a->loop);
        close(a->epfd);
        if (a->tfd >= 0)
            close(a->tfd);
        for (op *o; (o = list_pop(&a->looping)) != NULL;)
            redsem__free(o);
        for (op *o; (o = list_pop(&a->incoming)) != NULL;)
            redsem__free(o);
#endif
        op_list *lists[] = {&a->quick,  &a->waiting, &a->running, &a->done,
                            &a->delivering, &a->parked,  &a->resume};
        for (size_t i = 0; i < sizeof lists / sizeof *lists; i++)
            for (op *o; (o = list_pop(lists[i])) != NULL;)
                if (lists[i] != &a->running) {
                    redsem__free(o->park);
                    redsem__free(o);
                }
        redsem__free(a);
        return;
    }
#if REDSEM_ASYNC_LOOP
    if (a->loop != NULL)
        loop_stop(a);
#endif
    pthread_mutex_lock(&a->mu);
    a->closing = true;
    op_list *queues[] = {&a->quick, &a->waiting};
    for (size_t i = 0; i < 2; i++)
        for (op *o; (o = list_pop(queues[i])) != NULL;) {
            if (o->kind == OP_WAKE_CANCELLED) {
                redsem__free(o);
                continue;
            }
            atomic_store(&o->cancel, true);
            o->rc = REDSEM_ECANCELED;
            redsem__text_copy(o->errmsg, "cancelled: the redsem_async was freed");
            finish(a, o);
        }
    /* acquires between two attempts are registered on the server: they run once more, see
     * their cancel flag and leave their queues */
    for (op *o = a->resume.head; o != NULL; o = o->next)
        atomic_store(&o->cancel, true);
    for (op *o = a->parked.head; o != NULL; o = o->next)
        atomic_store(&o->cancel, true);
    for (op *o = a->running.head; o != NULL; o = o->next)
        if (o->waits)
            atomic_store(&o->cancel, true);
    atomic_store(&a->stopping, true);
    wake_all(a);
    maybe_spawn(a);
    pthread_mutex_unlock(&a->mu);
    redsem__wake_cancelled(a->c); /* also ends a lead of ours, if one runs */
    pthread_mutex_lock(&a->mu);
    while (a->nworkers > 0 || a->nparked > 0 || a->resume.head != NULL) {
        maybe_spawn(a);
        int64_t until = redsem__now_ns() + 100 * REDSEM__NS_PER_MS;
        struct timespec ts = {(time_t)(until / 1000000000), (long)(until % 1000000000)};
        pthread_cond_timedwait(&a->work_cv, &a->mu, &ts);
    }
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < REDSEM_ASYNC_WORKERS_MAX; i++)
        if (a->slots[i].used)
            pthread_join(a->slots[i].t, NULL);
    run_callbacks(a);
    if (a->loop_set) {
        if (a->timer_fn != NULL)
            a->timer_fn(a, -1, a->loop_data);
#if REDSEM_ASYNC_LOOP
        a->socket_fn(a, a->epfd, REDSEM_WATCH_REMOVE, a->loop_data);
#else
        a->socket_fn(a, a->pipefd[0], REDSEM_WATCH_REMOVE, a->loop_data);
#endif
    }
#if REDSEM_ASYNC_LOOP
    close(a->epfd);
    if (a->tfd >= 0)
        close(a->tfd);
#endif
    close(a->pipefd[0]);
    close(a->pipefd[1]);
    pthread_cond_destroy(&a->work_cv);
    for (int i = 0; i < REDSEM_ASYNC_WORKERS_MAX; i++)
        pthread_cond_destroy(&a->slots[i].cv);
    pthread_mutex_destroy(&a->mu);
    redsem__free(a);
}

/* Start an operation: checks, then queue it. */
static int submit(redsem_async *a, redsem_client *owner, op_kind kind, void *handle,
                  redsem_async_cb cb, void *user, uint64_t *ret_op, const op *tmpl)
{
    if (a == NULL)
        return REDSEM_EINVAL;
    redsem_client *c = a->c;
    if (a->pid != getpid())
        return redsem__set_err(c, REDSEM_EFORKED,
                               "this redsem_async was created by process %ld (after fork)",
                               (long)a->pid);
    if (handle == NULL || cb == NULL)
        return redsem__set_err(c, REDSEM_EINVAL, "%s is NULL",
                               handle == NULL ? "the handle" : "the callback");
    if (owner != c)
        return redsem__set_err(c, REDSEM_EINVAL,
                               "the handle belongs to another client than this redsem_async's");
    if ((kind == OP_SEM_STATUS || kind == OP_LOCK_STATUS) && tmpl->max_entries > REDSEM_LIMIT_MAX)
        return redsem__set_err(c, REDSEM_EINVAL, "max_entries %zu: at most %u", tmpl->max_entries,
                               REDSEM_LIMIT_MAX); /* refused here, not in the callback */
    op *o = redsem__calloc(1, sizeof *o);
    if (o == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    *o = *tmpl;
    o->kind = kind;
    o->handle = handle;
    o->cb = cb;
    o->user = user;
    o->state = ST_QUEUED;
    o->async = a;
    atomic_init(&o->cancel, false);
    pthread_mutex_lock(&a->mu);
    if (!a->loop_set || a->closing) {
        bool closing = a->closing;
        pthread_mutex_unlock(&a->mu);
        redsem__free(o);
        return redsem__set_err(c, REDSEM_ESTATE, closing ? "the redsem_async is being freed"
                                                         : "no loop set (redsem_async_set_loop)");
    }
    o->id = a->next_id++;
    o->submit_ns = redsem__now_ns();
    if (o->waits && o->timeout_ms > 0) {
        o->deadline_ns = o->submit_ns + o->timeout_ms * REDSEM__NS_PER_MS;
        if (o->deadline_ns < a->expiry_ns) {
            a->expiry_ns = o->deadline_ns;
            a->expiry_moved = true;
        }
    }
    atomic_fetch_add(&a->pending, 1);
#if REDSEM_ASYNC_LOOP
    if (a->loop != NULL && kind != OP_WAKE_CANCELLED && kind != OP_LEAD) {
        /* from a callback of the loop's report: on its thread, at once; else queued, and
         * the loop's next report starts it (the pipe's byte makes it report) */
        bool now = acting == a;
        if (now) {
            o->state = ST_RUNNING;
            list_push(&a->looping, o);
        } else {
            list_push(&a->incoming, o);
            notify(a);
        }
        uint64_t lid = o->id;
        pthread_mutex_unlock(&a->mu);
        if (now)
            loop_start(a, o); /* o may be done (not freed: its callback runs from the loop) */
        if (ret_op != NULL)
            *ret_op = lid;
        return REDSEM_OK;
    }
#endif
    list_push(o->waits ? &a->waiting : &a->quick, o);
    wake_worker(a);
    maybe_spawn(a);
    if (a->nworkers == 0) {
        /* no worker could be started, and none runs to take it: refuse it rather than
         * leave it queued with no callback until some later call starts a worker */
        list_remove(o->waits ? &a->waiting : &a->quick, o);
        atomic_fetch_sub(&a->pending, 1);
        a->next_id--;
        pthread_mutex_unlock(&a->mu);
        redsem__free(o);
        return redsem__set_err(c, REDSEM_ENOMEM, "cannot start a worker thread");
    }
    uint64_t id = o->id; /* o may be done and freed once mu is released */
    pthread_mutex_unlock(&a->mu);
    if (ret_op != NULL)
        *ret_op = id;
    return REDSEM_OK;
}

static int check_wait(redsem_async *a, int64_t timeout_ms)
{
    if (a != NULL && !redsem__valid_wait(timeout_ms))
        return redsem__set_err(a->c, REDSEM_EINVAL,
                               "timeout %lld ms: use 0 (try), 1..%lld, or REDSEM_WAIT_FOREVER",
                               (long long)timeout_ms, REDSEM_WAIT_MAX_MS);
    return REDSEM_OK;
}

int redsem_sem_acquire_async(redsem_async *async, redsem_sem *sem, uint32_t n,
                             int64_t timeout_ms, redsem_async_cb cb, void *user, uint64_t *ret_op)
{
    int rc = check_wait(async, timeout_ms);
    if (rc != REDSEM_OK)
        return rc;
    if (async != NULL && n == 0)
        return redsem__set_err(async->c, REDSEM_EINVAL, "n is 0: take 1..limit permits");
    op t = {.n = n, .timeout_ms = timeout_ms, .waits = timeout_ms != 0,
            .own_list = sem != NULL && sem->strategy != REDSEM_STRATEGY_BASIC &&
                        sem->client->ep.kind == REDSEM__EP_CLUSTER};
    return submit(async, sem != NULL ? sem->client : NULL, OP_SEM_ACQUIRE, sem, cb, user, ret_op,
                  &t);
}

int redsem_lock_acquire_async(redsem_async *async, redsem_lock *lock, int64_t timeout_ms,
                              redsem_async_cb cb, void *user, uint64_t *ret_op)
{
    int rc = check_wait(async, timeout_ms);
    if (rc != REDSEM_OK)
        return rc;
    op t = {.timeout_ms = timeout_ms, .waits = timeout_ms != 0};
    return submit(async, lock != NULL ? lock->client : NULL, OP_LOCK_ACQUIRE, lock, cb, user,
                  ret_op, &t);
}

int redsem_permit_refresh_async(redsem_async *async, redsem_permit *permit, redsem_async_cb cb,
                                void *user, uint64_t *ret_op)
{
    op t = {0};
    return submit(async, permit != NULL ? permit->client : NULL, OP_REFRESH, permit, cb, user,
                  ret_op, &t);
}

int redsem_permit_release_async(redsem_async *async, redsem_permit *permit, redsem_async_cb cb,
                                void *user, uint64_t *ret_op)
{
    op t = {0};
    return submit(async, permit != NULL ? permit->client : NULL, OP_RELEASE, permit, cb, user,
                  ret_op, &t);
}

int redsem_sem_status_async(redsem_async *async, redsem_sem *sem, size_t max_entries,
                            redsem_async_cb cb, void *user, uint64_t *ret_op)
{
    op t = {.max_entries = max_entries};
    return submit(async, sem != NULL ? sem->client : NULL, OP_SEM_STATUS, sem, cb, user, ret_op,
                  &t);
}

int redsem_lock_status_async(redsem_async *async, redsem_lock *lock, size_t max_entries,
                             redsem_async_cb cb, void *user, uint64_t *ret_op)
{
    op t = {.max_entries = max_entries};
    return submit(async, lock != NULL ? lock->client : NULL, OP_LOCK_STATUS, lock, cb, user,
                  ret_op, &t);
}
