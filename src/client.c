/* redsem - the client handle: its lifecycle, its errors, key names, and the calls of the
 * object layer (semaphores, locks, permits) routed to the node that serves their key. */
#include <errno.h>
#include <poll.h>
#include <semaphore.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
static atomic_uint_fast64_t client_serials;

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

void redsem__clear_err(redsem_client *c)
{
    err_slot *e = err_find(c);
    if (e != NULL)
        e->text[0] = '\0';
}

/* A thread's own cap on the deadlines of its calls on one client (redsem__call_cap_set): set
 * by the renewer around its renewals, so that no renewal waits for a connection or a reply
 * past the moment a holder must be told, and by an acquire leaving a queue (acquire.c), so
 * that it ends one command timeout after its deadline; other threads' calls never see it. */
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

/* The end of the command timeout of a call of this thread that already waited for the
 * shared connection's lane and now goes alone (redsem__eval), 0 if none: it caps the call's
 * wait for a request lane and its first attempt (redsem__ctx's wait_cap_ns), not its retry
 * window after a lost connection. */
static _Thread_local int64_t eval_wait_cap_ns;

const char *redsem_client_errmsg(const redsem_client *c)
{
    if (c == NULL)
        return "";
    const err_slot *e = err_find(c);
    return e != NULL ? e->text : "";
}

