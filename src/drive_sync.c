/* redsem - the blocking driver of the engine: every blocking call of a client (an acquire
 * with its waits, a release, a refresh, a status, a script call, a command) is an op of the
 * client's engine (drive_loop.c), and the calling threads drive that engine themselves, as
 * libpq's PQexec is PQsendQuery plus a poll: a thread starts its op under the engine's mutex
 * (its request written at once while few are in flight, REDSEM__BATCH_MAX, or no thread
 * drives), then, if no thread drives, drives until its own op ends: polls the engine's
 * descriptors until its earliest deadline (the mutex let go), steps it, and wakes each thread
 * whose op ended. When its op ends, the role goes to the thread of the oldest op still under
 * way. The other threads sleep on a semaphore of their own until their op ends or the role
 * comes to them. One mechanism for requests and waits: a waiting acquire's BLPOP is a request
 * of the engine's wait connection, stepped by whichever thread drives. docs/design.md
 * section 13. */
#include <errno.h>
#include <poll.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "internal.h"

/* A thread's wake-up: a semaphore, posted once the engine's mutex is let go (so that the
 * woken thread does not wake into a held mutex). Kept by the client and reused, never freed
 * before it: a post that comes after its thread went on only makes its next user look again
 * early (every wait re-checks its condition under the mutex). */
typedef struct sync_waker {
    sem_t sem;
    struct sync_waker *next, *next_all;
} sync_waker;

typedef struct sync_wait sync_wait;

/* One op of a blocking call, and its outcome. */
typedef struct sync_slot {
    sync_wait *w;
    int rc;
    char err[REDSEM__ERRMSG_LEN]; /* the stepping thread's error text at its end */
    redsem_permit *permit;        /* an acquire's */
    struct redisReply *reply;     /* a call's, kept for the caller (NULL: not wanted) */
    bool keep;                    /* the caller wants the reply */
    redsem__req_info info;
    /* NULL, or the caller's judgement of the outcome, run inside the engine */
    redsem__loop_reply judge;
    void *judge_arg;
} sync_slot;

/* A thread blocked on its ops (one, or k at once: redsem__eval_many). */
struct sync_wait {
    redsem__sync *S;
    sync_waker *k;
    int left;     /* its ops not ended yet */
    bool awake;   /* its thread is not asleep (it drives, or starts its ops): no post needed */
    bool listed;  /* on S's list of sleeping threads */
    sync_wait *next, *prev;
};

#define SYNC_POSTS_MAX 64

struct redsem__sync {
    redsem_client *c;
    pthread_mutex_t mu;
    redsem__loop *loop; /* made at the first call */
    int efd;            /* an eventfd in the driver's poll: a new op wants what it does not watch */
    bool driving;       /* a thread drives the engine: */
    sync_wait *driver;  /* ... the one whose ops these are */
    bool polling;       /* ... and sleeps in poll(): what it watches: */
    unsigned polled_gen;
    int64_t polled_dl;
    int npolled;
    redsem__loop_watch polled[REDSEM__LOOP_WATCH_MAX];
    sync_wait *head, *tail; /* threads asleep on their ops, oldest first */
    sync_waker *free_wakers, *all_wakers;
    sync_waker *posts[SYNC_POSTS_MAX]; /* the wake-ups of ops that ended, to post */
    int nposts;
    /* Sentinel: the Sentinels and the primary's node, for taking the client's watch's
     * subscription on a calling thread (keep_watch), under keep_mu; made at first use */
    pthread_mutex_t keep_mu;
    bool keep_made;
    redsem__ctx keep_ctx;
    redsem__topo keep_topo;
};

int redsem__sync_new(redsem_client *c)
{
    redsem__sync *S = redsem__calloc(1, sizeof *S);
    if (S == NULL)
        return REDSEM_ENOMEM;
    S->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (S->efd < 0) {
        redsem__free(S);
        return REDSEM_ECONN;
    }
    pthread_mutex_init(&S->mu, NULL);
    pthread_mutex_init(&S->keep_mu, NULL);
    S->c = c;
    c->sync = S;
    return REDSEM_OK;
}

