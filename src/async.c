/* redsem - the event-loop API (include/redsem/async.h): every operation is a state machine of
 * the engine (drive_loop.c) stepped on the loop's thread; the engine's descriptors and a
 * timerfd at its earliest deadline are in one epoll set, the one descriptor the loop watches.
 * The library starts no thread for it (docs/design.md sections 12 and 16).
 *
 * An operation started from a callback of redsem_async_action() (the loop's thread, inside
 * its report) starts on the engine at once; one started anywhere else is queued (incoming)
 * and the pipe's byte makes the loop report, which starts it. A decided operation goes on the
 * done list, and redsem_async_action() runs the callbacks, on the loop's thread. A cancel
 * drops a queued operation or sets a waiting acquire's flag, which the engine reads. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "redsem/async.h"
#include "internal.h"

typedef enum op_kind {
    OP_SEM_ACQUIRE,
    OP_LOCK_ACQUIRE,
    OP_REFRESH,
    OP_RELEASE,
    OP_SEM_STATUS,
    OP_LOCK_STATUS,
} op_kind;

typedef enum op_state { ST_QUEUED, ST_RUNNING, ST_DONE } op_state;

struct redsem_async;

typedef struct op {
    struct op *next, *prev; /* in the incoming, engine or done list */
    struct op_list *in;     /* that list, as pushed (NULL: none; not kept past done) */
    uint64_t id;
    op_kind kind;
    op_state state;
    bool waits; /* a blocking acquire: cancellable while it runs */
    void *handle;
    uint32_t n;
    int64_t timeout_ms;
    /* a waiting acquire's deadline, counted from its submission (redsem__now_ns(); 0: none,
     * REDSEM_WAIT_FOREVER) */
    int64_t deadline_ns;
    int64_t submit_ns; /* when it was submitted (redsem__now_ns()) */
    size_t max_entries;
    redsem_async_cb cb;
    void *user;
    atomic_bool cancel;
    int rc;
    char errmsg[REDSEM__ERRMSG_LEN];
    redsem_permit *permit;
    redsem_status *status;
    struct redsem_async *async;
    atomic_bool *loop_cancel; /* an acquire on the engine: its cancel flag */
    int loop_script;          /* a call on the engine: its script */
} op;

typedef struct op_list {
    op *head, *tail;
} op_list;


struct redsem_async {
    redsem_client *c;
    pid_t pid;
    pthread_mutex_t mu;
    op_list done, delivering;
    bool closing, notified;
    int pipefd[2];
    redsem_async_socket_fn socket_fn;
    redsem_async_timer_fn timer_fn;
    void *loop_data;
    bool loop_set;
    uint64_t next_id;
    atomic_size_t pending;
    /* The engine (drive_loop.c): the loop watches epfd, an epoll set of the pipe and the
     * engine's descriptors (its connections, and while one opens c-ares' sockets: one
     * descriptor for the loop, as 0.4's adapters watch), and of a timerfd at the engine's
     * deadline (tfd). */
    int epfd;
    redsem__loop *loop;
    int loop_fd[REDSEM__LOOP_WATCH_MAX];      /* the descriptors in the set (-1: none) */
    uint32_t loop_ev[REDSEM__LOOP_WATCH_MAX]; /* and their epoll events */
    unsigned loop_gen;    /* the engine's connections' generation they are of */
    int64_t timer_ns;     /* the time tfd is armed at (0: disarmed, or it fired) */
    /* the engine's timer: a timerfd in the epoll set, so that epfd becomes readable when a
     * deadline is due (the loop's timer_fn is not used: docs/design.md 16) */
    int tfd;
    op_list looping;      /* operations on the engine */
    /* submitted outside a callback of redsem_async_action() (another thread, or the loop's
     * own between two reports): started by the loop's next report (loop_take), in order */
    op_list incoming;
    redsem__renewer *renewer; /* renews the permits granted on the engine (renew.c) */
};

/* The redsem_async whose redsem_async_action() runs on this thread (NULL: none): an
 * operation started from one of its callbacks starts on the engine at once. */
static _Thread_local redsem_async *acting;

static void list_push(op_list *l, op *o)
{
    REDSEM__LIST_APPEND(l, o);
    o->in = l;
}

static op *list_pop(op_list *l)
{
    op *o = l->head;
    if (o != NULL) {
        REDSEM__LIST_UNLINK(l, o);
        o->in = NULL;
    }
    return o;
}

/* o out of l, in constant time (a loop's thousand operations end one by one); false if o
 * is not in l. */