int redsem__check_owner(redsem_client *c)
{
    redsem__clear_err(c);
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

/* ================================================================ the pool */

/* A lane is borrowed for one routed call and given back. Request lanes: at most
 * max_connections, made on demand, a thread finding them all busy waits for one within the
 * command timeout (nothing was sent: a plain REDSEM_ETIMEDOUT). Wait lanes (BLPOP): as many as
 * threads wait at once, kept for reuse, so that a blocked waiter never holds a connection
 * that requests need. A new lane connects on its first request (node.c), with the usual
 * retries. */
static int lane_new(redsem_client *c, bool for_wait, redsem__lane **ret)
{
    redsem__lane *l = redsem__calloc(1, sizeof *l);
    if (l == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    char err[512] = "";
    int rc = redsem__topo_init(&l->topo, &l->ctx, &c->ep, &c->cfg, err, sizeof err);
    if (rc != REDSEM_OK) {
        redsem__topo_close(&l->topo);
        redsem__free(l);
        return redsem__set_err(c, rc, "%s", err);
    }
    l->for_wait = for_wait;
    if (l->topo.kind == REDSEM__TOPO_CLUSTER) {
        l->topo.seed_first = &c->seed_first; /* a new lane asks first the seed that answered */
    } else {
        l->topo.single.clock = &c->clock; /* one server: one clock for every lane */
        l->topo.single.scripts = &c->scripts; /* and one script cache */
        l->topo.watch = c->sentinel_watch;    /* and one watch of the Sentinels */
    }
    pthread_mutex_lock(&c->pool_mu);
    l->epoch = c->fault_epoch;
    if (c->nlanes == c->lanes_cap) {
        size_t cap = c->lanes_cap ? c->lanes_cap * 2 : 8;
        redsem__lane **v = redsem__realloc(c->lanes, cap * sizeof *v);
        if (v == NULL) {
            pthread_mutex_unlock(&c->pool_mu);
            redsem__topo_close(&l->topo);
            redsem__free(l);
            return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
        }
        c->lanes = v;
        c->lanes_cap = cap;
    }
    c->lanes[c->nlanes++] = l;
    pthread_mutex_unlock(&c->pool_mu);
    *ret = l;
    return REDSEM_OK;
}

/* A thread waiting for a request lane, in the pool's FIFO queue. A lane given back goes to
 * the first waiter (handed over in ->lane); while the head may make a lane, it is told to
 * (->make). */
typedef struct pool_waiter {
    struct pool_waiter *next;
    pthread_cond_t cv;
    redsem__lane *lane;
    int64_t since; /* when it started waiting */
    bool make;
    bool capped; /* a call with a cap of its own (a renewal, an acquire leaving a queue) */
} pool_waiter;

/* The wait cap (redsem__ctx's wait_cap_ns) of a call that waited for a connection since
 * `since` (0: it did not): a call's wait for a connection and its first attempt share one
 * command timeout, so that a stalled server holds it no longer than that; a retry window
 * after a lost connection (a restart) still runs to its end. 0: none. */
static int64_t cap_after_wait(const redsem_client *c, int64_t since)
{
    int64_t cap = eval_wait_cap_ns;
    if (since != 0) {
        int64_t end = since + c->command_timeout_ms * REDSEM__NS_PER_MS;
        if (cap == 0 || end < cap)
            cap = end;
    }
    return cap;
}

/* A borrowed lane's caps for one call: the caller's own, and its wait's. */
static void lane_caps(const redsem_client *c, redsem__lane *l)
{
    l->ctx.deadline_cap_ns = call_cap(c);
    l->ctx.wait_cap_ns = cap_after_wait(c, l->queued_since);
}

static void queue_push(redsem_client *c, pool_waiter *w)
{
    atomic_fetch_add(&c->queued, 1);
    w->next = NULL;
    w->capped = call_cap(c) != 0 || eval_wait_cap_ns != 0;
    if (w->capped && c->queue_head != NULL) {
        /* a call with a cap of its own (a renewal: a late one loses a permit; an acquire
         * leaving a queue) goes ahead of the others, after those of its kind queued before
         * it (first come, first served among them) */
        pool_waiter **at = &c->queue_head;
        while (*at != NULL && (*at)->capped)
            at = &(*at)->next;
        w->next = *at;
        *at = w;
        if (w->next == NULL)
            c->queue_tail = w;
        return;
    }
    if (c->queue_tail != NULL)
        c->queue_tail->next = w;
    else
        c->queue_head = w;
    c->queue_tail = w;
}

static bool queue_remove(redsem_client *c, pool_waiter *w)
{
    for (pool_waiter **p = &c->queue_head, *prev = NULL; *p != NULL; prev = *p, p = &(*p)->next)
        if (*p == w) {
            atomic_fetch_sub(&c->queued, 1);
            *p = w->next;
            if (c->queue_tail == w)
                c->queue_tail = prev;
            return true;
        }
    return false;
}

/* Under pool_mu: claim an idle request lane (*ret), or the right to make one (*make). */
static bool lane_claim(redsem_client *c, redsem__lane **ret, bool *make, bool *stale)
{
    *make = *stale = false;
    redsem__lane *l = c->idle_req;
    if (l != NULL) {
        c->idle_req = l->next_idle;
        *stale = l->epoch != c->fault_epoch;
        l->epoch = c->fault_epoch;
        *ret = l;
        return true;
    }
    if (c->nreq < c->max_connections) {
        c->nreq++;
        *make = true;
        return true;
    }
    return false;
}

/* Under pool_mu, nothing claimable: queue w and wait until it is handed a lane or told to
 * make one; w is then out of the queue. REDSEM_ETIMEDOUT if nothing came within the command
 * timeout. */
static int queue_wait(redsem_client *c, pool_waiter *w)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->pool_waits++;
    w->since = redsem__now_ns();
    queue_push(c, w);
    int64_t dl = redsem__deadline_after_ms(c->command_timeout_ms);
    int64_t cap = call_cap(c);
    if (cap != 0 && cap < dl)
        dl = cap;
    if (eval_wait_cap_ns != 0 && eval_wait_cap_ns < dl)
        dl = eval_wait_cap_ns;
    struct timespec until = {(time_t)(dl / 1000000000), (long)(dl % 1000000000)};
    int rc = REDSEM_OK;
    while (w->lane == NULL && !w->make) {
        if (pthread_cond_timedwait(&w->cv, &c->pool_mu, &until) == ETIMEDOUT &&
            w->lane == NULL && !w->make) {
            queue_remove(c, w);
            rc = REDSEM_ETIMEDOUT;
            break;
        }
    }
    pthread_cond_destroy(&w->cv);
    return rc;
}

static int busy_error(redsem_client *c)
{
    return redsem__set_err(c, REDSEM_ETIMEDOUT,
                           "all %d connections of the client were busy with other threads' "
                           "requests for the command timeout (%lld ms); nothing was sent",
                           c->max_connections, (long long)c->command_timeout_ms);
}

/* Make the lane a claim allowed, or give the right back to the next waiter. */
static int lane_make(redsem_client *c, redsem__lane **ret)
{
    int rc = lane_new(c, false, ret);
    if (rc != REDSEM_OK) {
        pthread_mutex_lock(&c->pool_mu);
        c->nreq--;
        if (c->queue_head != NULL && c->nreq < c->max_connections) {
            pool_waiter *h = c->queue_head;
            queue_remove(c, h);
            c->nreq++;
            h->make = true;
            pthread_cond_signal(&h->cv);
        }
        pthread_mutex_unlock(&c->pool_mu);
    }
    return rc;
}

int redsem__lane_get(redsem_client *c, bool for_wait, redsem__lane **ret)
{
    if (for_wait) {
        /* wait lanes: one per acquire waiting now, made as needed, kept */
        pthread_mutex_lock(&c->pool_mu);
        redsem__lane *l = c->idle_wait;
        bool stale = false;
        if (l != NULL) {
            c->idle_wait = l->next_idle;
            stale = l->epoch != c->fault_epoch;
            l->epoch = c->fault_epoch;
        }
        pthread_mutex_unlock(&c->pool_mu);
        if (l == NULL) {
            int rc = lane_new(c, true, ret);
            if (rc == REDSEM_OK)
                (*ret)->queued_since = 0;
            return rc;
        }
        if (stale)
            redsem__topo_disconnect(&l->topo);
        l->queued_since = 0;
        *ret = l;
        return REDSEM_OK;
    }
    pthread_mutex_lock(&c->pool_mu);
    bool make = false, stale = false;
    int64_t since = 0;
    *ret = NULL;
    if (!lane_claim(c, ret, &make, &stale)) {
        pool_waiter w = {.lane = NULL};
        int rc = queue_wait(c, &w);
        if (rc == REDSEM_OK && w.lane != NULL) {
            stale = w.lane->epoch != c->fault_epoch;
            w.lane->epoch = c->fault_epoch;
        }
        pthread_mutex_unlock(&c->pool_mu);
        if (rc != REDSEM_OK)
            return busy_error(c);
        *ret = w.lane;
        make = w.make;
        since = w.since;
    } else {
        pthread_mutex_unlock(&c->pool_mu);
    }
    if (make) {
        int rc = lane_make(c, ret);
        if (rc != REDSEM_OK)
            return rc;
    } else if (stale) {
        redsem__topo_disconnect(&(*ret)->topo);
    }
    (*ret)->queued_since = since;
    return REDSEM_OK;
}

/* A call that lost its connection (a server restart, CLIENT KILL, an idle timeout) marks
 * every other idle connection of the pool as suspect: each is closed and opened anew when it
 * is next borrowed, instead of failing that call too (with a retry window of 0, or an
 * acquire's "maybe applied"). A request lane given back goes to the first queued thread. */
void redsem__lane_put(redsem_client *c, redsem__lane *l, int rc)
{
    pthread_mutex_lock(&c->pool_mu);
    if (rc == REDSEM_ECONN || rc == REDSEM_EUNKNOWN)
        l->epoch = ++c->fault_epoch;
    if (!l->for_wait && c->queue_head != NULL) {
        pool_waiter *h = c->queue_head;
        queue_remove(c, h);
        h->lane = l;
        pthread_cond_signal(&h->cv);
    } else {
        redsem__lane **idle = l->for_wait ? &c->idle_wait : &c->idle_req;
        l->next_idle = *idle;
        *idle = l;
    }
    pthread_mutex_unlock(&c->pool_mu);
}

/* The thread's error text goes down into the lane for the call (the node layer writes its
 * own there) and comes back up after it. */
void redsem__text_copy(char *dst, const char *src)
{
    size_t n = strnlen(src, REDSEM__ERRMSG_LEN - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int lane_begin(redsem_client *c, bool for_wait, redsem__lane **ret)
{
    int rc = redsem__lane_get(c, for_wait, ret);
    if (rc != REDSEM_OK)
        return rc;
    redsem__text_copy((*ret)->ctx.errmsg, redsem__errbuf(c));
    lane_caps(c, *ret);
    return REDSEM_OK;
}

static void lane_end(redsem_client *c, redsem__lane *l, int rc)
{
    redsem__text_copy(redsem__errbuf(c), l->ctx.errmsg);
    redsem__lane_put(c, l, rc);
}

/* ================================================================ routed calls */

/* One routed call on a borrowed lane: run call on the node serving key (topo/topo.h). */
int redsem__routed(redsem_client *c, bool for_wait, const char *key, size_t len, int flags,
                   redsem__req_info *info, redsem__node_call call, void *arg)
{
    redsem__lane *l;
    int rc = lane_begin(c, for_wait, &l);
    if (rc != REDSEM_OK)
        return rc;
    rc = redsem__topo_route(&l->topo, key, len, flags, info, call, arg);
    lane_end(c, l, rc);
    return rc;
}

/* The three routed requests as redsem__node_call, for redsem__topo_route. */
typedef struct request_call {
    const redsem__args *a;
    int flags;
    int64_t deadline_ns;
    redisReply **ret_reply;
    redsem__req_info *info;
} request_call;

static int call_request(redsem__node *n, void *arg)
{
    request_call *q = arg;
    return redsem__node_request(n, q->a, q->flags, q->deadline_ns, q->ret_reply, q->info);
}

typedef struct eval_call {
    int script, nkeys;
    const redsem__args *ka;
    int flags;
    redsem__req_info *info;
    redisReply **ret_reply;
} eval_call;

static int call_eval(redsem__node *n, void *arg)
{
    eval_call *q = arg;
    return redsem__node_eval(n, q->script, q->nkeys, q->ka, q->flags, q->info, q->ret_reply);
}

typedef struct blpop_call {
    const char *key;
    size_t keylen;
    int64_t wait_ms, hard_deadline_ns;
    bool *signaled;
} blpop_call;

static int call_blpop(redsem__node *n, void *arg)
{
    blpop_call *q = arg;
    return redsem__node_blpop(n, q->key, q->keylen, q->wait_ms, q->hard_deadline_ns, q->signaled);
}

int redsem__request(redsem_client *c, const redsem__args *a, int flags, int64_t deadline_ns,
                    redisReply **ret_reply, redsem__req_info *info)
{
    /* the calls sent this way (PING) name no key */
    request_call q = {a, flags, deadline_ns, ret_reply, info};
    return redsem__routed(c, false, NULL, 0, flags, info, call_request, &q);
}

/* ================================================================ the shared connection */

/* The script calls of a client with one server (not a cluster, no WAIT, no cap of the
 * thread's own) go into the client's pipe (node/conn.h) on one request lane, many in flight
 * at once: a thread appends its call and writes it at once while few calls are in flight
 * (REDSEM__BATCH_MAX) or no thread is reading; else the reader writes it, with every call
 * queued meanwhile, the moment it wakes for the replies of those in flight (before it hands
 * them out), so the connection does not idle between batches. The threads waiting for replies drive the pipe in turn, one at a time
 * (the reader: it polls the socket until the earliest deadline in flight, steps the pipe,
 * and wakes each thread whose reply came), the others sleep until their reply is in or the
 * reader role is handed to them (libpq's shape: the blocking call is the non-blocking one
 * plus a poll). The lane is given back to the pool when nothing is in flight, and is not
 * taken for new calls while other threads wait in the pool's queue (they then go alone, in
 * the queue), so that the calls that need a lane of their own (PING, renewals, an acquire
 * leaving a queue) are never held off for long. A call whose reply asks for more (NOSCRIPT,
 * LOADING, READONLY) or whose connection was lost (with REDSEM__REQ_RETRY) is run again
 * alone on a lane, by redsem__node_eval, its "maybe applied" kept. */

/* A thread's wake-up: a semaphore, posted by the reader once it let the mutex go (so that the
 * woken thread does not wake into a held mutex). Kept by the client and reused, never freed
 * before it: a post that comes after its thread went on only makes its next user look again
 * early (every wait re-checks its condition under the mutex). */
typedef struct drive_waker {
    sem_t sem;
    struct drive_waker *next, *next_all;
} drive_waker;

/* A thread waiting for its call in the pipe: woken when it ends or the reader role is free. */
typedef struct drive_wait {
    redsem__drive *d;
    drive_waker *k;
    bool done;
    bool reading; /* its thread holds the reader role: it sees its end itself */
} drive_wait;

static void drive_done(redsem__preq *q, void *arg)
{
    (void)q;
    drive_wait *w = arg;
    w->done = true;
    if (w->reading)
        return;
    if (w->d->nposts < (int)(sizeof w->d->posts / sizeof w->d->posts[0]))
        w->d->posts[w->d->nposts++] = w->k;
    else
        sem_post(&w->k->sem);
}

/* Under d->mu: post the wake-ups of the calls that ended, the mutex let go meanwhile. */
static void drive_post(redsem__drive *d)
{
    int n = d->nposts;
    if (n == 0)
        return;
    drive_waker *v[sizeof d->posts / sizeof d->posts[0]];
    memcpy(v, d->posts, (size_t)n * sizeof v[0]);
    d->nposts = 0;
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < n; i++)
        sem_post(&v[i]->sem);
    pthread_mutex_lock(&d->mu);
}

/* Under d->mu: a wake-up for the calling thread (NULL without memory), and back. */
static drive_waker *waker_take(redsem__drive *d)
{
    drive_waker *k = d->free_wakers;
    if (k != NULL) {
        d->free_wakers = k->next;
        return k;
    }
    k = redsem__calloc(1, sizeof *k);
    if (k != NULL) {
        sem_init(&k->sem, 0, 0);
        k->next_all = d->all_wakers;
        d->all_wakers = k;
    }
    return k;
}

static void waker_give(redsem__drive *d, drive_waker *k)
{
    while (sem_trywait(&k->sem) == 0)
        ; /* a hand-off it did not wait for: its next user waits for its own */
    k->next = d->free_wakers;
    d->free_wakers = k;
}

static redsem__node *drive_node(const redsem__drive *d)
{
    return redsem__topo_node(&d->lane->topo, NULL, 0);
}

/* Whether a node found through Sentinel must see its calls go alone (redsem__node_eval, which
 * sends ROLE along or resolves again): the Sentinels announced the primary moved (*drop: its
 * connection must go; the old primary still writes) or its ROLE is older than
 * REDSEM__ROLE_CHECK_MS. */
static bool sentinel_due(redsem__node *n, bool *drop)
{
    if (n->resolve == NULL)
        return false;
    char err[256];
    if (n->moved != NULL && n->moved(n->resolve_arg, n, err, sizeof err)) {
        *drop = true;
        return true;
    }
    return redsem__now_ns() - n->role_checked_ns >= REDSEM__ROLE_CHECK_MS * REDSEM__NS_PER_MS;
}

/* Under d->mu, a drive without a lane: borrow one, while other threads wait for it.
 * REDSEM_OK (d->lane set), the borrow's fault (nothing sent: busy), or 1: the lane is not
 * connected (the call goes alone: the routed call connects it, with its retries and caps,
 * and the next call finds it connected). */
static int drive_take_lane(redsem_client *c, redsem__drive *d, bool *waited)
{
    d->getting = true;
    pthread_mutex_unlock(&d->mu);
    redsem__lane *l = NULL;
    int rc = redsem__lane_get(c, false, &l);
    if (rc == REDSEM_OK) {
        redsem__node *n = redsem__topo_node(&l->topo, NULL, 0);
        *waited = *waited || l->queued_since != 0;
        if (n == NULL || !n->connected) {
            redsem__lane_put(c, l, REDSEM_OK);
            rc = 1;
        }
    }
    pthread_mutex_lock(&d->mu);
    d->getting = false;
    pthread_cond_broadcast(&d->lane_cv);
    if (rc == REDSEM_OK) {
        d->lane = l;
        d->retire = d->drop = false;
        redsem__pipe_attach(&d->pipe, &drive_node(d)->conn);
    }
    return rc;
}

/* Under d->mu: whether a call may go into the pipe now (a lane held, connected, not retiring,
 * no thread queued for a lane, a Sentinel primary not known to have moved and checked within
 * REDSEM__ROLE_CHECK_MS). REDSEM_OK yes, 1 no (go alone), else a fault for the call.
 * *waited: it waited for a connection (then a call that goes alone keeps its deadline). */
static int drive_admit(redsem_client *c, redsem__drive *d, bool *waited)
{
    *waited = d->getting;
    while (d->getting)
        pthread_cond_wait(&d->lane_cv, &d->mu);
    if (atomic_load(&c->queued) > 0)
        return 1;
    if (d->lane == NULL) {
        int rc = drive_take_lane(c, d, waited);
        if (rc != REDSEM_OK)
            return rc;
    }
    redsem__node *n = drive_node(d);
    if (d->retire || d->pipe.rc != REDSEM_OK || !n->connected)
        return 1;
    if (sentinel_due(n, &d->drop)) {
        d->retire = true;
        return 1;
    }
    return REDSEM_OK;
}

/* Under d->mu, no reader, no call in flight or unfinished: give the lane back (closing its
 * connection if it must go). The lane to put back, or NULL. */
static redsem__lane *drive_release(redsem__drive *d, int *rc)
{
    if (d->lane == NULL || d->reading || d->users > 0)
        return NULL;
    redsem__lane *l = d->lane;
    *rc = REDSEM_OK;
    if (d->drop || d->pipe.rc != REDSEM_OK) {
        redsem__node *n = drive_node(d);
        redsem__conn_abort(&n->conn); /* abortive: nothing given up on is delivered later */
        n->connected = false;
        *rc = REDSEM_ECONN;
    }
    d->lane = NULL;
    return l;
}

/* One turn of a pipe's driver: poll its socket for what it wants until its earliest
 * deadline (mu, if not NULL, released meanwhile), then step it. The step's status. */
static int poll_step(redsem__pipe *p, pthread_mutex_t *mu)
{
    int64_t dl;
    short ev = redsem__pipe_wants(p, &dl);
    struct pollfd pfd = {redsem__pipe_fd(p), ev, 0};
    int64_t left = dl - redsem__now_ns();
    if (left < 0)
        left = 0;
    struct timespec ts = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
    if (mu != NULL)
        pthread_mutex_unlock(mu);
    int r = ppoll(&pfd, 1, &ts, NULL);
    if (mu != NULL)
        pthread_mutex_lock(mu);
    bool in = r > 0 && (pfd.revents & (POLLIN | POLLERR | POLLHUP)) != 0;
    bool out = r > 0 && (pfd.revents & (POLLOUT | POLLERR | POLLHUP)) != 0;
    return redsem__pipe_step(p, in, out, redsem__now_ns());
}

/* Under d->mu, holding the reader role until w's call ended: poll the socket for what the
 * pipe wants until its earliest deadline, step it. Then the role goes to the thread of the
 * oldest call still in flight. */
static void drive_read(redsem__drive *d, drive_wait *w)
{
    d->reading = w->reading = true;
    while (!w->done) {
        if (poll_step(&d->pipe, &d->mu) != REDSEM_OK)
            d->retire = d->drop = true;
        drive_post(d);
    }
    d->reading = w->reading = false;
    if (d->pipe.head != NULL)
        sem_post(&((drive_wait *)d->pipe.head->arg)->k->sem);
}

/* The bytes of a call: [SCRIPT LOAD body] EVALSHA sha nkeys keys... args...; the length, or
 * -1 without memory. Freed with redsem__free. */
static int drive_format(const redsem__batch_item *it, bool load, char **out)
{
    const redsem__script_def *d = &redsem__script_defs[it->script];
    redsem__args la, a;
    redsem__args_init(&la);
    redsem__args_init(&a);
    redsem__args_str(&la, "SCRIPT");
    redsem__args_str(&la, "LOAD");
    redsem__args_mem(&la, d->text, d->len);
    redsem__args_str(&a, "EVALSHA");
    redsem__args_mem(&a, d->sha, 40);
    redsem__args_i64(&a, it->nkeys);
    for (int j = 0; j < it->ka->n; j++)
        redsem__args_mem(&a, it->ka->v[j], it->ka->len[j]);
    char *c0 = NULL, *c1 = NULL;
    int l0 = load ? redsem__args_format(&la, &c0) : 0;
    int l1 = l0 < 0 ? -1 : redsem__args_format(&a, &c1);
    *out = l1 < 0 ? NULL : redsem__malloc((size_t)l0 + (size_t)l1);
    if (*out != NULL) {
        if (l0 > 0)
            memcpy(*out, c0, (size_t)l0);
        memcpy(*out + l0, c1, (size_t)l1);
    }
    if (c0 != NULL)
        redisFreeCommand(c0);
    if (c1 != NULL)
        redisFreeCommand(c1);
    return *out != NULL ? l0 + l1 : -1;
}

static bool error_is(const redisReply *r, const char *word)
{
    return r->type == REDIS_REPLY_ERROR && r->str != NULL &&
           strncmp(r->str, word, strlen(word)) == 0;
}

/* The outcome of it from its ended request q on n (as redsem__node_eval would make it; why:
 * the pipe's fault text). false: run it alone (nothing ran, or a lost connection to retry;
 * *maybe: it may have been applied; *drop: the connection must go, READONLY). */
static bool finish_call(redsem__node *n, const char *why, redsem__batch_item *it,
                        redsem__preq *q, bool load, bool *maybe, bool *drop)
{
    if (q->rc != REDSEM_OK) {
        *maybe = q->written;
        if (q->rc == REDSEM_ECONN && (it->flags & REDSEM__REQ_RETRY) && n->retry_ms > 0) {
            REDSEM__COUNT(n->ctx, retries, 1); /* sent again, alone: a retry */
            return false;
        }
        it->rc = q->rc;
        snprintf(it->errmsg, REDSEM__ERRMSG_LEN, "%s", why);
        if (it->info != NULL)
            *it->info = (redsem__req_info){q->written, 0, 0, -1};
        return true;
    }
    const redsem__script_def *def = &redsem__script_defs[it->script];
    if (load) {
        redisReply *lr = q->replies[0];
        if (lr->type == REDIS_REPLY_STRING)
            atomic_store(&n->scripts->sent[it->script], true);
        else if (!error_is(lr, "ERR Error compiling"))
            atomic_store(&n->scripts->eval_body, true); /* SCRIPT LOAD refused: EVAL bodies */
        freeReplyObject(lr);
        REDSEM__COUNT(n->ctx, script_loads, 1);
    }
    redisReply *r = q->replies[load ? 1 : 0];
    bool readonly = error_is(r, "READONLY");
    if (error_is(r, "NOSCRIPT") || error_is(r, "LOADING") || readonly ||
        redsem__redirect_reply(r)) {
        if (error_is(r, "NOSCRIPT") && !atomic_load(&n->scripts->eval_body))
            REDSEM__COUNT(n->ctx, noscript, 1);
        if (error_is(r, "NOSCRIPT"))
            atomic_store(&n->scripts->sent[it->script], false);
        if (readonly && n->resolve != NULL)
            *drop = true; /* demoted under us: resolve again */
        freeReplyObject(r);
        return false; /* nothing ran: the whole story alone */
    }
    if (!error_is(r, "ERR Error compiling"))
        atomic_store(&n->scripts->sent[it->script], true);
    if (it->info != NULL)
        *it->info = (redsem__req_info){false, q->sent_ns, q->recv_ns, -1};
    if (r->type == REDIS_REPLY_ERROR) {
        redsem__text_copy(n->ctx->errmsg, it->errmsg);
        it->rc = redsem__node_error_reply(n, r, def->name);
        redsem__text_copy(it->errmsg, n->ctx->errmsg);
        freeReplyObject(r);
        return true;
    }
    *it->ret_reply = r;
    it->rc = REDSEM_OK;
    return true;
}

/* Run it through the shared connection. true: done (its rc, reply, info and errmsg set);
 * false: run it alone (*maybe: a copy may have been applied; *waited: it waited for a
 * connection and was not sent: its deadline holds for the rest). */
static bool drive_eval(redsem_client *c, redsem__batch_item *it, int64_t deadline_ns,
                       bool *maybe, bool *waited)
{
    redsem__drive *d = &c->drive;
    *maybe = *waited = false;
    bool load = !atomic_load(&c->scripts.sent[it->script]);
    char *cmd = NULL;
    int len = load && atomic_load(&c->scripts.eval_body) ? -1 : drive_format(it, load, &cmd);
    if (len < 0)
        return false; /* the body by EVAL (SCRIPT LOAD refused), or no memory: alone */
    drive_wait w = {.d = d, .done = false};
    redsem__preq q = {.nreplies = load ? 2 : 1, .deadline_ns = deadline_ns, .done = drive_done,
                      .arg = &w};
    pthread_mutex_lock(&d->mu);
    w.k = waker_take(d);
    int rc = w.k != NULL ? drive_admit(c, d, waited) : 1;
    bool sent = rc == REDSEM_OK && redsem__pipe_send(&d->pipe, &q, cmd, (size_t)len) == REDSEM_OK;
    if (sent) {
        d->users++;
        REDSEM__COUNT(&d->lane->ctx, requests, 1);
        if (d->pipe.inflight > 1)
            REDSEM__COUNT(&d->lane->ctx, pipelined, 1);
        /* Written now while few calls are in flight (or no thread reads); with more, the
         * reader writes it with the others queued meanwhile, in one write, the moment it
         * wakes for their replies. Measured (bench -w threads --shared, basic): written
         * always at once, 8 threads 0.88-0.93x their floor and 32 threads 1.0x; always by
         * the reader, 0.65x and 1.3x; this, 0.95-1.0x and 1.4-1.5x. */
        if ((d->pipe.inflight <= REDSEM__BATCH_MAX || !d->reading) &&
            redsem__pipe_step(&d->pipe, false, false, redsem__now_ns()) != REDSEM_OK)
            d->retire = d->drop = true;
        drive_post(d);
        while (!w.done) {
            if (!d->reading) {
                drive_read(d, &w);
                break;
            }
            pthread_mutex_unlock(&d->mu);
            while (sem_wait(&w.k->sem) != 0)
                ; /* EINTR */
            pthread_mutex_lock(&d->mu);
        }
    }
    bool done = sent ? finish_call(drive_node(d), d->pipe.err, it, &q, load, maybe, &d->drop)
                     : rc < 0;
    /* a call that went out and must go on alone (a lost connection, NOSCRIPT) gets the usual
     * retry window from here; one that waited for a connection and never went out keeps its
     * deadline */
    *waited = *waited && !sent;
    d->retire = d->retire || d->drop;
    if (sent)
        d->users--;
    if (!sent && rc < 0)
        it->rc = rc; /* no lane within the command timeout: the text is the thread's */
    if (w.k != NULL)
        waker_give(d, w.k);
    int put = REDSEM_OK;
    redsem__lane *l = drive_release(d, &put);
    pthread_mutex_unlock(&d->mu);
    if (l != NULL)
        redsem__lane_put(c, l, put);
    redsem__free(cmd);
    return done;
}

/* A call whose reply did not come by the earliest deadline in flight on its connection (the
 * server stalled: every call in flight ends then) gives up at its own deadline, not earlier:
 * its not-after time (sent with it, the moment its caller gives up + 100 ms) was set from its
 * own, and a script that runs after the caller gave up must find it passed. Found by fault
 * scenario 17 (a fair waiter granted 272 ms after its caller gave up). */
static int give_up_at_own_deadline(const redsem__batch_item *it, int64_t own_deadline_ns)
{
    if (it->rc == REDSEM_ETIMEDOUT && it->info != NULL && it->info->maybe_applied) {
        int64_t left = own_deadline_ns - redsem__now_ns();
        if (left > 0)
            redsem__sleep_ns(left);
    }
    return it->rc;
}

int redsem__eval(redsem_client *c, int script, int nkeys, const redsem__args *ka, int flags,
                 redsem__req_info *info, redisReply **ret_reply)
{
    /* A call with a cap of its own (a renewal) is not taken into another thread's batch,
     * whose deadline would not know its cap, and takes no other thread's call along. */
    bool maybe = false, waited = false;
    if (info != NULL) /* a call that fails before it is sent (no connection) sent nothing */
        *info = (redsem__req_info){false, 0, 0, -1};
    if (c->drive_on && call_cap(c) == 0 &&
        !((flags & REDSEM__REQ_SYNC) && c->sync_replicas > 0)) {
        /* its wait for the connection and its round trip share one command timeout */
        int64_t deadline = redsem__deadline_after_ms(c->command_timeout_ms);
        redsem__batch_item it = {script, nkeys, ka, flags, info, ret_reply,
                                 redsem__errbuf(c), REDSEM_OK};
        if (drive_eval(c, &it, deadline, &maybe, &waited))
            return give_up_at_own_deadline(&it, deadline);
        if (waited) /* its wait for a connection and its first attempt share one command
                     * timeout; a retry window after a lost connection runs to its end */
            eval_wait_cap_ns = deadline;
    }
    /* every key of one call shares a hash tag: the first one routes it */
    eval_call q = {script, nkeys, ka, flags, info, ret_reply};
    int rc = redsem__routed(c, false, nkeys > 0 ? ka->v[0] : NULL, nkeys > 0 ? ka->len[0] : 0,
                            flags, info, call_eval, &q);
    eval_wait_cap_ns = 0;
    if (maybe && info != NULL)
        info->maybe_applied = true; /* a copy in the pipe may have run */
    return rc;
}

/* One item alone on n (redsem__node_eval, its retries); maybe: an earlier copy may have been
 * applied. */
static void eval_alone(redsem__node *n, redsem__batch_item *it, bool maybe)
{
    redsem__text_copy(n->ctx->errmsg, it->errmsg);
    it->rc = redsem__node_eval(n, it->script, it->nkeys, it->ka, it->flags, it->info,
                               it->ret_reply);
    if (maybe && it->info != NULL)
        it->info->maybe_applied = true;
    redsem__text_copy(it->errmsg, n->ctx->errmsg);
}

static void count_done(redsem__preq *q, void *arg)
{
    (void)q;
    ++*(int *)arg;
}

/* k script calls on n in one write, through a pipe of their own on its connection (the
 * renewer's refreshes due together); each that needs more goes on alone on n. */
static void eval_many_on(redsem__node *n, redsem__batch_item *items, int k, int64_t deadline)
{
    redsem__pipe p;
    redsem__pipe_init(&p, &n->conn);
    redsem__preq q[REDSEM__BATCH_MAX];
    bool load[REDSEM__BATCH_MAX], sent[REDSEM__BATCH_MAX], drop = false;
    int nsent = 0, ended = 0;
    bool usable = n->connected && k > 1 && !sentinel_due(n, &drop);
    for (int i = 0; i < k; i++) {
        const redsem__batch_item *it = &items[i];
        char *cmd = NULL;
        load[i] = !atomic_load(&n->scripts->sent[it->script]);
        sent[i] = usable && !(load[i] && atomic_load(&n->scripts->eval_body)) &&
                  !((it->flags & REDSEM__REQ_SYNC) && n->sync_replicas > 0);
        int len = sent[i] ? drive_format(it, load[i], &cmd) : -1;
        q[i] = (redsem__preq){.nreplies = load[i] ? 2 : 1, .deadline_ns = deadline,
                              .done = count_done, .arg = &ended};
        sent[i] = len >= 0 && redsem__pipe_send(&p, &q[i], cmd, (size_t)len) == REDSEM_OK;
        nsent += sent[i];
        redsem__free(cmd);
    }
    REDSEM__COUNT(n->ctx, requests, (uint64_t)nsent);
    REDSEM__COUNT(n->ctx, pipelined, (uint64_t)(nsent > 1 ? nsent : 0));
    while (ended < nsent && poll_step(&p, NULL) == REDSEM_OK)
        ;
    bool maybe[REDSEM__BATCH_MAX] = {false}, alone[REDSEM__BATCH_MAX];
    for (int i = 0; i < k; i++)
        alone[i] = !sent[i] || !finish_call(n, p.err, &items[i], &q[i], load[i], &maybe[i], &drop);
    if (p.rc != REDSEM_OK || drop) {
        redsem__conn_abort(&n->conn); /* abortive: nothing given up on is delivered later */
        n->connected = false;
    }
    redsem__free(p.out);
    for (int i = 0; i < k; i++)
        if (alone[i])
            eval_alone(n, &items[i], maybe[i]);
}

void redsem__eval_many(redsem_client *c, redsem__batch_item *items, int k)
{
    char *mine = redsem__errbuf(c);
    if (c->ep.kind == REDSEM__EP_CLUSTER || k == 1) {
        for (int i = 0; i < k; i++) {
            redsem__batch_item *it = &items[i];
            redsem__text_copy(mine, it->errmsg);
            it->rc = redsem__eval(c, it->script, it->nkeys, it->ka, it->flags, it->info,
                                  it->ret_reply);
            redsem__text_copy(it->errmsg, mine);
        }
        return;
    }
    redsem__lane *l;
    int rc = redsem__lane_get(c, false, &l);
    if (rc != REDSEM_OK) {
        for (int i = 0; i < k; i++) {
            items[i].rc = rc;
            redsem__text_copy(items[i].errmsg, mine);
            if (items[i].info != NULL)
                *items[i].info = (redsem__req_info){false, 0, 0, -1};
        }
        return;
    }
    lane_caps(c, l);
    int64_t deadline = redsem__ctx_cap(&l->ctx) != 0
                           ? redsem__ctx_cap(&l->ctx)
                           : redsem__deadline_after_ms(c->command_timeout_ms);
    eval_many_on(redsem__topo_node(&l->topo, NULL, 0), items, k, deadline);
    int worst = REDSEM_OK;
    for (int i = 0; i < k; i++)
        if (items[i].rc == REDSEM_ECONN)
            worst = REDSEM_ECONN;
    redsem__lane_put(c, l, worst);
}

int redsem__blpop_alone(redsem_client *c, const char *key, size_t keylen, int64_t wait_ms,
                        int64_t hard_deadline_ns, bool *signaled)
{
    /* a wait cut by a redirection waits on the slot's new owner, within the same deadline */
    blpop_call q = {key, keylen, wait_ms, hard_deadline_ns, signaled};
    return redsem__routed(c, true, key, keylen, REDSEM__REQ_RETRY, NULL, call_blpop, &q);
}

/* What the object layer asks of the node serving a key, outside a request: on a borrowed
 * request lane (every lane's node measures the same server's clock). */
typedef struct node_query {
    int what; /* 0 served by, 1 not after, 2 note server clock */
    char *buf;
    size_t len;
    int64_t server_us, recv_ns, result;
} node_query;

static void query_node(redsem_client *c, const char *key, node_query *q)
{
    redsem__lane *l;
    if (lane_begin(c, false, &l) != REDSEM_OK)
        return; /* nothing known */
    redsem__node *n = redsem__topo_node(&l->topo, key, key != NULL ? strlen(key) : 0);
    if (q->what == 1)
        q->result = n != NULL ? redsem__node_not_after_us(n) : 0;
    else if (q->what == 2 && n != NULL)
        redsem__node_note_server_clock(n, q->server_us, q->recv_ns);
    else if (q->what == 0 && n != NULL && n->ep.kind == REDSEM__EP_UNIX && n->ep.path != NULL)
        snprintf(q->buf, q->len, "%s", n->ep.path);
    else if (q->what == 0 && n != NULL && n->ep.kind == REDSEM__EP_TCP && n->ep.host != NULL)
        snprintf(q->buf, q->len, strchr(n->ep.host, ':') ? "[%s]:%d" : "%s:%d", n->ep.host,
                 n->ep.port);
    lane_end(c, l, REDSEM_OK);
}

void redsem__served_by(redsem_client *c, const char *key, char *buf, size_t len)
{
    snprintf(buf, len, "%s", ""); /* not known (a Sentinel primary not resolved yet) */
    node_query q = {.what = 0, .buf = buf, .len = len};
    query_node(c, key, &q);
}

int64_t redsem__not_after_us(redsem_client *c, const char *key)
{
    if (c->ep.kind != REDSEM__EP_CLUSTER)
        return redsem__clock_not_after_us(&c->clock, c->command_timeout_ms);
    node_query q = {.what = 1};
    query_node(c, key, &q);
    return q.result;
}

void redsem__note_server_clock(redsem_client *c, const char *key, int64_t server_us,
                               int64_t recv_ns)
{
    if (c->ep.kind != REDSEM__EP_CLUSTER) {
        redsem__clock_note(&c->clock, server_us, recv_ns);
        return;
    }
    node_query q = {.what = 2, .server_us = server_us, .recv_ns = recv_ns};
    query_node(c, key, &q);
}

/* ================================================================ client */

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

int redsem__client_open(const redsem_options *o, redsem_client **ret, char *err, size_t errlen)
{
    if (sodium_init() < 0) {
        snprintf(err, errlen, "libsodium failed to initialise");
        return REDSEM_ENOMEM;
    }
    redsem_client *c = redsem__calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    c->pid = getpid();
    c->serial = atomic_fetch_add(&client_serials, 1) + 1;
    redsem__clock_init(&c->clock);
    for (int i = 0; i < REDSEM__SCRIPT_COUNT; i++)
        atomic_init(&c->scripts.sent[i], false);
    atomic_init(&c->scripts.eval_body, false);
    pthread_mutex_init(&c->pool_mu, NULL);
    pthread_mutex_init(&c->renew_mu, NULL);
    pthread_mutex_init(&c->wake_mu, NULL);
    pthread_mutex_init(&c->drive.mu, NULL);
    pthread_cond_init(&c->drive.lane_cv, NULL);
    c->drive_on = o->ep.kind != REDSEM__EP_CLUSTER;
    c->connect_timeout_ms = o->connect_timeout_ms;
    c->command_timeout_ms = o->command_timeout_ms;
    c->retry_ms = o->retry_ms;
    c->prefix = redsem__strdup(o->prefix);
    if (c->prefix == NULL || redsem__endpoint_copy(&c->ep, &o->ep) != REDSEM_OK ||
        redsem__tls_opts_copy(&c->tls, &o->tls) != REDSEM_OK) {
        redsem_client_free(c);
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    c->prefix_len = strlen(c->prefix);
    if ((c->ep.kind == REDSEM__EP_SENTINEL &&
         (c->sentinel_watch = redsem__sentinel_watch_new()) == NULL) ||
        redsem__wake_init(c) != REDSEM_OK ||
        redsem__metrics_init(c, o->metrics_names_max, o->metrics_off) != REDSEM_OK) {
        redsem_client_free(c);
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    if (o->sync_replicas > 0 && o->sync_timeout_ms >= o->command_timeout_ms) {
        snprintf(err, errlen, "the replica sync timeout (%lld ms) must be shorter than the "
                 "command timeout (%lld ms)", (long long)o->sync_timeout_ms,
                 (long long)o->command_timeout_ms);
        redsem_client_free(c);
        return REDSEM_EINVAL;
    }
    c->sync_replicas = o->sync_replicas;
    c->sync_timeout_ms = o->sync_timeout_ms;
    c->max_connections = o->max_connections;
    c->cfg = (redsem__node_cfg){c->connect_timeout_ms, c->command_timeout_ms, c->retry_ms,
                                &c->tls, c->sync_replicas, c->sync_timeout_ms, NULL,
                                o->allow_eviction};
    /* one TLS context for every connection of the client (its files read once, here) */
    if (c->ep.tls && (c->cfg.tls_ctx = redsem__tls_ctx_new(&c->tls, err, errlen)) == NULL) {
        redsem_client_free(c);
        return REDSEM_EINVAL;
    }
    /* the first request lane, connected now: client creation fails early and clearly */
    c->nreq = 1;
    redsem__lane *l = NULL;
    int rc = lane_new(c, false, &l);
    if (rc == REDSEM_OK)
        rc = redsem__topo_connect(&l->topo, err, errlen);
    else
        snprintf(err, errlen, "%s", redsem__errbuf(c));
    if (rc != REDSEM_OK) {
        redsem_client_free(c);
        return rc;
    }
    l->next_idle = NULL;
    c->idle_req = l;
    *ret = c;
    return REDSEM_OK;
}

int redsem_client_new_verbose(const redsem_options *options, redsem_client **ret_client,
                              char *errbuf, size_t errbuf_len)
{
    char err[512] = "";
    if (ret_client == NULL) {
        if (errbuf && errbuf_len)
            snprintf(errbuf, errbuf_len, "ret_client is NULL");
        return REDSEM_EINVAL;
    }
    redsem_options *defaults = NULL;
    if (options == NULL) {
        int rc = redsem_options_new(&defaults);
        if (rc != REDSEM_OK) {
            if (errbuf && errbuf_len)
                snprintf(errbuf, errbuf_len, "out of memory");
            return rc;
        }
        options = defaults;
    }
    int rc = redsem__client_open(options, ret_client, err, sizeof err);
    redsem_options_free(defaults);
    if (rc != REDSEM_OK && errbuf && errbuf_len)
        snprintf(errbuf, errbuf_len, "%s", err);
    return rc;
}

int redsem_client_new(const redsem_options *options, redsem_client **ret_client)
{
    return redsem_client_new_verbose(options, ret_client, NULL, 0);
}

int redsem_client_connect(const char *url, redsem_client **ret_client)
{
    if (ret_client == NULL)
        return REDSEM_EINVAL;
    redsem_options *o = NULL;
    int rc = redsem_options_new(&o);
    if (rc == REDSEM_OK && url != NULL)
        rc = redsem_options_set_url(o, url);
    if (rc == REDSEM_OK)
        rc = redsem_client_new(o, ret_client);
    redsem_options_free(o);
    return rc;
}

void redsem_client_free(redsem_client *c)
{
    if (c == NULL)
        return;
    if (c->renewer != NULL)
        c->renew_ops->stop(c);
    for (size_t i = 0; i < c->nlanes; i++) {
        redsem__topo_close(&c->lanes[i]->topo);
        redsem__free(c->lanes[i]);
    }
    redsem__free(c->lanes);
    redsem__free(c->stats_ctx);
    redsem__sentinel_watch_free(c->sentinel_watch); /* after the lanes that point to it */
    if (c->pid == getpid()) {
        /* in a forked child another thread of the parent may have held them: leave them */
        pthread_mutex_destroy(&c->pool_mu);
        pthread_mutex_destroy(&c->renew_mu);
        pthread_mutex_destroy(&c->wake_mu);
        pthread_mutex_destroy(&c->drive.mu);
        pthread_cond_destroy(&c->drive.lane_cv);
    }
    redsem__free(c->drive.pipe.out); /* (its lane was closed above) */
    for (drive_waker *k = c->drive.all_wakers, *next; k != NULL; k = next) {
        next = k->next_all;
        sem_destroy(&k->sem);
        redsem__free(k);
    }
    redsem__wake_free(c); /* in a forked child also the parent's parked waits (memory) */
    redsem__endpoint_clear(&c->ep);
    redsem__tls_opts_clear(&c->tls);
    redsem__tls_ctx_free(c->cfg.tls_ctx); /* the lanes' nodes dropped theirs */
    redsem__metrics_free(c);
    redsem__free(c->prefix);
    redsem__free(c);
}

/* PING on a borrowed lane, its error reply classified by the node that sent it. */
static int call_ping(redsem__node *n, void *arg)
{
    (void)arg;
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, "PING");
    redisReply *r = NULL;
    int rc = redsem__node_request(n, &a, REDSEM__REQ_RETRY, 0, &r, NULL);
    if (rc != REDSEM_OK)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        rc = redsem__node_error_reply(n, r, "PING");
    else if (r->type != REDIS_REPLY_STATUS)
        rc = redsem__ctx_err(n->ctx, REDSEM_EPROTO, "PING: unexpected reply");
    freeReplyObject(r);
    return rc;
}

int redsem_client_ping(redsem_client *c)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    return redsem__routed(c, false, NULL, 0, REDSEM__REQ_RETRY, NULL, call_ping, NULL);
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
    pthread_mutex_lock(&c->pool_mu);
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
    pthread_mutex_unlock(&c->pool_mu);
}

void redsem__stats_detach(redsem_client *c, redsem__ctx *ctx)
{
    pthread_mutex_lock(&c->pool_mu);
    for (size_t i = 0; i < c->nstats_ctx; i++)
        if (c->stats_ctx[i] == ctx) {
            stats_add(&c->stats_gone, &ctx->stats);
            c->stats_ctx[i] = c->stats_ctx[--c->nstats_ctx];
            break;
        }
    pthread_mutex_unlock(&c->pool_mu);
}

int redsem_client_get_stats(const redsem_client *c, redsem_client_stats *ret_stats)
{
    if (c == NULL || ret_stats == NULL)
        return REDSEM_EINVAL;
    memset(ret_stats, 0, sizeof *ret_stats);
    redsem_client *m = (redsem_client *)c; /* the pool's lock only */
    pthread_mutex_lock(&m->pool_mu);
    for (size_t i = 0; i < c->nlanes; i++)
        stats_add(ret_stats, &c->lanes[i]->ctx.stats);
    for (size_t i = 0; i < c->nstats_ctx; i++)
        stats_add(ret_stats, &c->stats_ctx[i]->stats);
    stats_add(ret_stats, &c->stats_gone);
    ret_stats->pool_waits = c->pool_waits;
    ret_stats->direct_grants = __atomic_load_n(&c->direct_grants, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&m->pool_mu);
    return REDSEM_OK;
}