void redsem__sync_free(redsem_client *c)
{
    redsem__sync *S = c->sync;
    if (S == NULL)
        return;
    /* in a forked child: memory and this process's copies of the descriptors only (the
     * engine sends nothing as it goes; the mutex may have been held by a parent's thread) */
    redsem__loop_free(S->loop);
    close(S->efd);
    for (sync_waker *k = S->all_wakers, *next; k != NULL; k = next) {
        next = k->next_all;
        sem_destroy(&k->sem);
        redsem__free(k);
    }
    if (S->keep_made)
        redsem__topo_close(&S->keep_topo);
    if (c->pid == getpid()) {
        pthread_mutex_destroy(&S->mu);
        pthread_mutex_destroy(&S->keep_mu);
    }
    redsem__free(S);
    c->sync = NULL;
}

/* Under S->mu: a wake-up for the calling thread (NULL without memory), and back. */
static sync_waker *waker_take(redsem__sync *S)
{
    sync_waker *k = S->free_wakers;
    if (k != NULL) {
        S->free_wakers = k->next;
        return k;
    }
    k = redsem__calloc(1, sizeof *k);
    if (k != NULL) {
        sem_init(&k->sem, 0, 0);
        k->next_all = S->all_wakers;
        S->all_wakers = k;
    }
    return k;
}

static void waker_give(redsem__sync *S, sync_waker *k)
{
    while (sem_trywait(&k->sem) == 0)
        ; /* a post it did not wait for: its next user waits for its own */
    k->next = S->free_wakers;
    S->free_wakers = k;
}

/* Under S->mu: w sleeps (on the list, oldest first), or not. */
static void list_add(redsem__sync *S, sync_wait *w)
{
    REDSEM__LIST_APPEND(S, w);
    w->listed = true;
}

static void list_del(redsem__sync *S, sync_wait *w)
{
    if (!w->listed)
        return;
    REDSEM__LIST_UNLINK(S, w);
    w->listed = false;
}

/* Under S->mu: post the wake-ups collected, the mutex let go meanwhile. */
static void post_all(redsem__sync *S)
{
    int n = S->nposts;
    if (n == 0)
        return;
    sync_waker *v[SYNC_POSTS_MAX];
    memcpy(v, S->posts, (size_t)n * sizeof v[0]);
    S->nposts = 0;
    pthread_mutex_unlock(&S->mu);
    for (int i = 0; i < n; i++)
        sem_post(&v[i]->sem);
    pthread_mutex_lock(&S->mu);
}

/* Under S->mu (from inside the engine): one of w's ops ended; a sleeping w whose last op
 * ended is woken (once the mutex is let go). */
static void slot_end(sync_slot *sl, int rc)
{
    sync_wait *w = sl->w;
    redsem__sync *S = w->S;
    sl->rc = rc;
    if (rc != REDSEM_OK) /* set on this thread by the engine, just now */
        redsem__text_copy(sl->err, redsem__errbuf(S->c));
    if (--w->left > 0)
        return;
    if (w == S->driver && S->polling) { /* ended by another thread's step: wake the driver */
        uint64_t one = 1;
        (void)write(S->efd, &one, sizeof one);
        S->polling = false;
        return;
    }
    if (w->awake)
        return;
    list_del(S, w);
    if (S->nposts < SYNC_POSTS_MAX)
        S->posts[S->nposts++] = w->k;
    else
        sem_post(&w->k->sem);
}

static void on_done(void *arg, int rc, redsem_permit *p)
{
    sync_slot *sl = arg;
    sl->permit = p;
    slot_end(sl, rc);
}

static int on_reply(void *arg, int rc, redisReply **r, const redsem__req_info *info)
{
    sync_slot *sl = arg;
    if (info != NULL)
        sl->info = *info;
    if (sl->judge != NULL)
        return sl->judge(sl->judge_arg, rc, r, info);
    if (rc == REDSEM_OK && sl->keep) {
        sl->reply = *r;
        *r = NULL;
    }
    return rc;
}

