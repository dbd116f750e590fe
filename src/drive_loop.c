/* redsem - the event-loop driver of acquires (a first part of the engine's second driver):
 * the acquire loop's steps (acquire.c) run as requests on one non-blocking connection of
 * their own (node/conn.h's pipe), and its waits as one BLPOP at a time on a second one,
 * stepped by whoever calls redsem__loop_step() when the descriptors and the deadline that
 * redsem__loop_wants() names are due: an event loop. It starts no thread and never sleeps.
 * An op's faults are its states, as node.c's request loop has them: a request lost with its
 * connection, or answered LOADING, is sent again after a pause (its timer: resend) within
 * its retry window, "maybe applied" kept (retry_later); one given up with an earlier
 * request's deadline ends at its own (give_up_late); NOSCRIPT sends the body; with
 * sync_replicas WAIT rides in the same write, one at a time (sync_busy), and a grant short
 * of its replicas is given back by a release on the loop (giveback_start). Its counters are
 * the client's (redsem__stats_attach).
 * A connection opens without blocking either (conn_open: closed, resolving, connecting, tls
 * through net/dial.c; then its handshake as one request on its pipe, judged by node.c's
 * redsem__handshake_judge; open): the requests sent meanwhile wait behind it in the pipe
 * (held) and end with the connect's code, never written, if it fails. Under Sentinel the
 * resolve step comes first (LC_RESOLVING): the client's watch gives the primary's address,
 * or the Sentinels are asked without blocking (topo/sentinel_loop.c: dialled, asked and
 * judged as the blocking resolve asks them, same codes and texts); the handshake then checks
 * ROLE, and so does a request every REDSEM__ROLE_CHECK_MS (role_recheck); an open connection
 * to a primary the watch says moved, one that answers READONLY (demoted_reply) or whose ROLE
 * is no longer "master" is given up, and its calls are resent within their retry windows,
 * resolving again, as node.c's primary_moved, READONLY branch and roundtrip_checked.
 * Not yet: a Cluster client (docs/design.md section 16). */
#include <poll.h>
#include <stdio.h>
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
    bool resend;     /* the pause ends with its call sent again (lost connection, LOADING) */
    bool late;       /* ... or with its request's timeout (give_up_late) */
    int64_t retry_until; /* its call's retry window ends then (0: not opened) */
    int64_t backoff_ns;  /* the next pause before a resend */
    bool sync;           /* its request carries WAIT (sync_replicas) */
    bool sync_turn;      /* ... and its turn came (queued again first if it was taken) */
    loop_op *sync_next;  /* queued behind the WAIT in flight (loop's sync_head) */
    char err[256];       /* why its request failed (the pipe's text, kept) */
    /* a grant that did not reach the replicas: given back (the release of gb), then the
     * acquire ends with the error text why kept from its attempt */
    bool giveback;
    redsem_permit gb;
    char why[REDSEM__ERRMSG_LEN];
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

/* The states of a connection of the engine, in order: closed, then opened without blocking
 * (resolving, connecting, tls: the dial's; handshake: its requests on the pipe), open. */
enum { LC_CLOSED, LC_RESOLVING, LC_CONNECTING, LC_TLS, LC_HANDSHAKE, LC_OPEN };

/* One connection of the engine: a node (its handshake, its error replies) and its pipe. While
 * it opens, the requests sent wait in the pipe behind its handshake (held back). */
typedef struct loop_conn {
    redsem__node node;
    redsem__pipe pipe;
    int state;
    redsem__dial dial;
    int64_t open_by;      /* the open's deadline: now + the connect timeout at its start */
    redsem__handshake hs; /* its steps, sent as one request: */
    redsem__preq hsq;
    size_t hs_len;        /* its bytes */
    bool hs_replied;      /* ... which has ended, judged: */
    int hs_rc;
    char hs_err[256];
    redsem__sentinel_ask ask; /* Sentinel: the question before its dial (LC_RESOLVING) */
    redsem__preq roleq;       /* Sentinel: ROLE re-checked on the open connection */
    bool role_pending, role_demoted; /* ... in flight; answered "not the primary" */
} loop_conn;

#define LOOP_WAIT_KEYS_MAX 256 /* keys one BLPOP watches (a waiter beyond polls) */
#define LOOP_PEND_MAX 256
#define LOOP_PEND_NS (10000 * REDSEM__NS_PER_MS)

struct redsem__loop {
    redsem_client *c;
    redsem__ctx ctx;
    /* Sentinel: the Sentinels asked, the client's watch (its node: the data endpoint, not
     * connected); kind 0: a one-server client */
    redsem__topo topo;
    loop_conn req;  /* the attempts, releases, drains and pushes */
    loop_conn wait; /* one BLPOP at a time on the waiters' lists (and ctl) */
    loop_op *ops;   /* under way */
    /* the BLPOP in flight: its request, the keys it watches (copies), whether it was poked */
    redsem__preq blpop;
    bool blpop_pending, blpop_replied, poked;
    char *bkeys[LOOP_WAIT_KEYS_MAX];
    int nbkeys;
    redsem__preq drain; /* a drain of the client's id list after its bell popped */
    bool drain_pending, drain_replied;
    bool drain_again; /* the bell popped while a drain was in flight: drain once more */
    char ctl[128]; /* our control list: a push ends the BLPOP, to watch a new key */
    /* with sync_replicas: a request with WAIT is in flight (one at a time: WAIT holds the
     * connection on the server until its replicas answer or it times out, and what follows
     * waits behind it), and the ops whose WAIT waits for it, oldest first */
    bool sync_busy;
    loop_op *sync_head, *sync_tail;
    int64_t blpop_after; /* after a refused or failed BLPOP, none before then (waiters poll) */
    unsigned gen;  /* connections made (a new one may reuse a closed one's number) */
    /* drained elements whose waiter was between two attempts: its next wait takes one at
     * once (as wake.c's pending ids), kept LOOP_PEND_NS at most */
    char *pend[LOOP_PEND_MAX];
    int64_t pend_at[LOOP_PEND_MAX];
};