static bool list_remove(op_list *l, op *o)
{
    if (o->in != l)
        return false;
    REDSEM__LIST_UNLINK(l, o);
    o->in = NULL;
    return true;
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

/* Run the callbacks of the done list; returns how many ran. */
static int run_callbacks(redsem_async *a)
{
    pthread_mutex_lock(&a->mu);
    /* taken over as a whole (what finishes from now on waits for the next report), but
     * popped one by one under mu, so that a cancel from a callback finds its sibling still
     * delivering (REDSEM_ESTATE) */
    if (a->delivering.tail != NULL) {
        a->delivering.tail->next = a->done.head;
        if (a->done.head != NULL)
            a->done.head->prev = a->delivering.tail;
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
    a->c = client;
    a->pid = getpid();
    pthread_mutex_init(&a->mu, NULL);
    a->next_id = 1;
    atomic_init(&a->pending, 0);
    *ret_async = a;
    return REDSEM_OK;
}

static int loop_timerfd_new(redsem_async *a);

/* The engine of a (its operations' state machines), its timerfd and the renewer of the
 * permits granted there, made before the loop is published (other threads may submit from
 * then on). REDSEM_OK, or the failure (the client's error text set), nothing made. */
static int engine_new(redsem_async *a, redsem__loop **engine, redsem__renewer **renewer,
                      int *tfd)
{
    *engine = NULL;
    *renewer = NULL;
    int rc = redsem__loop_new(a->c, engine);
    if (rc != REDSEM_OK)
        return rc;
    if ((*tfd = loop_timerfd_new(a)) < 0)
        rc = redsem__set_err(a->c, REDSEM_ECONN, "timerfd: %s", strerror(errno));
    else
        rc = redsem__renew_loop_new(a->c, a->pipefd[1], renewer);
    if (rc != REDSEM_OK) {
        redsem__loop_free(*engine);
        *engine = NULL;
        if (*tfd >= 0) {
            (void)epoll_ctl(a->epfd, EPOLL_CTL_DEL, *tfd, NULL);
            close(*tfd);
        }
    }
    return rc;
}

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
    pthread_mutex_lock(&async->mu);
    bool was = async->loop_set;
    pthread_mutex_unlock(&async->mu);
    if (was)
        return redsem__set_err(async->c, REDSEM_ESTATE, "a loop is set already");
    redsem__loop *engine;
    redsem__renewer *renewer;
    int tfd = -1;
    int rc = engine_new(async, &engine, &renewer, &tfd);
    if (rc != REDSEM_OK)
        return rc;
    pthread_mutex_lock(&async->mu);
    was = async->loop_set;
    if (!was) {
        async->socket_fn = socket_fn;
        async->timer_fn = timer_fn;
        async->loop_data = loop_data;
        async->loop_set = true;
        async->loop = engine;
        async->renewer = renewer;
        async->tfd = tfd;
    }
    pthread_mutex_unlock(&async->mu);
    if (was) { /* set by another thread meanwhile: ours goes */
        redsem__loop_free(engine);
        redsem__renew_loop_close(renewer); /* off the client's list of loop renewers */
        redsem__renew_loop_put(renewer);
        (void)epoll_ctl(async->epfd, EPOLL_CTL_DEL, tfd, NULL);
        close(tfd);
        return redsem__set_err(async->c, REDSEM_ESTATE, "a loop is set already");
    }
    socket_fn(async, async->epfd, REDSEM_WATCH_IN, loop_data);
    if (timer_fn != NULL)
        timer_fn(async, -1, loop_data);
    return REDSEM_OK;
}

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

/* o, on the engine, ends: its callback is queued for the loop's report. */
static void loop_end(op *o)
{
    redsem_async *a = o->async;
    pthread_mutex_lock(&a->mu);
    list_remove(&a->looping, o);
    finish(a, o);
    pthread_mutex_unlock(&a->mu);
}

static void loop_release_call(void *arg, redsem__call *call);
static int loop_release_reply(void *arg, int rc, struct redisReply **r,
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
 * at the last moment (leaving its queue) is first released on the engine. */
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

static int loop_release_reply(void *arg, int rc, struct redisReply **r,
                              const redsem__req_info *info)
{
    redsem_permit *p = ((op *)arg)->handle;
    rc = p->kind->release_reply(p->client, p->handle, p, rc, *r, info);
    return redsem__release_end(p, rc);
}

/* A refresh on the engine, and a status. */
static void loop_refresh_call(void *arg, redsem__call *call)
{
    op *o = arg;
    redsem__refresh_call(o->handle, call);
    o->loop_script = call->script;
}

static int loop_refresh_reply(void *arg, int rc, struct redisReply **r,
                              const redsem__req_info *info)
{
    op *o = arg;
    redsem_permit *p = o->handle;
    int64_t sent = 0;
    rc = redsem__refresh_reply(p->client, p, o->loop_script, rc, *r, info, &sent);
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

static int loop_status_reply(void *arg, int rc, struct redisReply **r,
                             const redsem__req_info *info)
{
    (void)info;
    op *o = arg;
    redsem_client *c = o->async->c;
    const char *key = o->kind == OP_SEM_STATUS ? ((redsem_sem *)o->handle)->k_meta
                                               : ((redsem_lock *)o->handle)->k_mutex;
    return rc != REDSEM_OK ? rc : redsem__status_from_reply(c, key, *r, &o->status);
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
        if (atomic_load(&o->cancel)) {
            redsem__loop_cancel(a->loop, cancel);
        }
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
    if (o->loop_cancel != NULL) { /* NULL: being started; loop_start passes the flag on */
        redsem__loop_cancel(a->loop, o->loop_cancel);
    }
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
            if (o->loop_cancel != NULL) {
                redsem__loop_cancel(a->loop, o->loop_cancel);
            }
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

int redsem_async_action(redsem_async *async, int fd, int events)
{
    (void)events;
    if (async == NULL)
        return REDSEM_EINVAL;
    if (async->pid != getpid())
        return redsem__set_err(async->c, REDSEM_EFORKED,
                               "this redsem_async was created by process %ld (after fork)",
                               (long)async->pid);
    if (fd != -1 && fd != async->epfd)
        return redsem__set_err(async->c, REDSEM_EINVAL, "descriptor %d was not asked for", fd);
    if (async->loop != NULL)
        return loop_action(async, fd);
    struct epoll_event ev;
    (void)epoll_wait(async->epfd, &ev, 1, 0);
    return run_callbacks(async);
}

size_t redsem_async_pending(redsem_async *async)
{
    return async != NULL ? atomic_load(&async->pending) : 0;
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
    if (id == 0) /* ids start at 1 */
        return redsem__set_err(a->c, REDSEM_EINVAL, "no pending operation 0");
    pthread_mutex_lock(&a->mu);
    int rc = loop_cancel(a, id); /* 1: not under way */
    if (rc == 1)
        rc = list_find(&a->done, id) != NULL || list_find(&a->delivering, id) != NULL
                 ? REDSEM_ESTATE
                 : REDSEM_EINVAL;
    pthread_mutex_unlock(&a->mu);
    if (rc == REDSEM_ESTATE)
        return redsem__set_err(a->c, rc, "operation %llu is past cancelling",
                               (unsigned long long)id);
    if (rc == REDSEM_EINVAL)
        return redsem__set_err(a->c, rc, "no pending operation %llu", (unsigned long long)id);
    return rc;
}

/* A forked child's free: memory, and this process's copies of the engine's descriptors
 * (closing them sends nothing: no TLS close_notify, and the parent's stay open); the epoll
 * set is the parent's too, so it is left as it is. */
static void free_in_child(redsem_async *a)
{
    close(a->pipefd[0]);
    close(a->pipefd[1]);
    redsem__loop_free(a->loop);
    close(a->epfd);
    if (a->tfd >= 0)
        close(a->tfd);
    op_list *lists[] = {&a->looping, &a->incoming, &a->done, &a->delivering};
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++)
        for (op *o; (o = list_pop(lists[i])) != NULL;)
            redsem__free(o);
    redsem__free(a);
}

void redsem_async_free(redsem_async *async)
{
    if (async == NULL)
        return;
    redsem_async *a = async;
    if (a->pid != getpid()) {
        free_in_child(a);
        return;
    }
    if (a->loop != NULL)
        loop_stop(a);
    pthread_mutex_lock(&a->mu);
    a->closing = true;
    pthread_mutex_unlock(&a->mu);
    run_callbacks(a);
    if (a->loop_set) {
        if (a->timer_fn != NULL)
            a->timer_fn(a, -1, a->loop_data);
        a->socket_fn(a, a->epfd, REDSEM_WATCH_REMOVE, a->loop_data);
    }
    close(a->epfd);
    if (a->tfd >= 0)
        close(a->tfd);
    close(a->pipefd[0]);
    close(a->pipefd[1]);
    pthread_mutex_destroy(&a->mu);
    redsem__free(a);
}

/* Start an operation: checks, then start it on the engine (from a callback of the loop's
 * report) or queue it for the loop's next report. */
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
    if (!a->loop_set || a->closing || a->loop == NULL) {
        bool closing = a->closing || a->loop_set;
        pthread_mutex_unlock(&a->mu);
        redsem__free(o);
        return redsem__set_err(c, REDSEM_ESTATE, closing ? "the redsem_async is being freed"
                                                         : "no loop set (redsem_async_set_loop)");
    }
    o->id = a->next_id++;
    o->submit_ns = redsem__now_ns();
    if (o->waits && o->timeout_ms > 0)
        o->deadline_ns = o->submit_ns + o->timeout_ms * REDSEM__NS_PER_MS;
    atomic_fetch_add(&a->pending, 1);
    /* from a callback of the loop's report: on its thread, at once; else queued, and the
     * loop's next report starts it (the pipe's byte makes it report) */
    bool now = acting == a;
    if (now) {
        o->state = ST_RUNNING;
        list_push(&a->looping, o);
    } else {
        list_push(&a->incoming, o);
        notify(a);
    }
    uint64_t id = o->id;
    pthread_mutex_unlock(&a->mu);
    if (now)
        loop_start(a, o); /* o may be done (not freed: its callback runs from the loop) */
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
    op t = {.n = n, .timeout_ms = timeout_ms, .waits = timeout_ms != 0};
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