/* Under S->mu: whether the driver asleep in poll() watches less than the engine wants now (a
 * connection opened or closed, a descriptor's events, an earlier deadline). */
static bool wants_more(redsem__sync *S)
{
    redsem__loop_watch w[REDSEM__LOOP_WATCH_MAX];
    int64_t dl;
    int n = redsem__loop_wants(S->loop, w, &dl);
    if (dl < S->polled_dl || redsem__loop_generation(S->loop) != S->polled_gen)
        return true;
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < S->npolled && !seen; j++)
            seen = S->polled[j].fd == w[i].fd && (w[i].events & ~S->polled[j].events) == 0;
        if (!seen)
            return true;
    }
    return false;
}

/* Under S->mu, after ops were started: their requests are written now while few are in
 * flight or no thread drives (else the driver writes them, with the others queued
 * meanwhile, in one write, the moment it wakes for the replies of those in flight: the
 * connection does not idle between batches); a driver asleep in poll() that does not watch
 * what they need is woken. Measured on the shared connection of 0.5 (bench -w threads
 * --shared, basic): written always at once, 8 threads 0.88-0.93x their floor and 32 threads
 * 1.0x; always by the driver, 0.65x and 1.3x; this, 0.95-1.0x and 1.4-1.5x. */
static void kick(redsem__sync *S)
{
    if (!S->driving || redsem__loop_inflight(S->loop) <= REDSEM__BATCH_MAX)
        redsem__loop_step(S->loop, NULL, 0);
    if (S->polling && wants_more(S)) {
        uint64_t one = 1;
        (void)write(S->efd, &one, sizeof one);
        S->polling = false; /* told once */
    }
}

/* One turn of the driver: poll the engine's descriptors (and the eventfd) for what it wants
 * until its earliest deadline, the mutex let go, then step it. */
static void turn(redsem__sync *S)
{
    struct pollfd p[REDSEM__LOOP_WATCH_MAX + 1];
    int64_t dl;
    int n = redsem__loop_wants(S->loop, S->polled, &dl);
    S->npolled = n;
    S->polled_dl = dl;
    S->polled_gen = redsem__loop_generation(S->loop);
    for (int i = 0; i < n; i++)
        p[i] = (struct pollfd){S->polled[i].fd, S->polled[i].events, 0};
    p[n] = (struct pollfd){S->efd, POLLIN, 0};
    int64_t left = dl == REDSEM__FOREVER ? -1 : dl - redsem__now_ns();
    if (dl != REDSEM__FOREVER && left < 0)
        left = 0;
    struct timespec ts = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
    S->polling = true;
    pthread_mutex_unlock(&S->mu);
    int r = ppoll(p, (nfds_t)n + 1, left < 0 ? NULL : &ts, NULL);
    pthread_mutex_lock(&S->mu);
    S->polling = false;
    if (r > 0 && p[n].revents != 0) {
        uint64_t v;
        (void)read(S->efd, &v, sizeof v);
    }
    int k = 0;
    for (int i = 0; r > 0 && i < n; i++)
        if (p[i].revents != 0)
            p[k++] = p[i];
    redsem__loop_step(S->loop, p, k);
    post_all(S);
}

/* Under S->mu: wait until w's ops ended, driving the engine while no other thread does;
 * then the role goes to the oldest thread asleep on its ops (returned, to post once the
 * mutex is let go; NULL: none). */
static sync_waker *wait_ops(redsem__sync *S, sync_wait *w)
{
    while (w->left > 0) {
        if (!S->driving) {
            S->driving = true;
            S->driver = w;
            while (w->left > 0)
                turn(S);
            S->driving = false;
            S->driver = NULL;
            return S->head != NULL ? S->head->k : NULL;
        }
        w->awake = false;
        list_add(S, w);
        pthread_mutex_unlock(&S->mu);
        while (sem_wait(&w->k->sem) != 0)
            ; /* EINTR */
        pthread_mutex_lock(&S->mu);
        list_del(S, w);
        w->awake = true;
    }
    return NULL;
}