int redsem__loop_new(redsem_client *c, redsem__loop **ret)
{
    if (c->ep.kind != REDSEM__EP_TCP && c->ep.kind != REDSEM__EP_UNIX &&
        c->ep.kind != REDSEM__EP_SENTINEL)
        return redsem__set_err(c, REDSEM_EINVAL,
                               "the loop driver takes a one-server or Sentinel client");
    redsem__loop *l = redsem__calloc(1, sizeof *l);
    if (l == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    l->c = c;
    char err[REDSEM__ERRMSG_LEN] = "";
    const redsem__endpoint *ep = &c->ep;
    if (c->ep.kind == REDSEM__EP_SENTINEL) {
        int rc = redsem__topo_init(&l->topo, &l->ctx, &c->ep, &c->cfg, err, sizeof err);
        if (rc != REDSEM_OK) {
            redsem__topo_close(&l->topo);
            redsem__free(l);
            return redsem__set_err(c, rc, "%s", err);
        }
        l->topo.watch = c->sentinel_watch;
        ep = &l->topo.single.ep; /* the data node's: credentials, db, TLS */
    }
    loop_conn *lcs[2] = {&l->req, &l->wait};
    for (int i = 0; i < 2; i++) {
        int rc = redsem__node_init(&lcs[i]->node, &l->ctx, ep, &c->cfg, err, sizeof err);
        if (rc != REDSEM_OK) {
            if (i == 1)
                redsem__node_close(&l->req.node);
            if (l->topo.kind != 0)
                redsem__topo_close(&l->topo);
            redsem__free(l);
            return redsem__set_err(c, rc, "%s", err);
        }
        /* one server (the primary, under Sentinel): the client's clock and script cache */
        lcs[i]->node.clock = &c->clock;
        lcs[i]->node.scripts = &c->scripts;
        if (l->topo.kind != 0) { /* never called here: the node is found through Sentinel
                                  * (ROLE in its handshake, READONLY a lost connection) */
            lcs[i]->node.resolve = redsem__sentinel_resolve;
            lcs[i]->node.resolve_arg = &l->topo;
        }
    }
    char tag[REDSEM_ID_BUFSIZE];
    (void)redsem__new_id(tag);
    snprintf(l->ctl, sizeof l->ctl, "%sloopctl:%.16s", c->prefix, tag);
    redsem__stats_attach(c, &l->ctx);
    *ret = l;
    return REDSEM_OK;
}

static void op_done(redsem__preq *q, void *arg);

/* The handshake's request ended: its steps judged in order (the blocking connect's
 * functions), the first failure kept with its text; a fault of the pipe ends the requests
 * held behind it with that text (hint included). */
static void hs_done(redsem__preq *q, void *arg)
{
    loop_conn *lc = arg;
    if (lc->state != LC_HANDSHAKE)
        return; /* the open failed before (conn_fail) */
    int rc = q->rc;
    snprintf(lc->hs_err, sizeof lc->hs_err, "%s", rc != REDSEM_OK ? lc->pipe.err : "");
    for (int i = 0; i < lc->hs.n; i++) {
        rc = redsem__handshake_judge(&lc->node, lc->hs.step[i], q->rc,
                                     q->rc == REDSEM_OK ? q->replies[i] : NULL, q->recv_ns,
                                     lc->hs_err, sizeof lc->hs_err);
        if (rc != REDSEM_OK)
            break;
    }
    for (int i = 0; q->rc == REDSEM_OK && i < lc->hs.n; i++)
        freeReplyObject(q->replies[i]);
    if (q->written) /* AUTH's password */
        redsem__pipe_wipe(&lc->pipe, q, lc->hs_len);
    if (rc != REDSEM_OK)
        (void)redsem__handshake_failed(&lc->node, rc, lc->hs_err, sizeof lc->hs_err);
    if (q->rc != REDSEM_OK)
        snprintf(lc->pipe.err, sizeof lc->pipe.err, "%s", lc->hs_err);
    lc->hs_rc = rc;
    lc->hs_replied = true;
}

/* Queue lc's handshake (its steps in one write) on its pipe, and hold what comes after. */
static int hs_queue(loop_conn *lc)
{
    redsem__handshake_plan(&lc->node, true, &lc->hs); /* ROLE under Sentinel */
    size_t total = 0;
    char *cmd[REDSEM__HS_MAX], *all = NULL;
    int len[REDSEM__HS_MAX], rc = REDSEM_OK;
    for (int i = 0; i < lc->hs.n; i++) {
        len[i] = redsem__handshake_format(&lc->node, lc->hs.step[i], &cmd[i]);
        total += len[i] > 0 ? (size_t)len[i] : 0;
        rc = len[i] < 0 ? REDSEM_ENOMEM : rc;
    }
    all = rc == REDSEM_OK && total > 0 ? redsem__malloc(total) : NULL;
    for (int i = 0, off = 0; all != NULL && i < lc->hs.n; off += len[i], i++)
        memcpy(all + off, cmd[i], (size_t)len[i]);
    if (lc->hs.n > 0) {
        lc->hsq = (redsem__preq){.nreplies = lc->hs.n, .done = hs_done, .arg = lc};
        lc->hsq.deadline_ns = lc->open_by;
        rc = all == NULL ? REDSEM_ENOMEM : redsem__pipe_send(&lc->pipe, &lc->hsq, all, total);
        lc->hs_len = total;
    }
    for (int i = 0; i < lc->hs.n; i++)
        redsem__handshake_free(cmd[i], len[i]);
    redsem__handshake_free(all, (int)total);
    redsem__pipe_hold(&lc->pipe);
    return rc;
}

/* lc's open failed with rc (err): the requests waiting for it end with it, never written
 * (not applied). */
static void conn_fail(redsem__loop *l, loop_conn *lc, int rc, const char *err)
{
    redsem__sentinel_ask_cancel(&lc->ask);
    redsem__dial_cancel(&lc->dial);
    lc->state = LC_CLOSED;
    if (lc->pipe.rc == REDSEM_OK)
        redsem__pipe_fail(&lc->pipe, rc, err);
    redsem__conn_abort(&lc->node.conn);
    l->gen++;
}

/* lc is open: the requests held behind its handshake go, each with a deadline from now (as a
 * request after a blocking connect), within its call's cap. */
static void conn_opened(redsem__loop *l, loop_conn *lc)
{
    int64_t now = redsem__now_ns(), dl = now + l->c->command_timeout_ms * REDSEM__NS_PER_MS;
    for (redsem__preq *q = lc->pipe.head; q != NULL; q = q->next) {
        if (!redsem__pipe_held(&lc->pipe, q))
            continue;
        if (q->deadline_ns < dl)
            q->deadline_ns = dl;
        const loop_op *o = q->done == op_done ? q->arg : NULL;
        if (o != NULL && o->call.cap_ns != 0 && o->call.cap_ns < q->deadline_ns)
            q->deadline_ns = o->call.cap_ns;
    }
    redsem__pipe_unhold(&lc->pipe);
    redsem__node_opened(&lc->node);
    lc->state = LC_OPEN;
    (void)redsem__pipe_step(&lc->pipe, false, false, now); /* writes them */
}

/* The dial of lc is done: its handshake goes (open at once without one). */
static void conn_dialed(redsem__loop *l, loop_conn *lc)
{
    l->gen++;
    if (lc->hs.n == 0) {
        conn_opened(l, lc);
        return;
    }
    lc->state = LC_HANDSHAKE;
    int64_t dl = redsem__now_ns() + l->c->command_timeout_ms * REDSEM__NS_PER_MS;
    if (dl < lc->hsq.deadline_ns)
        lc->hsq.deadline_ns = dl;
    (void)redsem__pipe_step(&lc->pipe, false, false, redsem__now_ns()); /* writes it */
}

/* The state of lc after a step of its dial that did not fail. */
static void dial_moved(redsem__loop *l, loop_conn *lc)
{
    static const int of[] = {[REDSEM__DIAL_RESOLVING] = LC_RESOLVING,
                             [REDSEM__DIAL_CONNECTING] = LC_CONNECTING,
                             [REDSEM__DIAL_TLS] = LC_TLS};
    if (lc->dial.state == REDSEM__DIAL_DONE)
        conn_dialed(l, lc);
    else
        lc->state = of[lc->dial.state];
}

/* Start lc's dial to its node's address. */
static int dial_begin(redsem__loop *l, loop_conn *lc, char *err, size_t errlen)
{
    redsem__conn_tls tls = {lc->node.tls_ctx, lc->node.tls_server_name};
    return redsem__dial_start(&lc->dial, &lc->node.conn, &lc->node.ep, &tls,
                              l->c->command_timeout_ms, err, errlen);
}

/* Sentinel: the resolve step, before the dial: the question to the Sentinels starts
 * (sentinel_loop.c). REDSEM_OK: under way (lc resolving), or answered at once by the watch
 * (*asking false: dial). Else the failure (err). */
static int resolve_begin(redsem__loop *l, loop_conn *lc, bool *asking, char *err,
                         size_t errlen)
{
    *asking = false;
    int rc = redsem__sentinel_ask_start(&lc->ask, &l->topo, &lc->node, lc->open_by);
    if (rc != REDSEM_OK)
        snprintf(err, errlen, "%s", lc->ask.err);
    else if (lc->ask.state != REDSEM__ASK_IDLE)
        *asking = true;
    return rc;
}

/* Open the connection lc if it is not, without blocking: the dial starts (under Sentinel,
 * the question to the Sentinels first), the handshake is queued, and the requests sent until
 * it is open wait behind it. REDSEM_OK (open or opening), or a failure at once (then nothing
 * was queued). */
/* The ROLE re-check's reply: judged as the handshake's; not the primary (or no answer to
 * judge by) marks the connection to be given up after this pipe step (conn_step). */
static void role_done(redsem__preq *q, void *arg)
{
    loop_conn *lc = arg;
    lc->role_pending = false;
    if (q->rc != REDSEM_OK)
        return; /* the connection's fault: its requests end with it */
    int rc = redsem__handshake_judge(&lc->node, REDSEM__HS_ROLE, REDSEM_OK, q->replies[0],
                                     q->recv_ns, lc->hs_err, sizeof lc->hs_err);
    freeReplyObject(q->replies[0]);
    lc->role_demoted = rc != REDSEM_OK;
}

/* Sentinel: ROLE goes ahead of the next request on lc (open) once the last check is
 * REDSEM__ROLE_CHECK_MS old, as node.c's roundtrip_checked sends it (counted as a request). */
static void role_recheck(redsem__loop *l, loop_conn *lc)
{
    int64_t now = redsem__now_ns();
    if (lc->role_pending ||
        now - lc->node.role_checked_ns < REDSEM__ROLE_CHECK_MS * REDSEM__NS_PER_MS)
        return;
    char *cmd = NULL;
    int len = redsem__handshake_format(&lc->node, REDSEM__HS_ROLE, &cmd);
    if (len < 0)
        return; /* checked next time */
    lc->roleq = (redsem__preq){.nreplies = 1, .done = role_done, .arg = lc};
    lc->roleq.deadline_ns = now + l->c->command_timeout_ms * REDSEM__NS_PER_MS;
    if (redsem__pipe_send(&lc->pipe, &lc->roleq, cmd, (size_t)len) == REDSEM_OK) {
        lc->role_pending = true;
        lc->node.role_checked_ns = now;
        REDSEM__COUNT(&l->ctx, requests, 1);
    }
    redsem__handshake_free(cmd, len);
}

static int conn_open(redsem__loop *l, loop_conn *lc)
{
    /* Sentinel: an open connection to a primary the watch says moved is given up first, as
     * node.c's primary_moved (what is in flight on it is lost: resent within its window) */
    char why[256];
    if (lc->state == LC_OPEN && lc->pipe.rc == REDSEM_OK && lc->node.resolve != NULL &&
        redsem__sentinel_moved_nb(&l->topo, &lc->node, why, sizeof why))
        redsem__pipe_fail(&lc->pipe, REDSEM_ECONN, why);
    if (lc->state == LC_OPEN && lc->pipe.rc == REDSEM_OK && lc->node.resolve != NULL)
        role_recheck(l, lc);
    if (lc->state != LC_CLOSED && (lc->state != LC_OPEN || lc->pipe.rc == REDSEM_OK))
        return REDSEM_OK;
    if (lc->state == LC_OPEN) {
        lc->state = LC_CLOSED;
        redsem__pipe_reset(&lc->pipe);
        redsem__node_disconnect(&lc->node);
    }
    redsem__pipe_reset(&lc->pipe); /* a failed open's */
    redsem__pipe_init(&lc->pipe, &lc->node.conn);
    lc->open_by = redsem__now_ns() + l->c->connect_timeout_ms * REDSEM__NS_PER_MS;
    lc->hs_replied = false;
    char err[REDSEM__ERRMSG_LEN] = "";
    bool asking = false;
    int rc = hs_queue(lc);
    if (rc != REDSEM_OK)
        snprintf(err, sizeof err, "out of memory");
    if (rc == REDSEM_OK && lc->node.resolve != NULL)
        rc = resolve_begin(l, lc, &asking, err, sizeof err);
    if (rc == REDSEM_OK && !asking)
        rc = dial_begin(l, lc, err, sizeof err);
    l->gen++;
    if (rc != REDSEM_OK) {
        redsem__pipe_reset(&lc->pipe); /* the handshake, not called back: LC_CLOSED */
        return redsem__set_err(l->c, rc, "%s", err);
    }
    if (asking)
        lc->state = LC_RESOLVING;
    else
        dial_moved(l, lc);
    return REDSEM_OK;
}

/* The deadline of lc's open: its connect timeout, or a held request's cap if earlier. */
static int64_t open_deadline(const loop_conn *lc)
{
    int64_t d = lc->open_by;
    for (const redsem__preq *q = lc->pipe.head; q != NULL; q = q->next) {
        const loop_op *o = q->done == op_done ? q->arg : NULL;
        if (o != NULL && o->call.cap_ns != 0 && o->call.cap_ns < d)
            d = o->call.cap_ns;
    }
    return d;
}

/* Whether call is followed by WAIT (a write that must reach the client's replicas). */
static bool call_syncs(const redsem__loop *l, const redsem__call *call)
{
    return (call->flags & REDSEM__REQ_SYNC) && l->c->sync_replicas > 0;
}

/* Queue call on the pipe as q: [SCRIPT LOAD body] EVALSHA sha nkeys keys args [WAIT n
 * timeout], in one write (node.c's format_requests); q->nreplies set; counted in the
 * loop's stats as a lane counts (the SCRIPT LOAD in script_loads, WAIT as a request). */
static int send_call(redsem__loop *l, redsem__preq *q, const redsem__call *call, bool load)
{
    int rc = conn_open(l, &l->req);
    if (rc != REDSEM_OK)
        return rc;
    const redsem__script_def *d = &redsem__script_defs[call->script];
    bool sync = call_syncs(l, call);
    redsem__args a, la, wa;
    redsem__args_init(&a);
    redsem__args_init(&la);
    redsem__args_init(&wa);
    redsem__args_str(&la, "SCRIPT");
    redsem__args_str(&la, "LOAD");
    redsem__args_mem(&la, d->text, d->len);
    redsem__args_str(&a, "EVALSHA");
    redsem__args_mem(&a, d->sha, 40);
    redsem__args_i64(&a, call->nkeys);
    for (int i = 0; i < call->ka.n; i++)
        redsem__args_mem(&a, call->ka.v[i], call->ka.len[i]);
    redsem__args_str(&wa, "WAIT");
    redsem__args_i64(&wa, l->c->sync_replicas);
    redsem__args_i64(&wa, l->c->sync_timeout_ms);
    char *pre = NULL, *cmd = NULL, *post = NULL;
    int plen = load ? redsem__args_format(&la, &pre) : 0;
    int clen = redsem__args_format(&a, &cmd);
    int wlen = sync ? redsem__args_format(&wa, &post) : 0;
    size_t len = (size_t)plen + (size_t)clen + (size_t)wlen;
    char *buf = plen >= 0 && clen >= 0 && wlen >= 0 ? redsem__malloc(len) : NULL;
    if (buf != NULL) {
        if (plen > 0)
            memcpy(buf, pre, (size_t)plen);
        memcpy(buf + plen, cmd, (size_t)clen);
        if (wlen > 0)
            memcpy(buf + plen + clen, post, (size_t)wlen);
        q->nreplies = (load ? 2 : 1) + (sync ? 1 : 0);
        int64_t cap = call->cap_ns;
        q->deadline_ns = redsem__now_ns() + l->c->command_timeout_ms * REDSEM__NS_PER_MS;
        if (cap != 0 && cap < q->deadline_ns)
            q->deadline_ns = cap;
        rc = redsem__pipe_send(&l->req.pipe, q, buf, len);
    } else {
        rc = REDSEM_ENOMEM;
    }
    if (rc == REDSEM_OK) {
        REDSEM__COUNT(&l->ctx, requests, sync ? 2 : 1);
        REDSEM__COUNT(&l->ctx, script_loads, load ? 1 : 0);
        if (l->req.pipe.inflight > 1)
            REDSEM__COUNT(&l->ctx, pipelined, 1);
    }
    redsem__free(buf);
    redisFreeCommand(pre);
    redisFreeCommand(cmd);
    redisFreeCommand(post);
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
    loop_op *o = arg;
    o->replied = true;
    if (q->rc != REDSEM_OK) /* the pipe's text now: a new connection clears it */
        snprintf(o->err, sizeof o->err, "%s", o->loop->req.pipe.err);
}

/* Send the call of o's current stage; a failure to send is the attempt's outcome. */
static void op_send(loop_op *o);
static void op_free(loop_op *o);
static void op_step(loop_op *o);
static void pend_take(redsem__loop *l, loop_op *o);

/* A new call of o (an attempt's stage, a single call, a give-back): no copy of it sent yet,
 * no retry window open. */
static void op_call(loop_op *o)
{
    o->noscript = 0;
    o->maybe = false;
    o->retry_until = 0;
    op_send(o);
}

/* o's request was lost with its connection (or none could be made), or came back LOADING
 * (a restarted server loading its data: nothing ran): whether its call goes again after a
 * pause, as node.c's request loop resends: with REDSEM__REQ_RETRY and a retry window, until
 * the window (opened at the first failure: retry_ms, cut by the call's own cap) ends; a
 * jittered pause of 5 ms doubling to 100 ms between two copies, each counted in
 * stats.retries. The pause is o's timer (o->resend), never a sleep. */
static bool retry_later(loop_op *o)
{
    redsem__loop *l = o->loop;
    int64_t now = redsem__now_ns();
    if (!(o->call.flags & REDSEM__REQ_RETRY) || l->c->retry_ms == 0)
        return false;
    if (o->retry_until == 0) {
        o->retry_until = now + l->c->retry_ms * REDSEM__NS_PER_MS;
        if (o->call.cap_ns != 0 && o->call.cap_ns < o->retry_until)
            o->retry_until = o->call.cap_ns;
        o->backoff_ns = 5 * REDSEM__NS_PER_MS;
    }
    if (now >= o->retry_until)
        return false;
    int64_t nap = redsem__rand_between(o->backoff_ns / 2, o->backoff_ns);
    if (nap > o->retry_until - now)
        nap = o->retry_until - now;
    o->backoff_ns = o->backoff_ns * 2 > 100 * REDSEM__NS_PER_MS ? 100 * REDSEM__NS_PER_MS
                                                               : o->backoff_ns * 2;
    REDSEM__COUNT(&l->ctx, retries, 1);
    o->resend = true;
    o->waiting = false;
    o->wake_ns = now + nap;
    return true;
}

/* o's request, written, ended with the earliest deadline of the requests in flight on its
 * connection (the server stalled: the pipe gives them all up then), before its own: it gives
 * up at its own deadline (o's timer), not earlier, as client.c's give_up_at_own_deadline. Its
 * not-after time (sent with it) was set from its own deadline, and a script that runs after
 * the caller gave up must find it passed. */
static void give_up_late(loop_op *o, int64_t deadline_ns)
{
    o->late = true;
    o->waiting = false;
    o->wake_ns = deadline_ns;
}

/* A request with WAIT ended: the oldest op queued behind it is due (sent by run_due). */
static void sync_next(redsem__loop *l)
{
    l->sync_busy = false;
    loop_op *n = l->sync_head;
    if (n == NULL)
        return;
    l->sync_head = n->sync_next;
    if (l->sync_head == NULL)
        l->sync_tail = NULL;
    n->sync_next = NULL;
    n->sync_turn = true;
    n->resend = true;
    n->wake_ns = 1;
}

static void acquire_end(loop_op *o, int rc);

/* A grant that did not reach the replicas the client asks for (redsem__grant_short): given
 * back on the loop, as acquire.c gives it back on a calling thread, before the acquire ends
 * (REDSEM_EREPLICA, with its attempt's error text). */
static void giveback_start(loop_op *o)
{
    redsem_client *c = o->loop->c;
    redsem__text_copy(o->why, redsem__errbuf(c));
    memset(&o->gb, 0, sizeof o->gb);
    o->gb.kind = o->s.kind;
    o->gb.handle = o->s.q.handle;
    o->gb.client = c;
    memcpy(o->gb.id, o->s.id, REDSEM_ID_BUFSIZE);
    o->giveback = true;
    o->s.kind->release_call(o->s.q.handle, &o->gb, &o->call);
    op_call(o);
}

static void giveback_end(loop_op *o, int rc, redisReply *r, redsem__req_info *info)
{
    redsem_client *c = o->loop->c;
    (void)o->s.kind->release_reply(c, o->s.q.handle, &o->gb, rc, r, info);
    if (r != NULL)
        freeReplyObject(r);
    redsem__text_copy(redsem__errbuf(c), o->why);
    o->s.given_back = true;
    acquire_end(o, REDSEM_OK);
}

static void attempt_outcome(loop_op *o, int rc, redisReply *r, redsem__req_info *info)
{
    const redsem__acquirer *q = &o->s.q;
    if (r != NULL && o->call.wake_prefix != NULL) {
        redisReply *wrap = redsem__wake_unwrap(&r);
        if (wrap != NULL)
            push_wakeups(o->loop, o->call.wake_prefix, wrap);
    }
    if (o->giveback) {
        giveback_end(o, rc, r, info);
        return;
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
        op_call(o);
        return;
    }
    o->s.att_rc = rc;
    o->s.att_info = *info;
    op_step(o);
}

/* Sentinel: whether r says the primary was demoted under us (READONLY: a failover; the call
 * was refused before anything was written). Then the connection is given up (the next
 * request resolves the primary again) and o->err says why, as node.c's READONLY branch. */
static bool demoted_reply(redsem__loop *l, loop_op *o, const redisReply *r)
{
    loop_conn *lc = &l->req;
    if (lc->node.resolve == NULL || r->type != REDIS_REPLY_ERROR || r->str == NULL ||
        strncmp(r->str, "READONLY", 8) != 0)
        return false;
    snprintf(o->err, sizeof o->err, "%s:%d became a replica (READONLY)", lc->node.ep.host,
             lc->node.ep.port);
    if (lc->pipe.rc == REDSEM_OK)
        redsem__pipe_fail(&lc->pipe, REDSEM_ECONN, o->err);
    return true;
}

/* The reply to o's request: a lost connection or LOADING sends it again within its retry
 * window ("maybe applied" kept when a copy was written); a NOSCRIPT is sent again with the
 * body; WAIT's reply becomes replicas_acked; an error reply becomes its code (with the text
 * as the thread's error text). */
static void op_reply(loop_op *o)
{
    redsem__loop *l = o->loop;
    redsem_client *c = l->c;
    redsem__preq *q = &o->req;
    redsem__req_info info = {.sent_ns = q->sent_ns, .recv_ns = q->recv_ns, .replicas_acked = -1};
    o->pending = o->replied = false;
    if (o->sync)
        sync_next(l);
    if (q->rc != REDSEM_OK) {
        o->maybe = o->maybe || q->written;
        int rc = redsem__set_err(c, q->rc, "%s", o->err);
        if (rc == REDSEM_ECONN && retry_later(o))
            return; /* timeouts are not retried: the server may be stalled */
        if (rc == REDSEM_ETIMEDOUT && o->maybe && redsem__now_ns() < q->deadline_ns) {
            give_up_late(o, q->deadline_ns);
            return;
        }
        info.maybe_applied = o->maybe;
        attempt_outcome(o, rc, NULL, &info);
        return;
    }
    _Atomic bool *sent = &c->scripts.sent[o->call.script];
    redisReply *r = q->replies[o->load ? 1 : 0];
    redisReply *w = o->sync ? q->replies[q->nreplies - 1] : NULL;
    if (o->load) {
        if (q->replies[0]->type == REDIS_REPLY_STRING)
            atomic_store(sent, true);
        freeReplyObject(q->replies[0]);
    }
    if (redsem__loading_reply(r) && retry_later(o)) {
        freeReplyObject(r);
        if (w != NULL)
            freeReplyObject(w);
        return;
    }
    if (demoted_reply(l, o, r)) { /* nothing applied: as a connection lost before writing */
        freeReplyObject(r);
        if (w != NULL)
            freeReplyObject(w);
        int rc = redsem__set_err(c, REDSEM_ECONN, "%s", o->err);
        if (retry_later(o))
            return;
        info.maybe_applied = o->maybe;
        attempt_outcome(o, rc, NULL, &info);
        return;
    }
    if (w != NULL) {
        l->ctx.errmsg[0] = '\0';
        info.replicas_acked = redsem__node_wait_acked(&l->req.node, w);
        if (l->ctx.errmsg[0] != '\0')
            (void)redsem__set_err(c, REDSEM_EREPLICA, "%s", l->ctx.errmsg);
        freeReplyObject(w);
    }
    info.maybe_applied = o->maybe;
    bool noscript = r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0;
    if (noscript && o->noscript++ < LOOP_NOSCRIPT_MAX) {
        freeReplyObject(r);
        atomic_store(sent, false);
        REDSEM__COUNT(&l->ctx, noscript, 1);
        op_send(o);
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        int rc = redsem__node_error_reply(&l->req.node, r, redsem__script_defs[o->call.script].name);
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
    redsem__loop *l = o->loop;
    const redsem__acquirer *q = &o->s.q;
    if (o->reply == NULL && !o->giveback) { /* an acquire: its attempt's call of this stage */
        q->attempt_call(q->handle, o->s.id, o->s.att_mode, q->weight, o->stage, &o->call);
        o->call.cap_ns = o->s.cap_ns;
    }
    o->sync = call_syncs(l, &o->call);
    if (o->sync && l->sync_busy) { /* behind the WAIT in flight (sync_next) */
        if (o->sync_turn) { /* its turn was taken by a new one: first again */
            o->sync_next = l->sync_head;
            l->sync_head = o;
            if (l->sync_tail == NULL)
                l->sync_tail = o;
        } else {
            if (l->sync_tail != NULL)
                l->sync_tail->sync_next = o;
            else
                l->sync_head = o;
            l->sync_tail = o;
        }
        o->sync_turn = false;
        return;
    }
    o->sync_turn = false;
    o->load = !atomic_load(&l->c->scripts.sent[o->call.script]);
    o->req.done = op_done;
    o->req.arg = o;
    int rc = send_call(l, &o->req, &o->call, o->load);
    if (rc == REDSEM_OK) {
        o->pending = true;
        l->sync_busy = l->sync_busy || o->sync;
        return;
    }
    if (rc == REDSEM_ECONN && retry_later(o))
        return; /* no connection: a new one after the pause */
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

/* A decided acquire (rc: the step's status): a grant short of its replicas is given back
 * first; then made a permit, called back, and o freed. */
static void acquire_end(loop_op *o, int rc)
{
    if (rc == REDSEM_OK && !o->s.given_back && redsem__grant_short(o->loop->c, &o->s.att)) {
        giveback_start(o);
        return;
    }
    redsem_permit *p = NULL;
    rc = redsem__acquire_finish(&o->s, rc, &p);
    o->done(o->arg, rc, p);
    op_free(o);
}

/* Take o's next step: an attempt is sent, a pause or a wait set as o's timer, a decided
 * acquire made a permit and called back (o then freed). */
static void op_step(loop_op *o)
{
    int rc = redsem__acquire_next(&o->s);
    if (rc == REDSEM__ATTEMPT) {
        o->stage = 0;
        op_call(o);
        return;
    }
    if (rc == REDSEM__NAP || rc == REDSEM__WAIT) {
        o->waiting = rc == REDSEM__WAIT;
        o->wake_ns = o->waiting ? redsem__now_ns() + o->s.wait_ms * REDSEM__NS_PER_MS
                                : o->s.nap_until_ns;
        if (o->waiting && o->s.cut_ns < o->wake_ns)
            o->wake_ns = o->s.cut_ns;
        if (o->waiting)
            pend_take(o->loop, o);
        return;
    }
    acquire_end(o, rc);
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
    op_call(o);
    return REDSEM_OK;
}

/* ---------------------------------------------------------------- the waits */

/* A waiting op is woken: its wait ends now, signaled. */
static void wake(loop_op *o)
{
    REDSEM__COUNT(&o->loop->ctx, wakeups, 1);
    o->s.signaled = true;
    o->wake_ns = 1;
}

static void wait_done(redsem__preq *q, void *arg)
{
    redsem__loop *l = arg;
    if (q == &l->blpop)
        l->blpop_replied = true;
    else
        l->drain_replied = true;
}

/* Whether key is one the BLPOP in flight watches. */
static bool watched(const redsem__loop *l, const char *key)
{
    for (int i = 0; i < l->nbkeys; i++)
        if (strcmp(l->bkeys[i], key) == 0)
            return true;
    return false;
}

/* The keys of the waiting ops (distinct, at most LOOP_WAIT_KEYS_MAX - 1) into keys; how many,
 * and in *until the earliest end of their waits. */
static int wait_keys(const redsem__loop *l, const char **keys, int64_t *until)
{
    int n = 0;
    *until = REDSEM__FOREVER;
    for (const loop_op *o = l->ops; o != NULL; o = o->next) {
        if (!o->waiting || o->s.wkey == NULL || o->s.keylen == 0)
            continue;
        if (o->wake_ns < *until)
            *until = o->wake_ns;
        bool seen = false;
        for (int i = 0; i < n && !seen; i++)
            seen = strcmp(keys[i], o->s.wkey) == 0;
        if (!seen && n < LOOP_WAIT_KEYS_MAX - 1)
            keys[n++] = o->s.wkey;
    }
    return n;
}

/* Send a script call of the loop's own (a drain, a poke) as q on the request connection. */
static void send_own(redsem__loop *l, redsem__preq *q, redsem__call *call, bool *pending)
{
    q->done = wait_done;
    q->arg = l;
    bool load = !atomic_load(&l->c->scripts.sent[call->script]);
    *pending = send_call(l, q, call, load) == REDSEM_OK;
}

/* Drain the client's id list: its elements name the fair waiters granted. */
static void send_drain(redsem__loop *l)
{
    if (l->drain_pending)
        l->drain_again = true; /* what was pushed after that drain ran */
    if (l->drain_pending || l->c->wake_ids == NULL)
        return;
    redsem__call call;
    redsem__call_init(&call, REDSEM__SCRIPT_WAKE_DRAIN, REDSEM__REQ_RETRY, NULL);
    const char *keys[] = {l->c->wake_ids};
    redsem__call_keys(&call, 1, keys);
    redsem__args_i64(&call.ka, 256);
    send_own(l, &l->drain, &call, &l->drain_pending);
}

/* Start the BLPOP on the waiting ops' keys and our control list, until the earliest of their
 * waits ends; or, one being in flight without a key now waited on, end it by a push to the
 * control list. */
static void wait_sync(redsem__loop *l)
{
    const char *keys[LOOP_WAIT_KEYS_MAX];
    int64_t until;
    int n = wait_keys(l, keys, &until);
    if (l->blpop_pending) {
        for (int i = 0; i < n && !l->poked; i++)
            if (!watched(l, keys[i])) {
                redsem__call call;
                redsem__call_init(&call, REDSEM__SCRIPT_WAKE_PUSH, REDSEM__REQ_RETRY, NULL);
                const char *k[] = {l->ctl, l->ctl};
                redsem__call_keys(&call, 2, k);
                redsem__args_str(&call.ka, "s");
                redsem__args_str(&call.ka, "1");
                bool sent = false;
                loop_push *p = redsem__calloc(1, sizeof *p);
                if (p != NULL) {
                    p->req.done = push_done;
                    bool load = !atomic_load(&l->c->scripts.sent[REDSEM__SCRIPT_WAKE_PUSH]);
                    sent = send_call(l, &p->req, &call, load) == REDSEM_OK;
                    if (!sent)
                        redsem__free(p);
                }
                l->poked = sent;
            }
        return;
    }
    int64_t left_ms = (until - redsem__now_ns()) / REDSEM__NS_PER_MS;
    if (n == 0 || left_ms < 2 || redsem__now_ns() < l->blpop_after ||
        conn_open(l, &l->wait) != REDSEM_OK)
        return; /* the waits end by their timers */
    /* BLPOP keys... ctl timeout: more arguments than a redsem__args holds, so hiredis'
     * argv form */
    const char *argv[LOOP_WAIT_KEYS_MAX + 2];
    char t[32];
    snprintf(t, sizeof t, "%lld.%03lld", (long long)(left_ms / 1000), (long long)(left_ms % 1000));
    argv[0] = "BLPOP";
    for (int i = 0; i < n; i++)
        argv[1 + i] = keys[i];
    argv[n + 1] = l->ctl;
    argv[n + 2] = t;
    char *cmd = NULL;
    long long len = redisFormatCommandArgv(&cmd, n + 3, argv, NULL);
    if (len < 0)
        return;
    l->blpop = (redsem__preq){.nreplies = 1, .done = wait_done, .arg = l};
    l->blpop.deadline_ns = until + l->c->command_timeout_ms * REDSEM__NS_PER_MS;
    if (redsem__pipe_send(&l->wait.pipe, &l->blpop, cmd, (size_t)len) == REDSEM_OK) {
        REDSEM__COUNT(&l->ctx, requests, 1);
        l->blpop_pending = true;
        l->poked = false;
        for (int i = 0; i < n; i++)
            l->bkeys[l->nbkeys++] = redsem__strdup(keys[i]); /* NULL: not watched */
    }
    redisFreeCommand(cmd);
}

/* The BLPOP's reply: the oldest op waiting on the list popped is woken (the client's bell: the
 * fair waiters its id list names, once drained). A timeout or a fault wakes nobody. */
static void blpop_reply(redsem__loop *l)
{
    redsem__preq *q = &l->blpop;
    l->blpop_pending = l->blpop_replied = false;
    for (int i = 0; i < l->nbkeys; i++)
        redsem__free(l->bkeys[i]);
    l->nbkeys = 0;
    redisReply *r = q->rc == REDSEM_OK ? q->replies[0] : NULL;
    if (r == NULL || r->type == REDIS_REPLY_ERROR) /* not again at once: 100 ms */
        l->blpop_after = redsem__now_ns() + 100 * REDSEM__NS_PER_MS;
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING) {
        const char *key = r->element[0]->str;
        loop_op *oldest = NULL;
        if (l->c->wake_bell != NULL && strcmp(key, l->c->wake_bell) == 0)
            send_drain(l);
        else
            for (loop_op *o = l->ops; o != NULL; o = o->next)
                if (o->waiting && o->s.wkey != NULL && strcmp(o->s.wkey, key) == 0 &&
                    (oldest == NULL || o->s.since_ns < oldest->s.since_ns))
                    oldest = o;
        if (oldest != NULL)
            wake(oldest);
    }
    if (r != NULL)
        freeReplyObject(r);
}

/* A direct grant an element carried after "<id> <meta>": " <token> <server us> <lease ms>"
 * (prelude.lua's grant_heads), for the acquire to check (acquire.c's direct_grant). */
static void take_grant(loop_op *o, const char *rest, size_t len)
{
    char buf[80];
    unsigned long long token;
    long long us, lease;
    if (len == 0 || len >= sizeof buf)
        return;
    memcpy(buf, rest, len);
    buf[len] = '\0';
    if (sscanf(buf, " %llu %lld %lld", &token, &us, &lease) == 3)
        o->s.grant = (redsem__wake_grant){token, us, lease};
}

/* Whether the drained element e (len bytes) is o's: "<id> <meta>", then the end or a space. */
static bool elem_of(const loop_op *o, const char *e, size_t len)
{
    size_t n = strlen(o->s.elem);
    return n > 0 && len >= n && memcmp(e, o->s.elem, n) == 0 && (len == n || e[n] == ' ');
}

/* Keep element e, whose waiter is not waiting now, for its next wait (the oldest kept goes
 * when all are taken). */
static void pend_keep(redsem__loop *l, const char *e, size_t len)
{
    int slot = 0;
    for (int i = 0; i < LOOP_PEND_MAX; i++)
        if (l->pend[i] == NULL || l->pend_at[i] < l->pend_at[slot]) {
            slot = i;
            if (l->pend[i] == NULL)
                break;
        }
    redsem__free(l->pend[slot]);
    l->pend[slot] = redsem__malloc(len + 1);
    if (l->pend[slot] != NULL) {
        memcpy(l->pend[slot], e, len);
        l->pend[slot][len] = '\0';
    }
    l->pend_at[slot] = redsem__now_ns();
}

/* o begins a wait: an element kept for it (not older than LOOP_PEND_NS) wakes it at once. */
static void pend_take(redsem__loop *l, loop_op *o)
{
    int64_t now = redsem__now_ns();
    for (int i = 0; i < LOOP_PEND_MAX; i++) {
        if (l->pend[i] == NULL)
            continue;
        size_t len = strlen(l->pend[i]);
        bool mine = elem_of(o, l->pend[i], len);
        if (mine) {
            size_t n = strlen(o->s.elem);
            take_grant(o, l->pend[i] + n, len - n);
            wake(o);
        }
        if (mine || now - l->pend_at[i] > LOOP_PEND_NS) {
            redsem__free(l->pend[i]);
            l->pend[i] = NULL;
        }
        if (mine)
            return;
    }
}

/* The drain's reply: each element "<id> <meta>[ ...]" wakes the op waiting as it; one of a
 * waiter between two attempts is lost (its poll finds its grant). Full: drain again. */
static void drain_reply(redsem__loop *l)
{
    redsem__preq *q = &l->drain;
    l->drain_pending = l->drain_replied = false;
    if (q->rc != REDSEM_OK) {
        l->drain_again = false;
        send_drain(l); /* on a new connection (a lost reply's elements are lost) */
        return;
    }
    redisReply *r = q->replies[q->nreplies - 1];
    if (q->nreplies == 2)
        freeReplyObject(q->replies[0]);
    if (q->nreplies == 2 || r->type != REDIS_REPLY_ERROR)
        atomic_store(&l->c->scripts.sent[REDSEM__SCRIPT_WAKE_DRAIN], r->type != REDIS_REPLY_ERROR);
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *e = r->element[i];
        bool taken = false;
        for (loop_op *o = l->ops; e->type == REDIS_REPLY_STRING && o != NULL; o = o->next)
            if (o->waiting && elem_of(o, e->str, e->len)) {
                size_t n = strlen(o->s.elem);
                take_grant(o, e->str + n, e->len - n);
                wake(o);
                taken = true;
            }
        if (!taken && e->type == REDIS_REPLY_STRING)
            pend_keep(l, e->str, e->len);
    }
    bool full = r->type == REDIS_REPLY_ARRAY && r->elements == 256;
    /* NOSCRIPT (a flushed cache): once more, with the body */
    if (r->type == REDIS_REPLY_ERROR && q->nreplies == 1 && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        atomic_store(&l->c->scripts.sent[REDSEM__SCRIPT_WAKE_DRAIN], false);
        REDSEM__COUNT(&l->ctx, noscript, 1);
        full = true;
    }
    freeReplyObject(r);
    if (full || l->drain_again) {
        l->drain_again = false;
        send_drain(l);
    }
}

/* ---------------------------------------------------------------- the loop's part */

int redsem__loop_wants(const redsem__loop *l, redsem__loop_watch w[REDSEM__LOOP_WATCH_MAX],
                       int64_t *deadline_ns)
{
    int n = 0;
    *deadline_ns = REDSEM__FOREVER;
    const loop_conn *lcs[2] = {&l->req, &l->wait};
    for (int i = 0; i < 2; i++) {
        int64_t d = REDSEM__FOREVER;
        const loop_conn *lc = lcs[i];
        if (lc->state == LC_OPEN || lc->state == LC_HANDSHAKE) {
            short ev = redsem__pipe_wants(&lc->pipe, &d);
            if (ev != 0)
                w[n++] = (redsem__loop_watch){redsem__pipe_fd(&lc->pipe), ev};
        } else if (lc->state != LC_CLOSED) { /* its dial: its sockets, c-ares' timeout */
            struct pollfd p[REDSEM__DIAL_SOCKS + 1];
            int k = lc->ask.state != REDSEM__ASK_IDLE
                        ? redsem__sentinel_ask_wants(&lc->ask, p, REDSEM__DIAL_SOCKS + 1, &d)
                        : redsem__dial_wants(&lc->dial, p, REDSEM__DIAL_SOCKS + 1, &d);
            for (int j = 0; j < k; j++)
                w[n++] = (redsem__loop_watch){p[j].fd, p[j].events};
            int64_t by = open_deadline(lc);
            if (by < d)
                d = by;
        }
        if (d < *deadline_ns)
            *deadline_ns = d;
    }
    for (const loop_op *o = l->ops; o != NULL; o = o->next) {
        int64_t at = o->wake_ns;
        if (at != 0 && o->waiting && atomic_load(&o->cancel))
            at = 1; /* cancelled while it waits: now */
        if (at != 0 && at < *deadline_ns)
            *deadline_ns = at;
    }
    return n;
}

unsigned redsem__loop_generation(const redsem__loop *l)
{
    return l->gen + l->req.dial.gen + l->wait.dial.gen + l->req.ask.gen + l->wait.ask.gen;
}

/* Whether o has something due now: its request ended, or its timer (or its cancel). */
static bool is_due(const loop_op *o, int64_t now)
{
    bool cut = o->waiting && atomic_load(&o->cancel);
    return o->replied || (o->wake_ns != 0 && (o->wake_ns <= now || cut));
}

/* Run o's part that is due: the reply to its request, or the end of its pause or wait. */
static void run_due(loop_op *o)
{
    if (o->replied) {
        op_reply(o);
        return;
    }
    o->wake_ns = 0;
    if (o->resend) { /* a pause before a copy of its call ended */
        o->resend = false;
        op_send(o);
        return;
    }
    if (o->late) { /* its own deadline came: the timeout is its outcome now */
        o->late = false;
        redsem__req_info info = {.maybe_applied = true, .replicas_acked = -1};
        attempt_outcome(o, redsem__set_err(o->loop->c, REDSEM_ETIMEDOUT, "%s", o->err), NULL,
                        &info);
        return;
    }
    if (o->waiting) {
        o->waiting = false;
        o->s.wait_rc = REDSEM_OK; /* s.signaled: set if a wake-up ended it */
        op_step(o);
        return;
    }
    o->stage = 0; /* a pause ended: its attempt */
    op_call(o);
}

/* Run every op that is due now, in one pass over the list (what they start is seen in the
 * next round); whether any ran. An op run frees only itself, and new ones go to the head. */
static bool run_all_due(redsem__loop *l)
{
    int64_t now = redsem__now_ns();
    size_t n = 0;
    for (const loop_op *o = l->ops; o != NULL; o = o->next)
        n += is_due(o, now);
    if (n == 0)
        return false;
    loop_op **v = redsem__malloc(n * sizeof *v);
    if (v == NULL)
        return false; /* the next step tries again */
    size_t k = 0;
    for (loop_op *o = l->ops; o != NULL && k < n; o = o->next)
        if (is_due(o, now))
            v[k++] = o;
    for (size_t i = 0; i < k; i++)
        run_due(v[i]);
    redsem__free(v);
    return true;
}

/* A step of lc's dial: ready says which of its descriptors are; its deadline ends it. */
static void dial_step(redsem__loop *l, loop_conn *lc, const struct pollfd *ready, int n)
{
    char err[REDSEM__ERRMSG_LEN] = "";
    if (lc->ask.state != REDSEM__ASK_IDLE) { /* Sentinel: asked first, then the dial */
        int rc = redsem__now_ns() >= open_deadline(lc)
                     ? redsem__sentinel_ask_timeout(&lc->ask)
                     : redsem__sentinel_ask_step(&lc->ask, ready, n);
        if (rc == REDSEM_OK && lc->ask.state == REDSEM__ASK_IDLE)
            rc = dial_begin(l, lc, err, sizeof err);
        else if (rc != REDSEM_OK)
            snprintf(err, sizeof err, "%s", lc->ask.err);
        if (rc != REDSEM_OK)
            conn_fail(l, lc, rc, err);
        else if (lc->ask.state == REDSEM__ASK_IDLE)
            dial_moved(l, lc);
        return;
    }
    int rc = redsem__dial_step(&lc->dial, ready, n, err, sizeof err);
    if (rc == REDSEM_OK && lc->dial.state != REDSEM__DIAL_DONE &&
        redsem__now_ns() >= open_deadline(lc))
        rc = redsem__dial_timeout(&lc->dial, err, sizeof err);
    if (rc != REDSEM_OK)
        conn_fail(l, lc, rc, err);
    else
        dial_moved(l, lc);
}

/* Step lc with the readiness found for its descriptors in ready: its dial while it opens,
 * else its pipe (then its handshake's outcome, when it came). */
static void conn_step(redsem__loop *l, loop_conn *lc, const struct pollfd *ready, int n)
{
    if (lc->state != LC_OPEN && lc->state != LC_HANDSHAKE && lc->state != LC_CLOSED)
        dial_step(l, lc, ready, n); /* done: its first write may have failed (hs_replied) */
    if (lc->state != LC_OPEN && lc->state != LC_HANDSHAKE)
        return;
    bool r = false, w = false;
    for (int i = 0; i < n; i++)
        if (ready[i].fd == redsem__pipe_fd(&lc->pipe)) {
            r = (ready[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
            w = (ready[i].revents & POLLOUT) != 0;
        }
    (void)redsem__pipe_step(&lc->pipe, r, w, redsem__now_ns());
    if (lc->role_demoted) { /* Sentinel: given up, its requests resent, resolving again */
        lc->role_demoted = false;
        if (lc->pipe.rc == REDSEM_OK)
            redsem__pipe_fail(&lc->pipe, REDSEM_ECONN, lc->hs_err);
    }
    if (lc->hs_replied) {
        lc->hs_replied = false;
        if (lc->hs_rc == REDSEM_OK)
            conn_opened(l, lc);
        else
            conn_fail(l, lc, lc->hs_rc, lc->hs_err);
    }
}

void redsem__loop_step(redsem__loop *l, const struct pollfd *ready, int n)
{
    bool ran;
    do {
        /* writes what was queued (also by the last round), reads what arrived */
        conn_step(l, &l->req, ready, n);
        conn_step(l, &l->wait, ready, n);
        n = 0;
        ran = false;
        if (l->blpop_replied) {
            blpop_reply(l);
            ran = true;
        }
        if (l->drain_replied) {
            drain_reply(l);
            ran = true;
        }
        ran = run_all_due(l) || ran;
        wait_sync(l);
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
    redsem__stats_detach(l->c, &l->ctx); /* its counters stay in the client's */
    loop_conn *lcs[2] = {&l->req, &l->wait};
    for (int i = 0; i < 2; i++) {
        redsem__sentinel_ask_cancel(&lcs[i]->ask);
        redsem__dial_cancel(&lcs[i]->dial);
        lcs[i]->state = LC_CLOSED;
        redsem__pipe_reset(&lcs[i]->pipe); /* requests end (ops: not called back) */
    }
    while (l->ops != NULL) {
        loop_op *o = l->ops;
        l->ops = o->next;
        redsem__free(o);
    }
    for (int i = 0; i < l->nbkeys; i++)
        redsem__free(l->bkeys[i]);
    for (int i = 0; i < LOOP_PEND_MAX; i++)
        redsem__free(l->pend[i]);
    for (int i = 0; i < 2; i++)
        redsem__node_close(&lcs[i]->node);
    if (l->topo.kind != 0)
        redsem__topo_close(&l->topo);
    redsem__free(l);
}
