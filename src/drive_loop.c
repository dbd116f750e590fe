/* redsem - the event-loop driver of acquires (a first part of the engine's second driver):
 * the acquire loop's steps (acquire.c) run as requests on one non-blocking connection of
 * their own (node/conn.h's pipe), stepped by whoever calls redsem__loop_step() when the
 * descriptor and the deadline that redsem__loop_wants() names are due: an event loop. It
 * starts no thread and never sleeps. Not yet: waits are timers (no BLPOP: a waiter polls as
 * the loop's backoff and the expiry takeover say, as one whose wake-up was lost), a lost
 * connection fails the requests in flight (maybe applied when written: the acquire then
 * says REDSEM_EUNKNOWN) and the next request reconnects, blocking (redsem__node_connect);
 * not for a client that waits for replicas, a Sentinel or a Cluster client. */
#include <poll.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

#define LOOP_NOSCRIPT_MAX 5

typedef struct loop_op loop_op;
struct loop_op {
    redsem__acq_state s;
    redsem__loop *loop;
    int stage, noscript;
    bool load;    /* its request carries SCRIPT LOAD first */
    bool maybe;   /* a copy of this attempt's call may have been applied */
    bool pending; /* a request of it is in the pipe */
    bool replied; /* ... and has ended (queued for loop_step) */
    int64_t wake_ns; /* a pause or a wait ends then (0: none) */
    bool waiting;    /* REDSEM__WAIT (else a pause before an attempt) */
    redsem__call call;
    redsem__preq req;
    atomic_bool cancel;
    redsem__loop_done done;
    void *arg;
    /* NULL: an acquire (s); else a single call, whose outcome this takes (redsem__loop_call) */
    redsem__loop_reply reply;
    loop_op *next;
};

/* A wake_push.lua call sent for other clients' waiters: nobody waits for its reply. */
typedef struct loop_push {
    redsem__preq req;
} loop_push;

struct redsem__loop {
    redsem_client *c;
    redsem__ctx ctx;
    redsem__node node;
    redsem__pipe pipe;
    bool open;
    loop_op *ops; /* under way */
};