/* A Sentinel client: the watch of the Sentinels' announcements subscribed, if it is not
 * (the engine only reads it): on this thread, before the call, outside the engine's lock;
 * one thread at a time. */
static void keep_watch(redsem__sync *S)
{
    redsem_client *c = S->c;
    if (c->sentinel_watch == NULL)
        return;
    pthread_mutex_lock(&S->keep_mu);
    if (!S->keep_made) {
        char err[REDSEM__ERRMSG_LEN];
        S->keep_made = redsem__topo_init(&S->keep_topo, &S->keep_ctx, &c->ep, &c->cfg, err,
                                         sizeof err) == REDSEM_OK;
        if (S->keep_made)
            S->keep_topo.watch = c->sentinel_watch;
        else
            redsem__topo_close(&S->keep_topo);
    }
    if (S->keep_made)
        redsem__sentinel_keep(&S->keep_topo, &S->keep_topo.single);
    pthread_mutex_unlock(&S->keep_mu);
}

typedef int (*sync_start)(redsem__loop *l, sync_slot *sl, void *arg);

/* Run k ops of the calling thread (start(l, slot, arg) each; 1..REDSEM__BATCH_MAX) on c's
 * engine and wait until all ended; their outcomes in sl[0..k). REDSEM_OK, or the failure to
 * make the engine (every slot's rc then). */
static int run(redsem_client *c, sync_slot *sl, int k, sync_start start, void *const *args)
{
    redsem__sync *S = c->sync;
    sync_wait w = {.S = S, .left = k, .awake = true};
    /* the engine sets the text of whatever it steps on this thread: the caller's is kept,
     * and its ops' own go to their slots */
    char saved[REDSEM__ERRMSG_LEN];
    redsem__text_copy(saved, redsem__errbuf(c));
    for (int i = 0; i < k; i++) {
        sl[i].w = &w;
        sl[i].rc = REDSEM_OK;
        sl[i].err[0] = '\0';
    }
    keep_watch(S);
    pthread_mutex_lock(&S->mu);
    int rc = S->loop != NULL ? REDSEM_OK : redsem__loop_new(c, &S->loop);
    w.k = rc == REDSEM_OK ? waker_take(S) : NULL;
    if (rc == REDSEM_OK && w.k == NULL)
        rc = redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    if (rc != REDSEM_OK) {
        pthread_mutex_unlock(&S->mu);
        for (int i = 0; i < k; i++) {
            sl[i].rc = rc;
            redsem__text_copy(sl[i].err, redsem__errbuf(c));
        }
        return rc;
    }
    for (int i = 0; i < k; i++) {
        int src = start(S->loop, &sl[i], args[i]);
        if (src != REDSEM_OK) /* not started: no callback comes */
            slot_end(&sl[i], src);
    }
    kick(S);
    post_all(S);
    sync_waker *next = wait_ops(S, &w);
    waker_give(S, w.k);
    pthread_mutex_unlock(&S->mu);
    if (next != NULL)
        sem_post(&next->sem);
    redsem__text_copy(redsem__errbuf(c), saved);
    return REDSEM_OK;
}

/* ---------------------------------------------------------------- the blocking calls */

typedef struct acq_args {
    const redsem__acquirer *q;
    const redsem__kind *kind;
    const char *id;
    int64_t timeout_ms, lease_ms;
} acq_args;

static int start_acquire(redsem__loop *l, sync_slot *sl, void *arg)
{
    const acq_args *a = arg;
    return redsem__loop_acquire(l, a->q, a->kind, a->id, a->timeout_ms, a->lease_ms, 0,
                                on_done, sl, NULL);
}

