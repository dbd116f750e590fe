/* redsem - the shared connection's blocking driver: the script calls of the threads of a
 * one-server client go into one pipe (node/conn.h) on a request lane borrowed from the pool
 * (pool.c), many in flight at once, and the calling threads drive that pipe themselves: one
 * at a time holds the reader role (polls the socket, steps the pipe, wakes each thread whose
 * reply came, then hands the role on), the others sleep on a wake-up of their own. Also the
 * entry of every script call (redsem__eval: through the pipe, or alone on a lane) and the
 * renewer's batches (redsem__eval_many). In the object layer, not in node/: it borrows and
 * gives back the client's lanes. docs/design.md section 13, "The shared connection". */
#include <poll.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "internal.h"

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
    redsem__args la, a;
    redsem__script_args(&redsem__script_defs[it->script], load, load, it->nkeys, it->ka, &a,
                        &la);
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

/* A script call routed alone, as redsem__node_call, for redsem__topo_route. */
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

int redsem__eval(redsem_client *c, int script, int nkeys, const redsem__args *ka, int flags,
                 redsem__req_info *info, redisReply **ret_reply)
{
    /* A call with a cap of its own (a renewal) is not taken into another thread's batch,
     * whose deadline would not know its cap, and takes no other thread's call along. */
    bool maybe = false, waited = false;
    if (info != NULL) /* a call that fails before it is sent (no connection) sent nothing */
        *info = (redsem__req_info){false, 0, 0, -1};
    if (c->drive_on && redsem__call_cap(c) == 0 &&
        !((flags & REDSEM__REQ_SYNC) && c->sync_replicas > 0)) {
        /* its wait for the connection and its round trip share one command timeout */
        int64_t deadline = redsem__deadline_after_ms(c->command_timeout_ms);
        redsem__batch_item it = {script, nkeys, ka, flags, info, ret_reply,
                                 redsem__errbuf(c), REDSEM_OK};
        if (drive_eval(c, &it, deadline, &maybe, &waited))
            return give_up_at_own_deadline(&it, deadline);
        if (waited) /* its wait for a connection and its first attempt share one command
                     * timeout; a retry window after a lost connection runs to its end */
            redsem__eval_wait_cap_set(deadline);
    }
    /* every key of one call shares a hash tag: the first one routes it */
    eval_call q = {script, nkeys, ka, flags, info, ret_reply};
    int rc = redsem__routed(c, false, nkeys > 0 ? ka->v[0] : NULL, nkeys > 0 ? ka->len[0] : 0,
                            flags, info, call_eval, &q);
    redsem__eval_wait_cap_set(0);
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
    redsem__lane_caps(c, l);
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

void redsem__drive_free(redsem__drive *d)
{
    redsem__free(d->pipe.out); /* (its lane was closed before) */
    for (drive_waker *k = d->all_wakers, *next; k != NULL; k = next) {
        next = k->next_all;
        sem_destroy(&k->sem);
        redsem__free(k);
    }
}
