/* redsem - the client's pool of lanes (a lane: one topology with its nodes and connections,
 * used by one thread at a time), what travels with a call through a borrowed lane (the
 * calling thread's error text and caps), and the calls of the object layer routed through
 * one to the node that serves their key. Below the shared connection (drive_threads.c), the
 * shared wait (wake.c) and the handle's lifecycle (client.c), which borrow lanes here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int64_t redsem__call_cap(const redsem_client *c)
{
    return call_cap(c);
}

/* The end of the command timeout of a call of this thread that already waited for the
 * shared connection's lane and now goes alone (redsem__eval), 0 if none: it caps the call's
 * wait for a request lane and its first attempt (redsem__ctx's wait_cap_ns), not its retry
 * window after a lost connection. */
static _Thread_local int64_t eval_wait_cap_ns;

void redsem__eval_wait_cap_set(int64_t cap_ns)
{
    eval_wait_cap_ns = cap_ns;
}

const char *redsem_client_errmsg(const redsem_client *c)
{
    if (c == NULL)
        return "";
    const err_slot *e = err_find(c);
    return e != NULL ? e->text : "";
}
/* ================================================================ the pool */

/* A lane is borrowed for one routed call and given back. Request lanes: at most
 * max_connections, made on demand, a thread finding them all busy waits for one within the
 * command timeout (nothing was sent: a plain REDSEM_ETIMEDOUT). Wait lanes (BLPOP): as many as
 * threads wait at once, kept for reuse, so that a blocked waiter never holds a connection
 * that requests need. A new lane connects on its first request (node.c), with the usual
 * retries. */
int redsem__lane_new(redsem_client *c, bool for_wait, redsem__lane **ret)
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
void redsem__lane_caps(const redsem_client *c, redsem__lane *l)
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
    int rc = redsem__lane_new(c, false, ret);
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
            int rc = redsem__lane_new(c, true, ret);
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
    redsem__lane_caps(c, *ret);
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