int redsem__acquire_permit(const redsem__acquirer *q, const redsem__kind *kind, const char *id,
                           int64_t timeout_ms, int64_t lease_ms, redsem_permit **ret_permit)
{
    acq_args a = {q, kind, id, timeout_ms, lease_ms};
    void *args[1] = {&a};
    sync_slot sl = {.keep = false};
    (void)run(q->client, &sl, 1, start_acquire, args);
    if (sl.rc != REDSEM_OK)
        return redsem__set_err(q->client, sl.rc, "%s", sl.err);
    *ret_permit = sl.permit;
    return REDSEM_OK;
}

static int start_call(redsem__loop *l, sync_slot *sl, void *arg)
{
    return redsem__loop_run(l, arg, on_reply, on_done, sl);
}

/* The outcome of one call's slot for its caller: its code (the error text set), its reply
 * and info. */
static int call_outcome(redsem_client *c, const sync_slot *sl, redsem__req_info *info,
                        redisReply **ret_reply)
{
    if (info != NULL)
        *info = sl->info;
    if (sl->rc != REDSEM_OK)
        return redsem__set_err(c, sl->rc, "%s", sl->err);
    if (ret_reply != NULL)
        *ret_reply = sl->reply;
    else if (sl->reply != NULL)
        freeReplyObject(sl->reply);
    return REDSEM_OK;
}

int redsem__call_run(redsem_client *c, redsem__call *call, redsem__req_info *info,
                     redisReply **ret_reply)
{
    if (call->cap_ns == 0)
        call->cap_ns = redsem__call_cap(c); /* the renewer's, an acquire leaving a queue */
    void *args[1] = {call};
    sync_slot sl = {.keep = true, .info = {false, 0, 0, -1}};
    (void)run(c, &sl, 1, start_call, args);
    return call_outcome(c, &sl, info, ret_reply);
}

int redsem__call_judged(redsem_client *c, redsem__call *call, redsem__loop_reply judge,
                        void *arg)
{
    if (call->cap_ns == 0)
        call->cap_ns = redsem__call_cap(c);
    void *args[1] = {call};
    sync_slot sl = {.info = {false, 0, 0, -1}, .judge = judge, .judge_arg = arg};
    (void)run(c, &sl, 1, start_call, args);
    return call_outcome(c, &sl, NULL, NULL);
}

/* The call of a batch item (its arguments copied: their numbers' pointers lead into the
 * item's, which lives on). */
static void item_call(redsem_client *c, const redsem__batch_item *it, redsem__call *call)
{
    redsem__call_init(call, it->script, it->flags, NULL);
    call->nkeys = it->nkeys;
    call->ka = *it->ka;
    call->cap_ns = redsem__call_cap(c);
}

int redsem__eval(redsem_client *c, int script, int nkeys, const redsem__args *ka, int flags,
                 redsem__req_info *info, redisReply **ret_reply)
{
    redsem__batch_item it = {script, nkeys, ka, flags, NULL, NULL, NULL, REDSEM_OK};
    redsem__call call;
    item_call(c, &it, &call);
    return redsem__call_run(c, &call, info, ret_reply);
}

void redsem__eval_many(redsem_client *c, redsem__batch_item *items, int k)
{
    redsem__call calls[REDSEM__BATCH_MAX];
    sync_slot sl[REDSEM__BATCH_MAX];
    void *args[REDSEM__BATCH_MAX] = {NULL};
    for (int i = 0; i < k; i++) {
        item_call(c, &items[i], &calls[i]);
        args[i] = &calls[i];
        sl[i] = (sync_slot){.keep = items[i].ret_reply != NULL, .info = {false, 0, 0, -1}};
    }
    (void)run(c, sl, k, start_call, args);
    for (int i = 0; i < k; i++) {
        items[i].rc = call_outcome(c, &sl[i], items[i].info, items[i].ret_reply);
        if (items[i].rc != REDSEM_OK)
            redsem__text_copy(items[i].errmsg, sl[i].err);
    }
}