int redsem__loop_new(redsem_client *c, redsem__loop **ret)
{
    if ((c->ep.kind != REDSEM__EP_TCP && c->ep.kind != REDSEM__EP_UNIX) || c->sync_replicas > 0)
        return redsem__set_err(c, REDSEM_EINVAL, "the loop driver takes a one-server client "
                                                 "without sync_replicas");
    redsem__loop *l = redsem__calloc(1, sizeof *l);
    if (l == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    l->c = c;
    char err[REDSEM__ERRMSG_LEN] = "";
    int rc = redsem__node_init(&l->node, &l->ctx, &c->ep, &c->cfg, err, sizeof err);
    if (rc != REDSEM_OK) {
        redsem__free(l);
        return redsem__set_err(c, rc, "%s", err);
    }
    l->node.clock = &c->clock; /* one server: the client's clock and script cache */
    l->node.scripts = &c->scripts;
    *ret = l;
    return REDSEM_OK;
}

/* Open the connection if it is not (blocking: connect and handshake). */
static int loop_open(redsem__loop *l)
{
    if (l->open && l->pipe.rc == REDSEM_OK)
        return REDSEM_OK;
    if (l->open) {
        redsem__pipe_reset(&l->pipe);
        redsem__node_disconnect(&l->node);
        l->open = false;
    }
    bool retryable = false;
    char err[REDSEM__ERRMSG_LEN] = "";
    int rc = redsem__node_connect(&l->node, &retryable, err, sizeof err);
    if (rc != REDSEM_OK)
        return redsem__set_err(l->c, rc, "%s", err);
    redsem__pipe_init(&l->pipe, &l->node.conn);
    l->open = true;
    return REDSEM_OK;
}

/* Queue call on the pipe as q: [SCRIPT LOAD body] EVALSHA sha nkeys keys args, in one write;
 * q->nreplies set. */
static int send_call(redsem__loop *l, redsem__preq *q, const redsem__call *call, bool load)
{
    int rc = loop_open(l);
    if (rc != REDSEM_OK)
        return rc;
    const redsem__script_def *d = &redsem__script_defs[call->script];
    redsem__args a, la;
    redsem__args_init(&a);
    redsem__args_init(&la);
    redsem__args_str(&la, "SCRIPT");
    redsem__args_str(&la, "LOAD");
    redsem__args_mem(&la, d->text, d->len);
    redsem__args_str(&a, "EVALSHA");
    redsem__args_mem(&a, d->sha, 40);
    redsem__args_i64(&a, call->nkeys);
    for (int i = 0; i < call->ka.n; i++)
        redsem__args_mem(&a, call->ka.v[i], call->ka.len[i]);
    char *pre = NULL, *cmd = NULL;
    int plen = load ? redsem__args_format(&la, &pre) : 0;
    int clen = redsem__args_format(&a, &cmd);
    char *buf = plen >= 0 && clen >= 0 ? redsem__malloc((size_t)plen + (size_t)clen) : NULL;
    if (buf != NULL) {
        memcpy(buf, pre, (size_t)plen);
        memcpy(buf + plen, cmd, (size_t)clen);
        q->nreplies = load ? 2 : 1;
        int64_t cap = call->cap_ns;
        q->deadline_ns = redsem__now_ns() + l->c->command_timeout_ms * REDSEM__NS_PER_MS;
        if (cap != 0 && cap < q->deadline_ns)
            q->deadline_ns = cap;
        rc = redsem__pipe_send(&l->pipe, q, buf, (size_t)plen + (size_t)clen);
    } else {
        rc = REDSEM_ENOMEM;
    }
    redsem__free(buf);
    redisFreeCommand(pre);
    redisFreeCommand(cmd);
    return rc == REDSEM_OK ? rc : redsem__set_err(l->c, rc, "the request could not be queued");
}

static void push_done(redsem__preq *q, void *arg)
{
    (void)arg;
    for (int i = 0; i < q->nreplies; i++)
        if (q->replies[i] != NULL)
            freeReplyObject(q->replies[i]);
    redsem__free(q);
}

/* The wake-ups a reply carried for other clients' waiters: pushed, their replies dropped (a
 * push that fails loses a wake-up, which the waiter's poll makes up for). */
static void push_wakeups(redsem__loop *l, const char *sigprefix, redisReply *wrap)
{
    redsem__wake_call *wc = redsem__malloc(sizeof *wc);
    for (size_t i = 2; wc != NULL && redsem__wake_push_call(l->c, sigprefix, wrap, &i, wc);) {
        loop_push *p = redsem__calloc(1, sizeof *p);
        if (p == NULL)
            break;
        p->req.done = push_done;
        bool load = !atomic_load(&l->c->scripts.sent[REDSEM__SCRIPT_WAKE_PUSH]);
        if (send_call(l, &p->req, &wc->call, load) != REDSEM_OK)
            redsem__free(p);
    }
    redsem__free(wc);
    freeReplyObject(wrap);
}

static void op_done(redsem__preq *q, void *arg)
{
    (void)q;
    ((loop_op *)arg)->replied = true;
}

/* Send the call of o's current stage; a failure to send is the attempt's outcome. */
static void op_send(loop_op *o);
static void op_free(loop_op *o);
static void op_step(loop_op *o);

static void attempt_outcome(loop_op *o, int rc, redisReply *r, redsem__req_info *info)
{
    const redsem__acquirer *q = &o->s.q;
    if (r != NULL && o->call.wake_prefix != NULL) {
        redisReply *wrap = redsem__wake_unwrap(&r);
        if (wrap != NULL)
            push_wakeups(o->loop, o->call.wake_prefix, wrap);
    }
    if (o->reply != NULL) { /* a single call: its outcome, and the op ends */
        rc = o->reply(o->arg, rc, r, info);
        if (r != NULL)
            freeReplyObject(r);
        o->done(o->arg, rc, NULL);
        op_free(o);
        return;
    }
    rc = q->attempt_reply(q->handle, o->stage, rc, r, info, &o->s.att);
    if (r != NULL)
        freeReplyObject(r);
    if (rc == REDSEM__ATTEMPT) {
        o->stage++;
        op_send(o);
        return;
    }
    o->s.att_rc = rc;
    o->s.att_info = *info;
    op_step(o);
}

/* The reply to o's request: a NOSCRIPT is sent again with the body; an error reply becomes
 * its code (with the text as the thread's error text). */
static void op_reply(loop_op *o)
{
    redsem__loop *l = o->loop;
    redsem_client *c = l->c;
    redsem__preq *q = &o->req;
    redsem__req_info info = {.sent_ns = q->sent_ns, .recv_ns = q->recv_ns, .replicas_acked = -1};
    o->pending = o->replied = false;
    if (q->rc != REDSEM_OK) {
        info.maybe_applied = o->maybe || q->written;
        attempt_outcome(o, redsem__set_err(c, q->rc, "%s", l->pipe.err), NULL, &info);
        return;
    }
    _Atomic bool *sent = &c->scripts.sent[o->call.script];
    redisReply *r = q->replies[o->load ? 1 : 0];
    if (o->load) {
        if (q->replies[0]->type == REDIS_REPLY_STRING)
            atomic_store(sent, true);
        freeReplyObject(q->replies[0]);
    }
    bool noscript = r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0;
    if (noscript && o->noscript++ < LOOP_NOSCRIPT_MAX) {
        freeReplyObject(r);
        atomic_store(sent, false);
        op_send(o);
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        int rc = redsem__node_error_reply(&l->node, r, redsem__script_defs[o->call.script].name);
        (void)redsem__set_err(c, rc, "%s", l->ctx.errmsg);
        freeReplyObject(r);
        attempt_outcome(o, rc, NULL, &info);
        return;
    }
    atomic_store(sent, true);
    attempt_outcome(o, REDSEM_OK, r, &info);
}

static void op_send(loop_op *o)
{
    const redsem__acquirer *q = &o->s.q;
    if (o->reply == NULL) { /* an acquire: its attempt's call of this stage */
        q->attempt_call(q->handle, o->s.id, o->s.att_mode, q->weight, o->stage, &o->call);
        o->call.cap_ns = o->s.cap_ns;
    }
    o->load = !atomic_load(&o->loop->c->scripts.sent[o->call.script]);
    o->req.done = op_done;
    o->req.arg = o;
    int rc = send_call(o->loop, &o->req, &o->call, o->load);
    if (rc == REDSEM_OK) {
        o->pending = true;
        return;
    }
    redsem__req_info info = {.maybe_applied = o->maybe, .replicas_acked = -1};
    attempt_outcome(o, rc, NULL, &info);
}

/* Unlink o and free it. */
static void op_free(loop_op *o)
{
    for (loop_op **pp = &o->loop->ops; *pp != NULL; pp = &(*pp)->next)
        if (*pp == o) {
            *pp = o->next;
            break;
        }
    redsem__free(o);
}

/* Take o's next step: an attempt is sent, a pause or a wait set as o's timer, a decided
 * acquire made a permit and called back (o then freed). */
static void op_step(loop_op *o)
{
    int rc = redsem__acquire_next(&o->s);
    if (rc == REDSEM__ATTEMPT) {
        o->stage = 0;
        o->noscript = 0;
        o->maybe = false;
        op_send(o);
        return;
    }
    if (rc == REDSEM__NAP || rc == REDSEM__WAIT) {
        o->waiting = rc == REDSEM__WAIT;
        o->wake_ns = o->waiting ? redsem__now_ns() + o->s.wait_ms * REDSEM__NS_PER_MS
                                : o->s.nap_until_ns;
        if (o->waiting && o->s.cut_ns < o->wake_ns)
            o->wake_ns = o->s.cut_ns;
        return;
    }
    redsem_permit *p = NULL;
    rc = redsem__acquire_finish(&o->s, rc, &p);
    o->done(o->arg, rc, p);
    op_free(o);
}

/* A new op, linked into l's list. */
static loop_op *op_new(redsem__loop *l, redsem__loop_done done, void *arg)
{
    loop_op *o = redsem__calloc(1, sizeof *o);
    if (o == NULL)
        return NULL;
    atomic_init(&o->cancel, false);
    o->loop = l;
    o->done = done;
    o->arg = arg;
    o->next = l->ops;
    l->ops = o;
    return o;
}

int redsem__loop_acquire(redsem__loop *l, const redsem__acquirer *q, const redsem__kind *kind,
                         const char *id, int64_t timeout_ms, int64_t lease_ms,
                         redsem__loop_done done, void *arg, atomic_bool **ret_cancel)
{
    loop_op *o = op_new(l, done, arg);
    if (o == NULL)
        return redsem__set_err(l->c, REDSEM_ENOMEM, "out of memory");
    redsem__acquire_begin(&o->s, q, kind, id, timeout_ms, lease_ms);
    o->s.cancel = &o->cancel;
    if (ret_cancel != NULL)
        *ret_cancel = &o->cancel;
    op_step(o);
    return REDSEM_OK;
}

int redsem__loop_call(redsem__loop *l, void (*build)(void *arg, redsem__call *call),
                      redsem__loop_reply reply, redsem__loop_done done, void *arg)
{
    loop_op *o = op_new(l, done, arg);
    if (o == NULL)
        return redsem__set_err(l->c, REDSEM_ENOMEM, "out of memory");
    o->reply = reply;
    build(arg, &o->call);
    op_send(o);
    return REDSEM_OK;
}

int redsem__loop_wants(const redsem__loop *l, short *events, int64_t *deadline_ns)
{
    *events = 0;
    *deadline_ns = REDSEM__FOREVER;
    if (l->open)
        *events = redsem__pipe_wants(&l->pipe, deadline_ns);
    for (const loop_op *o = l->ops; o != NULL; o = o->next) {
        int64_t at = o->wake_ns;
        if (at != 0 && o->waiting && atomic_load(&o->cancel))
            at = 1; /* cancelled while it waits: now */
        if (at != 0 && at < *deadline_ns)
            *deadline_ns = at;
    }
    return l->open ? redsem__pipe_fd(&l->pipe) : -1;
}

/* The op whose request ended or whose timer is due, first found; NULL: none. */
static loop_op *due(redsem__loop *l, int64_t now)
{
    for (loop_op *o = l->ops; o != NULL; o = o->next) {
        if (o->replied)
            return o;
        bool cut = o->waiting && atomic_load(&o->cancel);
        if (o->wake_ns != 0 && (o->wake_ns <= now || cut))
            return o;
    }
    return NULL;
}

/* Run o's part that is due: the reply to its request, or the end of its pause or wait. */
static void run_due(loop_op *o)
{
    if (o->replied) {
        op_reply(o);
        return;
    }
    o->wake_ns = 0;
    if (o->waiting) {
        o->waiting = false;
        o->s.wait_rc = REDSEM_OK;
        o->s.signaled = false;
        op_step(o);
        return;
    }
    o->stage = 0; /* a pause ended: its attempt */
    o->noscript = 0;
    o->maybe = false;
    op_send(o);
}

void redsem__loop_step(redsem__loop *l, bool readable, bool writable)
{
    bool ran;
    do {
        /* writes what was queued (also by the last round), reads what arrived */
        if (l->open)
            (void)redsem__pipe_step(&l->pipe, readable, writable, redsem__now_ns());
        readable = writable = false;
        ran = false;
        loop_op *o;
        while ((o = due(l, redsem__now_ns())) != NULL) {
            run_due(o);
            ran = true;
        }
    } while (ran);
}

size_t redsem__loop_pending(const redsem__loop *l)
{
    size_t n = 0;
    for (const loop_op *o = l->ops; o != NULL; o = o->next)
        n++;
    return n;
}

void redsem__loop_free(redsem__loop *l)
{
    if (l == NULL)
        return;
    if (l->open)
        redsem__pipe_reset(&l->pipe); /* the ops' requests end (not called back) */
    while (l->ops != NULL) {
        loop_op *o = l->ops;
        l->ops = o->next;
        redsem__free(o);
    }
    redsem__node_close(&l->node);
    redsem__free(l);
}