int redsem__request(redsem_client *c, const redsem__args *a, int flags, int64_t deadline_ns,
                    redisReply **ret_reply, redsem__req_info *info)
{
    redsem__call call;
    redsem__call_init(&call, REDSEM__SCRIPT_NONE, flags, NULL);
    call.ka = *a;
    call.cap_ns = deadline_ns;
    return redsem__call_run(c, &call, info, ret_reply);
}

/* PING's reply: PONG, or its error reply classified by the node that sent it (the engine's:
 * this runs inside it, on the thread stepping it). */
static int ping_reply(void *arg, int rc, redisReply **r, const redsem__req_info *info)
{
    sync_slot *sl = arg;
    (void)info;
    if (rc != REDSEM_OK)
        return rc;
    redsem_client *c = sl->w->S->c;
    redsem__loop *l = redsem__loop_current(c);
    redsem__node *n = l != NULL ? redsem__loop_node(l, NULL) : NULL;
    if ((*r)->type == REDIS_REPLY_ERROR && n != NULL) {
        rc = redsem__node_error_reply(n, *r, "PING");
        return redsem__set_err(c, rc == REDSEM__EREDIRECT ? REDSEM_ESERVER : rc, "%s",
                               n->ctx->errmsg);
    }
    if ((*r)->type != REDIS_REPLY_STATUS)
        return redsem__set_err(c, REDSEM_EPROTO, "PING: unexpected reply");
    return REDSEM_OK;
}

static int start_ping(redsem__loop *l, sync_slot *sl, void *arg)
{
    return redsem__loop_run(l, arg, ping_reply, on_done, sl);
}

int redsem__sync_ping(redsem_client *c, int flags)
{
    redsem__call call;
    redsem__call_init(&call, REDSEM__SCRIPT_NONE, flags, NULL);
    redsem__args_str(&call.ka, "PING");
    void *args[1] = {&call};
    sync_slot sl = {.keep = false, .info = {false, 0, 0, -1}};
    (void)run(c, &sl, 1, start_ping, args);
    return call_outcome(c, &sl, NULL, NULL);
}

static int start_open(redsem__loop *l, sync_slot *sl, void *arg)
{
    (void)arg;
    return redsem__loop_open(l, on_done, sl);
}

int redsem__sync_open(redsem_client *c)
{
    void *args[1] = {NULL};
    sync_slot sl = {.keep = false, .info = {false, 0, 0, -1}};
    (void)run(c, &sl, 1, start_open, args);
    return call_outcome(c, &sl, NULL, NULL);
}

typedef struct wait_args {
    const char *key, *elem;
    int64_t wait_ms, cut_ns, since_ns;
    bool *signaled;
    redsem__wake_grant *grant;
} wait_args;

static int start_wait(redsem__loop *l, sync_slot *sl, void *arg)
{
    const wait_args *a = arg;
    return redsem__loop_wait(l, a->key, a->elem, a->wait_ms, a->cut_ns, a->since_ns,
                             a->signaled, a->grant, on_done, sl);
}

int redsem__blpop(redsem_client *c, const char *key, size_t keylen, const char *elem,
                  int64_t wait_ms, int64_t hard_deadline_ns, int64_t since_ns, bool *signaled,
                  redsem__wake_grant *grant)
{
    (void)keylen;
    redsem__wake_grant none;
    wait_args a = {key, elem, wait_ms, hard_deadline_ns, since_ns, signaled,
                   grant != NULL ? grant : &none};
    void *args[1] = {&a};
    sync_slot sl = {.info = {false, 0, 0, -1}};
    (void)run(c, &sl, 1, start_wait, args);
    return call_outcome(c, &sl, NULL, NULL);
}

int redsem__wake_waiters(redsem_client *c)
{
    redsem__sync *S = c->sync;
    pthread_mutex_lock(&S->mu);
    int n = S->loop != NULL ? (int)redsem__loop_waiting(S->loop) : 0;
    pthread_mutex_unlock(&S->mu);
    return n;
}
