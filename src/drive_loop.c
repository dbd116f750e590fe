/* redsem - the engine: an acquire's steps (acquire.c) and every other call run as ops,
 * their requests on one non-blocking connection (node/conn.h's pipe), the waits as one
 * BLPOP at a time on a second one, stepped by whoever calls redsem__loop_step() when the
 * descriptors and the deadline that redsem__loop_wants() names are due: the event-loop API
 * (async.c) on the caller's loop, or the blocking driver's calling threads (drive_sync.c).
 * It starts no thread and never sleeps.
 * An op's faults are its states: a request lost with its connection, or answered LOADING,
 * is sent again after a pause (its timer: resend) within its retry window, "maybe applied"
 * kept (retry_later); one given up with an earlier request's deadline ends at its own
 * (give_up_late); NOSCRIPT sends the body; with sync_replicas one WAIT per connection
 * covers the calls written before it (group commit: sync_flush; its members park their
 * replies until it answers), and a grant short of its replicas is given back by a release
 * on the loop (giveback_start). The waits' requests are states too: a BLPOP or a drain lost
 * with its connection, or answered LOADING, goes again after the same pause within its own
 * window (wait_fault, drain_lost); a lost drain's fair waiters attempt at once (its
 * elements may be lost); UNBLOCKED cuts the waits (each attempts again). Its counters are
 * the client's (redsem__stats_attach).
 * A connection opens without blocking either (conn_open: closed, resolving, connecting, tls
 * through net/dial.c; then its handshake as one request on its pipe, judged by node/node.c's
 * redsem__handshake_judge; open): the requests sent meanwhile wait behind it in the pipe
 * (held) and end with the connect's code, never written, if it fails.
 * A Cluster client: a slot map of the engine's own (cluster.c's, read by CLUSTER SLOTS on
 * the loop: map_ask), a request connection per node, each call sent to the node of its first
 * key's slot (call_conn); MOVED, ASK, TRYAGAIN and CLUSTERDOWN judged by topo/cluster.c's
 * redsem__cluster_redirected and followed as states of the op (op_redirected): at once to
 * the node named, or after a pause within the retry window; a lost node asks for the map
 * again. Its waiters poll (no BLPOP: one takes the keys of one slot only).
 * Under Sentinel the resolve step comes first (LC_RESOLVING): the client's watch gives the
 * primary's address, or the Sentinels are asked without blocking (topo/sentinel_loop.c:
 * dialled, asked and judged as the blocking resolve asks them, same codes and texts); the
 * handshake then checks ROLE, and so does a request every REDSEM__ROLE_CHECK_MS
 * (role_recheck); an open connection to a primary the watch says moved, one that answers
 * READONLY (demoted_reply) or whose ROLE is no longer "master" is given up, and its calls
 * are resent within their retry windows, resolving again.
 * What it does not do yet: docs/design.md section 16. */
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

#define LOOP_NOSCRIPT_MAX 5

/* A retry window, one per request: opened at the first failure, with the pause before the
 * next copy. */
typedef struct loop_retry {
    int64_t until;      /* the window ends then (0: not opened) */
    int64_t backoff_ns; /* the next pause */
} loop_retry;

typedef struct loop_op loop_op;
typedef struct loop_conn loop_conn;
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
    uint32_t whash;  /* ... its key's hash (key_hash), and its element's length: set as it */
    size_t elen;     /* starts waiting, so that a thousand waiters are told apart cheaply */
    int wait_rc;     /* ... ended by a fault of the wait connection (REDSEM_OK: none) */
    bool resend;     /* the pause ends with its call sent again (lost connection, LOADING) */
    bool late;       /* ... or with its request's timeout (give_up_late) */
    loop_retry rw;       /* its call's retry window */
    /* sync_replicas: its call, written alone, waits for a WAIT of its connection (a member
     * of the loop's synced list: SYNC_NEXT for the next WAIT, SYNC_CUR for the one in
     * flight); its reply, in, parks (pr, pinfo) until that WAIT's outcome (wdone: wrc, the
     * replicas it counted, werr: its error text in err) */
    struct loop_sync {
        loop_op *op;
        struct loop_sync *next, *prev;
    } sm;
    int wg;
    bool wdone, werr, parked;
    int wrc, wacked;
    redisReply *pr;
    redsem__req_info pinfo;
    char err[256];       /* why its request failed (the pipe's text, kept) */
    loop_conn *lc;       /* the connection its request went to (route) */
    /* a Cluster client's: where a redirection sends its next copy (to: an index of the
     * map's nodes, with ASKING first after an ASK), the redirections of its call, and
     * whether its pause waits for the slot map (map_wait: woken by its reply) */
    bool redirected, asking, mapwait;
    /* an open (redsem__loop_open): it ends when the connection it waits for is open, or
     * (a cluster) when a round of questions read the map, or failed */
    loop_conn *opening;
    bool opening_map;
    size_t to;
    int hops;
    int64_t map_until;
    /* a grant that did not reach the replicas: given back (the release of gb), then the
     * acquire ends with the error text why kept from its attempt */
    bool giveback;
    redsem_permit gb;
    char why[REDSEM__ERRMSG_LEN];
    redsem__call *call; /* its call: own_call, or the caller's (redsem__loop_run) */
    redsem__call own_call;
    redsem__preq req;
    atomic_bool cancel;
    redsem__loop_done done;
    void *arg;
    /* a wait alone (redsem__loop_wait): where it says whether it was woken, and its grant */
    bool bare;
    bool *bare_signaled;
    redsem__wake_grant *bare_grant;
    /* NULL: an acquire (s); else a single call, whose outcome this takes (redsem__loop_call) */
    redsem__loop_reply reply;
    loop_op *next, *prev; /* in l->ops, newest first */
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
struct loop_conn {
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
    size_t idx; /* a Cluster client's: its node's index in the map's table */
    redsem__loop *loop;
    /* sync_replicas: the WAIT in flight, for the calls written before it (sync_flush), its
     * members' earliest cap (0: none), the flush that sent it */
    redsem__preq syncq;
    bool sync_pending;
    int64_t sync_cap;
    uint64_t sync_round;
};

enum { SYNC_NONE, SYNC_NEXT, SYNC_CUR };

#define LOOP_WAIT_KEYS_MAX 256 /* keys one BLPOP watches (a waiter beyond polls) */
#define LOOP_PEND_MAX 256
#define LOOP_PEND_NS (10000 * REDSEM__NS_PER_MS)
/* a Cluster client: the nodes the engine holds a connection to at once (the rest of
 * REDSEM__LOOP_CONNS_MAX are req and wait, unused there) */
#define LOOP_NODES_MAX (REDSEM__LOOP_CONNS_MAX - 2)

struct redsem__loop {
    redsem_client *c;
    redsem__ctx ctx;
    /* Sentinel: the Sentinels asked, the client's watch (its node: the data endpoint, not
     * connected); kind 0: a one-server client */
    redsem__topo sent;
    loop_conn req;  /* the attempts, releases, drains and pushes */
    loop_conn wait; /* one BLPOP at a time on the waiters' lists (and ctl) */
    struct {
        loop_op *head, *tail;
    } ops; /* under way, newest first (constant-time unlink: a loop's thousand ops) */
    /* No op's timer (wake_ns) is earlier than this: exact after a step (its last pass over
     * the ops, run_all_due, finds none due and takes their earliest), lowered by each timer
     * set since (wake_at); early, never late, after an op's timer moved later or went. */
    int64_t wake_min;
    /* Since run_all_due last looked at every op: an op was replied, or another thread set an
     * op's cancel flag (redsem__loop_cancel). Neither, and no timer due: none is due. */
    bool any_replied;
    atomic_bool any_cancel;
    /* the BLPOP in flight: its request, the keys it watches (copies), whether it was poked */
    redsem__preq blpop;
    bool blpop_pending, blpop_replied, poked;
    char *bkeys[LOOP_WAIT_KEYS_MAX];
    uint32_t bhash[LOOP_WAIT_KEYS_MAX]; /* their hashes */
    int nbkeys;
    bool unwatched; /* an op began waiting on a key the BLPOP in flight does not watch */
    redsem__preq drain; /* a drain of the client's id list after its bell popped */
    bool drain_pending, drain_replied;
    bool drain_again; /* the bell popped while a drain was in flight: drain once more */
    /* the element the bell's BLPOP popped and woke its waiter with (bell_take), for the drain
     * to drop its copy of (the id list holds the same text: grant_heads pushes to both) */
    char *bell_taken;
    char ctl[128]; /* our control list: a push ends the BLPOP, to watch a new key */
    /* with sync_replicas: the ops whose calls wait for a WAIT (loop_op's sm), oldest first;
     * a WAIT may be due (a member joined, or one ended); the flushes so far */
    struct {
        struct loop_sync *head, *tail;
    } synced;
    bool sync_due;
    uint64_t flushes;
    int64_t blpop_after; /* after a refused or failed BLPOP, none before then (waiters poll) */
    bool blpop_resend;   /* ... and then one at once (a lost one's pause: a deadline) */
    loop_retry blpop_rw; /* the BLPOP's retry window (closed by a reply) */
    int64_t drain_at;    /* a lost drain goes again then (0: none due) */
    loop_retry drain_rw; /* its retry window (closed by a reply) */
    bool drain_due;      /* its window ended undrained: the next BLPOP drains first */
    unsigned gen;  /* connections made (a new one may reuse a closed one's number) */
    /* drained elements whose waiter was between two attempts: its next wait takes one at
     * once, kept LOOP_PEND_NS at most */
    char *pend[LOOP_PEND_MAX];
    int64_t pend_at[LOOP_PEND_MAX];
    /* a Cluster client: a slot map of its own (cluster.c's, read by CLUSTER SLOTS on the
     * loop: map_ask), and per node of it (by its index in topo->nodes) a request
     * connection, made on first use (node_conn); NULL: one server (req and wait) */
    redsem__topo *topo;
    loop_conn **nconn;
    int nconns;
    redsem__preq mapq; /* the CLUSTER SLOTS in flight, to topo->nodes[map_idx] */
    bool map_pending, map_replied;
    size_t map_idx, map_next; /* ... and the node asked first next time */
    /* a round of questions for the map (map_ask): the nodes in the order asked, the next,
     * its deadline, the worst failure so far and what each said */
    struct {
        bool on;
        size_t order[REDSEM__CLUSTER_NODES_MAX], m, j;
        int64_t deadline;
        int worst;
        char why[512];
    } round;
    bool map_known;     /* a round read the map */
    int map_rc;         /* the last round's outcome, and its text */
    char map_err[600];
    int64_t failed_ns[REDSEM__CLUSTER_NODES_MAX]; /* its last call or question failed then */
    int64_t silent_ns[REDSEM__CLUSTER_NODES_MAX]; /* a request to it timed out then (0: no) */
    int route_rc; /* why call_conn or node_conn found no connection (the text set) */
};

/* o's timer is at (not 0; 1: now): the engine's earliest is at most that. */
static void wake_at(loop_op *o, int64_t at)
{
    o->wake_ns = at;
    if (at < o->loop->wake_min)
        o->loop->wake_min = at;
}

static int cluster_new(redsem__loop *l, char *err, size_t errlen);
static void cluster_free(redsem__loop *l);

/* The engine this thread steps or starts an op on now (NULL: none): what an op's call
 * builder asks of its node (the server's clock, its address) is this engine's
 * (redsem__loop_current). Set around every entry that runs ops. */
static _Thread_local redsem__loop *stepping;

redsem__loop *redsem__loop_current(const redsem_client *c)
{
    return stepping != NULL && stepping->c == c ? stepping : NULL;
}

int redsem__loop_new(redsem_client *c, redsem__loop **ret)
{
    bool cluster = c->ep.kind == REDSEM__EP_CLUSTER;
    if (c->ep.kind != REDSEM__EP_TCP && c->ep.kind != REDSEM__EP_UNIX &&
        c->ep.kind != REDSEM__EP_SENTINEL && !cluster)
        return redsem__set_err(c, REDSEM_EINVAL, "the loop driver takes a one-server, Sentinel "
                                                 "or Cluster client");
    redsem__loop *l = redsem__calloc(1, sizeof *l);
    if (l == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    l->c = c;
    l->wake_min = REDSEM__FOREVER;
    atomic_init(&l->any_cancel, false);
    char err[REDSEM__ERRMSG_LEN] = "";
    redsem__endpoint cep; /* a cluster's req and wait: its first seed, never opened */
    const redsem__endpoint *ep = &c->ep;
    if (cluster) {
        cep = (redsem__endpoint){.kind = REDSEM__EP_TCP, .host = c->ep.hosts[0].host,
                                 .port = c->ep.hosts[0].port};
        ep = &cep;
    }
    if (c->ep.kind == REDSEM__EP_SENTINEL) {
        int rc = redsem__topo_init(&l->sent, &l->ctx, &c->ep, &c->cfg, err, sizeof err);
        if (rc != REDSEM_OK) {
            redsem__topo_close(&l->sent);
            redsem__free(l);
            return redsem__set_err(c, rc, "%s", err);
        }
        l->sent.watch = c->sentinel_watch;
        ep = &l->sent.single.ep; /* the data node's: credentials, db, TLS */
    }
    loop_conn *lcs[2] = {&l->req, &l->wait};
    l->req.loop = l->wait.loop = l;
    for (int i = 0; i < 2; i++) {
        int rc = redsem__node_init(&lcs[i]->node, &l->ctx, ep, &c->cfg, err, sizeof err);
        if (rc != REDSEM_OK) {
            if (i == 1)
                redsem__node_close(&l->req.node);
            if (l->sent.kind != 0)
                redsem__topo_close(&l->sent);
            redsem__free(l);
            return redsem__set_err(c, rc, "%s", err);
        }
        /* one server (the primary, under Sentinel): the client's clock and script cache */
        lcs[i]->node.clock = &c->clock;
        lcs[i]->node.scripts = &c->scripts;
        if (l->sent.kind != 0) { /* never called here: the node is found through Sentinel
                                  * (ROLE in its handshake, READONLY a lost connection) */
            lcs[i]->node.resolve = redsem__sentinel_resolve;
            lcs[i]->node.resolve_arg = &l->sent;
        }
    }
    int crc = cluster ? cluster_new(l, err, sizeof err) : REDSEM_OK;
    if (crc != REDSEM_OK) {
        cluster_free(l);
        for (int i = 0; i < 2; i++)
            redsem__node_close(&lcs[i]->node);
        redsem__free(l);
        return redsem__set_err(c, crc, "%s", err);
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
    /* the steps answered, in order (after a fault, those that were: a refusal a broken
     * server gave says more than its silence after it) */
    int answered = q->rc == REDSEM_OK ? lc->hs.n : q->got;
    for (int i = 0; i < lc->hs.n; i++) {
        bool in = i < answered;
        rc = redsem__handshake_judge(&lc->node, lc->hs.step[i], in ? REDSEM_OK : q->rc,
                                     in ? q->replies[i] : NULL, q->recv_ns, lc->hs_err,
                                     sizeof lc->hs_err);
        if (rc != REDSEM_OK)
            break;
    }
    for (int i = 0; i < answered; i++) {
        freeReplyObject(q->replies[i]);
        q->replies[i] = NULL;
    }
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
        lc->hsq = (redsem__preq){.nreplies = lc->hs.n, .done = hs_done, .arg = lc,
                                 .keep_partial = true};
        lc->hsq.deadline_ns = lc->open_by;
        rc = all == NULL ? REDSEM_ENOMEM : redsem__pipe_send(&lc->pipe, &lc->hsq, all, total);
        lc->hs_len = total;
        if (rc == REDSEM_OK) /* each step a request, as a blocking connect counted them */
            REDSEM__COUNT(lc->node.ctx, requests, (uint64_t)lc->hs.n);
    }
    for (int i = 0; i < lc->hs.n; i++)
        redsem__handshake_free(cmd[i], len[i]);
    redsem__handshake_free(all, (int)total);
    redsem__pipe_hold(&lc->pipe);
    return rc;
}

/* lc's open failed with rc (err): the requests waiting for it end with it, never written
 * (not applied). */
static void opens_end(redsem__loop *l, const loop_conn *lc, int rc, const char *err);

static void conn_fail(redsem__loop *l, loop_conn *lc, int rc, const char *err)
{
    opens_end(l, lc, rc, err);
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
static void sync_done(redsem__preq *q, void *arg);

/* The cap of q, a request on lc: its op's call's, or a WAIT's members' (0: none). */
static int64_t preq_cap(const loop_conn *lc, const redsem__preq *q)
{
    const loop_op *o = q->done == op_done ? q->arg : NULL;
    return o != NULL ? o->call->cap_ns : q->done == sync_done ? lc->sync_cap : 0;
}

static void conn_opened(redsem__loop *l, loop_conn *lc)
{
    int64_t now = redsem__now_ns(), dl = now + l->c->command_timeout_ms * REDSEM__NS_PER_MS;
    for (redsem__preq *q = lc->pipe.head; q != NULL; q = q->next) {
        if (!redsem__pipe_held(&lc->pipe, q))
            continue;
        if (q->deadline_ns < dl)
            q->deadline_ns = dl;
        int64_t cap = preq_cap(lc, q);
        if (cap != 0 && cap < q->deadline_ns)
            q->deadline_ns = cap;
    }
    redsem__pipe_unhold(&lc->pipe);
    redsem__node_opened(&lc->node);
    lc->state = LC_OPEN;
    opens_end(l, lc, REDSEM_OK, "");
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
    redsem__pipe_retime(&lc->pipe);
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
    int rc = redsem__sentinel_ask_start(&lc->ask, &l->sent, &lc->node, lc->open_by);
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
 * REDSEM__ROLE_CHECK_MS old (counted as a request). */
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
    /* Sentinel: an open connection to a primary the watch says moved is given up first
     * (what is in flight on it is lost: resent within its window) */
    char why[256];
    if (lc->state == LC_OPEN && lc->pipe.rc == REDSEM_OK && lc->node.resolve != NULL &&
        redsem__sentinel_moved_nb(&l->sent, &lc->node, why, sizeof why))
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
        int64_t cap = preq_cap(lc, q);
        if (cap != 0 && cap < d)
            d = cap;
    }
    return d;
}

/* Cap lc's open (if it is not open yet) at dl: its connect and its handshake end by then. */
static void conn_cap(loop_conn *lc, int64_t dl)
{
    if (lc->state == LC_OPEN)
        return;
    if (dl < lc->open_by)
        lc->open_by = dl;
    if (lc->hsq.deadline_ns > dl)
        lc->hsq.deadline_ns = dl;
    redsem__pipe_retime(&lc->pipe);
}

/* ---------------------------------------------------------------- a Cluster client's routing */

static int cluster_new(redsem__loop *l, char *err, size_t errlen)
{
    l->topo = redsem__calloc(1, sizeof *l->topo);
    l->nconn = redsem__calloc(REDSEM__CLUSTER_NODES_MAX, sizeof *l->nconn);
    if (l->topo == NULL || l->nconn == NULL) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    int rc = redsem__topo_init(l->topo, &l->ctx, &l->c->ep, &l->c->cfg, err, errlen);
    l->topo->seed_first = &l->c->seed_first; /* asked first, by every engine of the client */
    return rc;
}

/* Close lc and end what it holds: its requests end with ECONN (their ops resend). */
static void conn_close(redsem__loop *l, loop_conn *lc, const char *why)
{
    conn_fail(l, lc, REDSEM_ECONN, why);
    redsem__pipe_reset(&lc->pipe);
    redsem__node_disconnect(&lc->node);
}

static void cluster_free(redsem__loop *l)
{
    for (size_t i = 0; l->nconn != NULL && i < REDSEM__CLUSTER_NODES_MAX; i++)
        if (l->nconn[i] != NULL) {
            redsem__dial_cancel(&l->nconn[i]->dial);
            l->nconn[i]->state = LC_CLOSED;
            redsem__pipe_reset(&l->nconn[i]->pipe); /* requests end (not called back) */
            redsem__node_close(&l->nconn[i]->node);
            redsem__free(l->nconn[i]);
        }
    redsem__free(l->nconn);
    if (l->topo != NULL && l->topo->kind == REDSEM__TOPO_CLUSTER)
        redsem__topo_close(l->topo);
    redsem__free(l->topo);
}

/* The connection to the node at index i of the map's table (a cluster node: its redirections
 * are judged, its scripts and clock its own), made (not opened) on first use. A node the
 * table dropped since (its entry now another address) has its connection closed and set up
 * anew. NULL (the error set) if it cannot be set up, or LOOP_NODES_MAX are in use. */
static loop_conn *node_conn(redsem__loop *l, size_t i)
{
    const redsem__node *tn = l->topo->nodes[i];
    loop_conn *lc = l->nconn[i];
    if (tn == NULL) {
        l->route_rc = redsem__set_err(l->c, REDSEM_ESERVER, "the cluster node was dropped");
        return NULL;
    }
    if (lc != NULL && lc->node.ep.port == tn->ep.port && strcmp(lc->node.ep.host, tn->ep.host) == 0)
        return lc;
    if (lc != NULL) {
        conn_close(l, lc, "the cluster node left the slot map");
        redsem__node_close(&lc->node);
        l->nconns--;
    } else if (l->nconns >= LOOP_NODES_MAX) {
        l->route_rc = redsem__set_err(l->c, REDSEM_ESERVER, "more than %d cluster nodes in use on one "
                              "event loop", LOOP_NODES_MAX);
        return NULL;
    } else if ((lc = redsem__calloc(1, sizeof *lc)) == NULL) {
        l->route_rc = redsem__set_err(l->c, REDSEM_ENOMEM, "out of memory");
        return NULL;
    }
    char err[REDSEM__ERRMSG_LEN] = "";
    int rc = redsem__node_init(&lc->node, &l->ctx, &tn->ep, &l->c->cfg, err, sizeof err);
    if (rc != REDSEM_OK) {
        redsem__node_close(&lc->node);
        redsem__free(lc);
        l->nconn[i] = NULL;
        l->route_rc = redsem__set_err(l->c, rc, "%s", err);
        return NULL;
    }
    lc->node.cluster = true;
    lc->idx = i;
    lc->loop = l;
    l->nconn[i] = lc;
    l->nconns++;
    return lc;
}

/* A cluster's table upkeep before a call is routed: the nodes out of the map, idle a while,
 * dropped (cluster.c), and what the engine held of them closed (their requests, none in
 * general, resent as after a lost connection). */
static void cluster_sweep(redsem__loop *l)
{
    if (!redsem__cluster_sweep(l->topo))
        return;
    for (size_t i = 0; i < REDSEM__CLUSTER_NODES_MAX; i++)
        if (l->nconn[i] != NULL && (i >= l->topo->nnodes || l->topo->nodes[i] == NULL)) {
            conn_close(l, l->nconn[i], "the cluster node left the slot map");
            redsem__node_close(&l->nconn[i]->node);
            redsem__free(l->nconn[i]);
            l->nconn[i] = NULL;
            l->nconns--;
        }
}

/* The connection call goes to: one server's, or in a cluster the node serving the slot of
 * its first key as the map says; NULL: none known yet (a cluster's map does not name one),
 * or node_conn's failure. */
static loop_conn *call_conn(redsem__loop *l, const redsem__call *call)
{
    if (l->topo == NULL)
        return &l->req;
    cluster_sweep(l);
    int k = call->script == REDSEM__SCRIPT_NONE ? 1 : 0; /* a command's key: after its name */
    bool keyed = call->nkeys > 0 && call->ka.n > k;
    int slot = redsem__key_slot(keyed ? call->ka.v[k] : "", keyed ? call->ka.len[k] : 0);
    uint16_t at = l->topo->slots[slot];
    if (at == 0) {
        l->route_rc = redsem__set_err(l->c, REDSEM_ESERVER, "no cluster node serves hash slot %d", slot);
        return NULL;
    }
    return node_conn(l, at - 1);
}

static int send_cmd(redsem__loop *l, loop_conn *lc, redsem__preq *q, redsem__args *a);

static void map_done(redsem__preq *q, void *arg)
{
    (void)q;
    ((redsem__loop *)arg)->map_replied = true;
}

/* How bad a failure to read the map is, to report the worst (cluster.c's severity): a node
 * not in cluster mode or refusing the credentials says more than one that cannot be
 * reached. */
static int map_severity(int rc)
{
    return rc == REDSEM_EINVAL || rc == REDSEM_EPERM ? 3
           : rc == REDSEM_ECONN || rc == REDSEM_ETIMEDOUT ? 1
                                                          : 2;
}

/* The order a round asks the nodes in (cluster.c's refresh): the primaries of the map, from
 * the one that answered last, then the other nodes (the seeds), then those whose last call
 * or question failed, avoid last of all. */
static void map_order(redsem__loop *l, const loop_conn *avoid)
{
    redsem__topo *t = l->topo;
    bool in_map[REDSEM__CLUSTER_NODES_MAX] = {false};
    for (int s = 0; s < REDSEM__SLOTS; s++)
        if (t->slots[s] != 0)
            in_map[t->slots[s] - 1] = true;
    l->round.m = l->round.j = 0;
    for (int pass = 0; pass < 4; pass++)
        for (size_t k = 0; k < t->nnodes; k++) {
            size_t i = (l->map_next + k) % t->nnodes;
            if (t->nodes[i] == NULL)
                continue;
            bool av = avoid != NULL && l->nconn[i] == avoid;
            int p = av ? 3 : l->failed_ns[i] != 0 ? 2 : in_map[i] ? 0 : 1;
            if (p == pass)
                l->round.order[l->round.m++] = i;
        }
}

static void map_round_end(redsem__loop *l, int rc);

/* Ask the round's next node for the map, each given a fair share of the time left (at least
 * 100 ms; its connect too), so that one that hangs does not use up the time the others
 * need; a node that cannot be asked is passed over. None left, or the deadline passed: the
 * round failed. */
static void map_next_node(redsem__loop *l)
{
    redsem__topo *t = l->topo;
    while (l->round.j < l->round.m) {
        int64_t now = redsem__now_ns();
        if (now >= l->round.deadline)
            break;
        size_t idx = l->round.order[l->round.j++];
        int64_t share = (l->round.deadline - now) / (int64_t)(l->round.m - l->round.j + 1);
        if (share < 100 * REDSEM__NS_PER_MS)
            share = 100 * REDSEM__NS_PER_MS; /* a round trip's worth, even over a WAN */
        int64_t dl = l->round.deadline - now > share ? now + share : l->round.deadline;
        loop_conn *lc = t->nodes[idx] != NULL ? node_conn(l, idx) : NULL;
        redsem__args a;
        redsem__args_init(&a);
        redsem__args_str(&a, "CLUSTER");
        redsem__args_str(&a, "SLOTS");
        l->mapq = (redsem__preq){.nreplies = 1, .done = map_done, .arg = l};
        if (lc == NULL || send_cmd(l, lc, &l->mapq, &a) != REDSEM_OK)
            continue;
        conn_cap(lc, dl);
        if (l->mapq.deadline_ns > dl)
            l->mapq.deadline_ns = dl;
        redsem__pipe_retime(&lc->pipe);
        l->map_pending = true;
        l->map_idx = idx;
        return;
    }
    map_round_end(l, l->round.worst);
}

/* Read the slot map again on the loop (cluster.c's CLUSTER SLOTS as requests): a round over
 * the known nodes and the seeds (map_order), one question at a time, within the connect
 * timeout, at most one round every REDSEM__CLUSTER_REFRESH_MS (a failed one lets the next
 * go at once). */
static void map_ask(redsem__loop *l, const loop_conn *avoid)
{
    redsem__topo *t = l->topo;
    int64_t now = redsem__now_ns();
    if (l->round.on || now - t->refreshed_ns < REDSEM__CLUSTER_REFRESH_MS * REDSEM__NS_PER_MS)
        return;
    /* the seeds join the known nodes; an engine with no map yet asks first the seed that
     * gave one to another engine of the client (one that hangs costs the first only) */
    size_t first = atomic_load_explicit(&l->c->seed_first, memory_order_relaxed);
    for (size_t i = 0; i < t->given.nhosts; i++) {
        size_t idx;
        if (redsem__cluster_node_at(t, t->given.hosts[i].host, t->given.hosts[i].port,
                                    &idx) == REDSEM_OK &&
            !l->map_known && i == first % t->given.nhosts)
            l->map_next = idx;
    }
    t->refreshed_ns = now;
    l->round.on = true;
    l->round.deadline = now + l->c->connect_timeout_ms * REDSEM__NS_PER_MS;
    l->round.worst = REDSEM_ECONN;
    l->round.why[0] = '\0';
    map_order(l, avoid);
    map_next_node(l);
}

/* A round ended (rc: REDSEM_OK, or the worst failure, its text in round.why): the ops
 * waiting for the map go on (an open ends), and a failed round lets the next go at once. */
static void map_round_end(redsem__loop *l, int rc)
{
    l->round.on = false;
    if (rc != REDSEM_OK) {
        l->topo->refreshed_ns = 0;
        l->map_rc = rc;
        snprintf(l->map_err, sizeof l->map_err, "no cluster node gave the slot map: %s",
                 l->round.why[0] ? l->round.why : "none could be asked before the deadline");
    } else {
        l->map_rc = REDSEM_OK;
    }
    for (loop_op *o = l->ops.head; o != NULL; o = o->next)
        if ((o->mapwait && o->resend) || o->opening_map)
            wake_at(o, 1);
}

/* The judgement of a map question's outcome q on node n (the map read by topo/cluster.c's
 * redsem__cluster_read_map): REDSEM_OK, or the failure with its text in err. */
static int map_judge(redsem__loop *l, const redsem__preq *q, redsem__node *n, char *err,
                     size_t errlen)
{
    redisReply *r = q->rc == REDSEM_OK ? q->replies[0] : NULL;
    int rc;
    if (r == NULL) {
        rc = q->rc;
        snprintf(err, errlen, "%s:%d: %.200s", n->ep.host, n->ep.port,
                 l->nconn[l->map_idx] != NULL ? l->nconn[l->map_idx]->pipe.err : "");
    } else if (r->type == REDIS_REPLY_ERROR && strstr(r->str, "cluster support disabled")) {
        snprintf(err, errlen, "%s:%d is not a cluster node (cluster support disabled): use "
                 "a redis:// URL for a standalone server", n->ep.host, n->ep.port);
        rc = REDSEM_EINVAL;
    } else if (r->type == REDIS_REPLY_ERROR) {
        rc = redsem__node_error_reply(n, r, "CLUSTER SLOTS");
        rc = rc == REDSEM__EREDIRECT ? REDSEM_ESERVER : rc;
        snprintf(err, errlen, "%s:%d: %.200s", n->ep.host, n->ep.port, l->ctx.errmsg);
    } else {
        rc = redsem__cluster_read_map(l->topo, n, r, err, errlen);
    }
    if (r != NULL)
        freeReplyObject(r);
    return rc;
}

/* The map's reply: read into the map (cluster.c), and the ops waiting for it go on; a
 * failure asks the round's next node. */
static void map_reply(redsem__loop *l)
{
    redsem__topo *t = l->topo;
    l->map_pending = l->map_replied = false;
    redsem__node *asked = t->nodes[l->map_idx];
    char err[256] = "the node was dropped";
    int rc = asked != NULL ? map_judge(l, &l->mapq, asked, err, sizeof err) : REDSEM_ECONN;
    l->failed_ns[l->map_idx] =
        rc == REDSEM_ECONN || rc == REDSEM_ETIMEDOUT ? redsem__now_ns() : 0;
    if (rc == REDSEM_OK) {
        l->map_next = l->map_idx;
        l->map_known = true;
        for (size_t i = 0; i < t->given.nhosts; i++) /* a seed: asked first by the next */
            if (asked->ep.host != NULL && t->given.hosts[i].port == asked->ep.port &&
                strcmp(t->given.hosts[i].host, asked->ep.host) == 0)
                atomic_store_explicit(&l->c->seed_first, i, memory_order_relaxed);
        map_round_end(l, REDSEM_OK);
        return;
    }
    if (map_severity(rc) > map_severity(l->round.worst))
        l->round.worst = rc;
    size_t n = strlen(l->round.why);
    snprintf(l->round.why + n, sizeof l->round.why - n, "%s%s", n ? "; " : "", err);
    if (rc == REDSEM_ENOMEM)
        map_round_end(l, rc);
    else
        map_next_node(l);
}

/* Whether call is followed by WAIT (a write that must reach the client's replicas). */
static bool call_syncs(const redsem__loop *l, const redsem__call *call)
{
    return (call->flags & REDSEM__REQ_SYNC) && l->c->sync_replicas > 0;
}

/* Queue the command a on lc's pipe as q (one reply), with a command timeout. */
static int send_cmd(redsem__loop *l, loop_conn *lc, redsem__preq *q, redsem__args *a)
{
    char *cmd = NULL;
    int len = redsem__args_format(a, &cmd);
    int rc = len < 0 ? REDSEM_ENOMEM : conn_open(l, lc);
    q->deadline_ns = redsem__now_ns() + l->c->command_timeout_ms * REDSEM__NS_PER_MS;
    if (rc == REDSEM_OK)
        rc = redsem__pipe_send(&lc->pipe, q, cmd, (size_t)len);
    if (rc == REDSEM_OK)
        REDSEM__COUNT(&l->ctx, requests, 1);
    redisFreeCommand(cmd);
    return rc;
}

#define LOOP_ASKING "*1\r\n$6\r\nASKING\r\n"

/* Queue call on lc's pipe as q: [SCRIPT LOAD body] [ASKING] EVALSHA sha nkeys keys args,
 * in one write: the body when body is set (the
 * server does not hold the script yet), by SCRIPT LOAD (*load set), or by EVAL on a server
 * that refuses SCRIPT LOAD (the script cache's eval_body); a command (REDSEM__SCRIPT_NONE)
 * goes as its ka says. q->nreplies set; counted in the loop's stats (requests; the SCRIPT
 * LOAD or EVAL body also in script_loads). */
static int send_call(redsem__loop *l, loop_conn *lc, redsem__preq *q, const redsem__call *call,
                     bool body, bool asking, bool *load_out)
{
    int rc = conn_open(l, lc);
    if (rc != REDSEM_OK)
        return rc;
    bool script = call->script != REDSEM__SCRIPT_NONE;
    bool load = script && body && !atomic_load(&lc->node.scripts->eval_body);
    redsem__args a, la;
    if (script) {
        redsem__script_args(&redsem__script_defs[call->script], body, load, call->nkeys,
                            &call->ka, &a, &la);
    } else {
        a = call->ka; /* its numbers' pointers lead into call, which lives on */
        redsem__args_init(&la);
    }
    if (load_out != NULL)
        *load_out = load;
    char *pre = NULL, *cmd = NULL;
    int plen = load ? redsem__args_format(&la, &pre) : 0;
    int clen = redsem__args_format(&a, &cmd);
    size_t alen = asking ? strlen(LOOP_ASKING) : 0;
    size_t len = alen + (size_t)plen + (size_t)clen;
    char *buf = plen >= 0 && clen >= 0 ? redsem__malloc(len) : NULL;
    if (buf != NULL) {
        /* ASKING right before the call: it holds for one command, a SCRIPT LOAD would
         * take it */
        if (plen > 0)
            memcpy(buf, pre, (size_t)plen);
        memcpy(buf + plen, LOOP_ASKING, alen);
        memcpy(buf + alen + plen, cmd, (size_t)clen);
        q->nreplies = (asking ? 1 : 0) + (load ? 2 : 1);
        int64_t cap = call->cap_ns;
        q->deadline_ns = redsem__now_ns() + l->c->command_timeout_ms * REDSEM__NS_PER_MS;
        if (cap != 0 && cap < q->deadline_ns)
            q->deadline_ns = cap;
        rc = redsem__pipe_send(&lc->pipe, q, buf, len);
    } else {
        rc = REDSEM_ENOMEM;
    }
    if (rc == REDSEM_OK) {
        REDSEM__COUNT(&l->ctx, requests, 1);
        REDSEM__COUNT(&l->ctx, script_loads, script && body ? 1 : 0);
        if (lc->pipe.inflight > 1)
            REDSEM__COUNT(&l->ctx, pipelined, 1);
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
        loop_conn *lc = call_conn(l, &wc->call);
        bool body = lc != NULL && !atomic_load(&lc->node.scripts->sent[REDSEM__SCRIPT_WAKE_PUSH]);
        if (lc == NULL || send_call(l, lc, &p->req, &wc->call, body, false, NULL) != REDSEM_OK)
            redsem__free(p);
    }
    redsem__free(wc);
    freeReplyObject(wrap);
}

static bool watched_key(const redsem__loop *l, const char *key, uint32_t h);

/* FNV-1a of the len bytes of key: the waits' keys told apart by it first. */
static uint32_t key_hash(const char *key, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)key[i]) * 16777619u;
    return h;
}

/* o waits (its wait under way: its key in the BLPOP), or not; the client counts the waits
 * of fair waiters (redsem__wake_any: a release then names its id list). */
static void wait_set(loop_op *o, bool waiting)
{
    if (waiting != o->waiting && o->s.elem[0] != '\0')
        atomic_fetch_add_explicit(&o->loop->c->waits, waiting ? 1 : -1, memory_order_relaxed);
    if (waiting && !o->waiting) {
        redsem__loop *l = o->loop;
        o->elen = strlen(o->s.elem);
        o->whash = o->s.wkey != NULL ? key_hash(o->s.wkey, strlen(o->s.wkey)) : 0;
        if (l->blpop_pending && o->s.wkey != NULL && o->s.keylen != 0 &&
            l->nbkeys < LOOP_WAIT_KEYS_MAX - 1 && !watched_key(l, o->s.wkey, o->whash))
            l->unwatched = true; /* wait_sync pokes the BLPOP, and the next one watches it */
    }
    o->waiting = waiting;
}

static void op_done(redsem__preq *q, void *arg)
{
    loop_op *o = arg;
    o->replied = true;
    o->loop->any_replied = true;
    if (q->rc != REDSEM_OK) /* the pipe's text now: a new connection clears it */
        snprintf(o->err, sizeof o->err, "%s", o->lc->pipe.err);
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
    o->rw.until = 0;
    o->hops = 0;
    o->map_until = 0;
    op_send(o);
}

/* A copy of a call (an op's, the BLPOP, a drain) was lost with its connection (or none could
 * be made), or came back LOADING (a restarted server loading its data: nothing ran): whether
 * it goes again: within the retry window w (opened at the
 * first failure: retry_ms, cut by cap_ns unless 0), after a jittered pause of 5 ms doubling
 * to 100 ms (*at: its end, a timer of the loop, never a sleep), each counted in
 * stats.retries. */
static bool retry_pause(redsem__loop *l, loop_retry *w, int64_t cap_ns, int64_t *at)
{
    int64_t now = redsem__now_ns();
    if (l->c->retry_ms == 0)
        return false;
    if (w->until == 0) {
        w->until = now + l->c->retry_ms * REDSEM__NS_PER_MS;
        if (cap_ns != 0 && cap_ns < w->until)
            w->until = cap_ns;
        w->backoff_ns = 5 * REDSEM__NS_PER_MS;
    }
    if (now >= w->until)
        return false;
    int64_t nap = redsem__rand_between(w->backoff_ns / 2, w->backoff_ns);
    if (nap > w->until - now)
        nap = w->until - now;
    w->backoff_ns = w->backoff_ns * 2 > 100 * REDSEM__NS_PER_MS ? 100 * REDSEM__NS_PER_MS
                                                               : w->backoff_ns * 2;
    REDSEM__COUNT(&l->ctx, retries, 1);
    *at = now + nap;
    return true;
}

/* o's request was lost or came back LOADING: whether its call (with REDSEM__REQ_RETRY) goes
 * again after a pause within its window (pause_resend). */
static bool pause_resend(loop_op *o);

static bool retry_later(loop_op *o)
{
    return (o->call->flags & REDSEM__REQ_RETRY) && pause_resend(o);
}

/* retry_later's pause within o's window (retry_pause), for any call (a cluster's refusal:
 * nothing ran): o's timer (o->resend), never a sleep. */
static bool pause_resend(loop_op *o)
{
    o->mapwait = false;
    if (!retry_pause(o->loop, &o->rw, o->call->cap_ns, &o->wake_ns))
        return false;
    wake_at(o, o->wake_ns);
    o->resend = true;
    wait_set(o, false);
    return true;
}

/* o's request, written, ended with the earliest deadline of the requests in flight on its
 * connection (the server stalled: the pipe gives them all up then), before its own: it gives
 * up at its own deadline (o's timer), not earlier. Its not-after time (sent with it) was set
 * from its own deadline, and a script that runs after the caller gave up must find it
 * passed. */
static void give_up_late(loop_op *o, int64_t deadline_ns)
{
    o->late = true;
    wait_set(o, false);
    wake_at(o, deadline_ns);
}

/* Group commit (sync_replicas): a call that must reach the replicas is written alone and
 * joins the loop's synced list (sync_join); before a step's round writes, each connection
 * with members and no WAIT in flight gets one (sync_flush), covering every call written on
 * it before (WAIT counts the replicas that acknowledged the connection's last write). One
 * WAIT in flight per connection: it holds the connection on the server until its replicas
 * answer or its timeout, and the calls written meanwhile wait for the next one. A member's
 * reply parks until its WAIT's outcome (sync_end), as the blocking path's reply waited for
 * the WAIT written after it. */
static void attempt_outcome(loop_op *o, int rc, redisReply *r, redsem__req_info *info);
static int loop_conns(const redsem__loop *l, loop_conn *v[REDSEM__LOOP_CONNS_MAX]);

static void sync_leave(loop_op *o)
{
    if (o->wg != SYNC_NONE)
        REDSEM__LIST_UNLINK(&o->loop->synced, &o->sm);
    o->wg = SYNC_NONE;
}

static void sync_join(loop_op *o)
{
    o->sm.op = o;
    o->wg = SYNC_NEXT;
    o->werr = false;
    REDSEM__LIST_APPEND(&o->loop->synced, &o->sm);
    o->loop->sync_due = true;
}

/* The WAIT in flight on lc ended (rc; acked: the replicas it counted; bad: its reply was
 * not a count, the text in l->ctx.errmsg): each of its members takes the outcome, and a
 * parked one is due (its reply goes on: sync_resume). */
static void sync_end(loop_conn *lc, int rc, const char *why, int acked, bool bad)
{
    redsem__loop *l = lc->loop;
    lc->sync_pending = false;
    l->sync_due = true;
    for (struct loop_sync *m = l->synced.head, *nx; m != NULL; m = nx) {
        nx = m->next;
        loop_op *o = m->op;
        if (o->wg != SYNC_CUR || o->lc != lc)
            continue;
        sync_leave(o);
        o->wdone = true;
        o->wrc = rc;
        o->wacked = acked;
        o->werr = bad;
        if (rc != REDSEM_OK || bad)
            snprintf(o->err, sizeof o->err, "%.250s", rc != REDSEM_OK ? why : l->ctx.errmsg);
        if (o->parked)
            o->replied = l->any_replied = true;
    }
}

static void sync_done(redsem__preq *q, void *arg)
{
    loop_conn *lc = arg;
    redsem__loop *l = lc->loop;
    int acked = -1;
    l->ctx.errmsg[0] = '\0';
    if (q->rc == REDSEM_OK) {
        acked = redsem__node_wait_acked(&lc->node, q->replies[0]);
        freeReplyObject(q->replies[0]);
    }
    sync_end(lc, q->rc, lc->pipe.err, acked, q->rc == REDSEM_OK && l->ctx.errmsg[0] != '\0');
}

/* Send a WAIT on lc for its members (SYNC_NEXT to SYNC_CUR, by the caller): within the
 * command timeout and their caps (sync_cap). */
static void sync_send(redsem__loop *l, loop_conn *lc)
{
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, "WAIT");
    redsem__args_i64(&a, l->c->sync_replicas);
    redsem__args_i64(&a, l->c->sync_timeout_ms);
    lc->syncq = (redsem__preq){.nreplies = 1, .done = sync_done, .arg = lc};
    lc->sync_pending = true;
    lc->sync_cap = 0;
    lc->sync_round = l->flushes;
    int rc = send_cmd(l, lc, &lc->syncq, &a);
    if (rc != REDSEM_OK) { /* its members' outcome, when the flush ends */
        lc->sync_pending = false;
        lc->syncq.rc = rc;
    }
}

/* The WAITs due: one on each connection whose members wait for one and that has none in
 * flight (one that cannot be sent ends at once: its members are due). */
static void sync_flush(redsem__loop *l)
{
    if (!l->sync_due)
        return;
    l->sync_due = false;
    l->flushes++;
    bool any = false;
    for (struct loop_sync *m = l->synced.head; m != NULL; m = m->next) {
        loop_op *o = m->op;
        /* its call in flight or its reply parked (else it was lost: not covered) */
        if (o->wg != SYNC_NEXT || !((o->pending && !o->replied) || o->parked))
            continue;
        loop_conn *lc = o->lc;
        if (lc->sync_pending && lc->sync_round != l->flushes)
            continue; /* the next WAIT covers it */
        if (!lc->sync_pending && lc->sync_round != l->flushes) {
            sync_send(l, lc);
            any = true;
        }
        o->wg = SYNC_CUR;
        int64_t cap = o->call->cap_ns;
        if (lc->sync_pending && cap != 0 && (lc->sync_cap == 0 || cap < lc->sync_cap)) {
            lc->sync_cap = cap;
            if (cap < lc->syncq.deadline_ns) {
                lc->syncq.deadline_ns = cap;
                redsem__pipe_retime(&lc->pipe);
            }
        }
    }
    loop_conn *lcs[REDSEM__LOOP_CONNS_MAX]; /* a WAIT that could not be sent */
    for (int i = 0, nc = any ? loop_conns(l, lcs) : 0; i < nc; i++)
        if (lcs[i]->sync_round == l->flushes && !lcs[i]->sync_pending)
            sync_end(lcs[i], lcs[i]->syncq.rc, lcs[i]->syncq.rc == REDSEM_ENOMEM ? "out of memory"
                     : lcs[i]->pipe.err, -1, false);
}

/* A parked reply's WAIT ended: the reply goes on with the replicas it counted; a WAIT lost
 * with its connection or past its deadline leaves the call "maybe applied" on the replicas,
 * as a lost request (op_lost). */
static void op_lost(loop_op *o, int rc, const redsem__preq *q);

static void sync_resume(loop_op *o)
{
    redisReply *r = o->pr;
    redsem__req_info info = o->pinfo;
    o->parked = false;
    o->pr = NULL;
    if (o->wrc != REDSEM_OK) {
        freeReplyObject(r);
        o->maybe = true;
        op_lost(o, o->wrc, &o->req);
        return;
    }
    info.replicas_acked = o->wacked;
    if (o->werr)
        (void)redsem__set_err(o->loop->c, REDSEM_EREPLICA, "%s", o->err);
    attempt_outcome(o, REDSEM_OK, r, &info);
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
    o->s.kind->release_call(o->s.q.handle, &o->gb, o->call);
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
    if (r != NULL && o->call->wake_prefix != NULL) {
        redisReply *wrap = redsem__wake_unwrap(&r);
        if (wrap != NULL)
            push_wakeups(o->loop, o->call->wake_prefix, wrap);
    }
    if (o->giveback) {
        giveback_end(o, rc, r, info);
        return;
    }
    if (o->reply != NULL) { /* a single call: its outcome, and the op ends */
        rc = o->reply(o->arg, rc, &r, info); /* it may take r */
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

/* o's call was redirected or refused by a cluster node (MOVED, ASK, TRYAGAIN, CLUSTERDOWN):
 * judged as a blocking routed call is (redsem__cluster_redirected): sent at once where it
 * names (after an ASK with ASKING, once), or again after a pause within its retry window
 * (nothing ran); the map read again on the loop when it may have changed. */
static void op_redirected(loop_op *o, redsem__req_info *info)
{
    redsem__loop *l = o->loop;
    bool again = false;
    int rc = redsem__cluster_redirected(l->topo, &o->lc->node.redirect, &o->hops, &o->to,
                                        &o->asking, &again);
    if (again)
        map_ask(l, NULL);
    if (rc == REDSEM_OK) {
        o->redirected = true;
        op_send(o);
        return;
    }
    rc = redsem__set_err(l->c, rc, "%s", l->ctx.errmsg);
    if (rc == REDSEM_ESERVER && pause_resend(o))
        return;
    attempt_outcome(o, rc, NULL, info);
}

/* o's call has no node yet (a cluster whose map does not name its slot's: at the first
 * call, or the slot unserved): the map is asked (map_ask), and o waits for its reply, within
 * the connect timeout (and its call's cap), then within its retry window; false: not (any
 * longer). */
static bool map_wait(loop_op *o)
{
    redsem__loop *l = o->loop;
    int64_t now = redsem__now_ns();
    if (l->topo == NULL)
        return false;
    map_ask(l, NULL);
    if (o->map_until == 0) {
        o->map_until = now + l->c->connect_timeout_ms * REDSEM__NS_PER_MS;
        if (o->call->cap_ns != 0 && o->call->cap_ns < o->map_until)
            o->map_until = o->call->cap_ns;
    }
    if (now >= o->map_until)
        return pause_resend(o);
    o->resend = o->mapwait = true;
    wait_set(o, false);
    wake_at(o, now + 20 * REDSEM__NS_PER_MS < o->map_until ? now + 20 * REDSEM__NS_PER_MS
                                                            : o->map_until);
    return true;
}

/* Sentinel: whether r says the primary was demoted under us (READONLY: a failover; the call
 * was refused before anything was written). Then the connection is given up (the next
 * request resolves the primary again) and o->err says why. */
static bool demoted_reply(redsem__loop *l, loop_op *o, const redisReply *r)
{
    (void)l;
    loop_conn *lc = o->lc;
    if (lc->node.resolve == NULL || r->type != REDIS_REPLY_ERROR || r->str == NULL ||
        strncmp(r->str, "READONLY", 8) != 0)
        return false;
    snprintf(o->err, sizeof o->err, "%s:%d became a replica (READONLY)", lc->node.ep.host,
             lc->node.ep.port);
    if (lc->pipe.rc == REDSEM_OK)
        redsem__pipe_fail(&lc->pipe, REDSEM_ECONN, o->err);
    return true;
}

/* A reply that ran nothing and asks for the call again: LOADING (a restarted server loading
 * its data: sent again within o's retry window; once it ends, the reply is judged as any
 * other) or, under Sentinel, READONLY (a demoted primary: the connection is given up, and
 * the call goes again as after a lost connection before writing, or that is its outcome).
 * true: handled (r freed). */
static bool refused_again(loop_op *o, redisReply *r, redsem__req_info *info)
{
    if (redsem__loading_reply(r)) { /* once its window ends, the reply is the outcome */
        if (!retry_later(o))
            return false;
        freeReplyObject(r);
        return true;
    }
    if (!demoted_reply(o->loop, o, r))
        return false;
    freeReplyObject(r);
    int rc = redsem__set_err(o->loop->c, REDSEM_ECONN, "%s", o->err);
    if (retry_later(o))
        return true;
    info->maybe_applied = o->maybe;
    attempt_outcome(o, rc, NULL, info);
    return true;
}

/* A command's reply (REDSEM__SCRIPT_NONE): LOADING and a demotion as a script call's, a
 * redirection followed; any other reply, an error reply included, is the call's outcome for
 * its reply function to judge. */
static void cmd_reply(loop_op *o, redisReply *r, redsem__req_info *info)
{
    info->maybe_applied = o->maybe;
    if (refused_again(o, r, info))
        return;
    if (redsem__redirect_reply(r)) {
        redsem__loop *l = o->loop;
        int rc = redsem__node_error_reply(&o->lc->node, r, "the command");
        (void)redsem__set_err(l->c, rc, "%s", l->ctx.errmsg);
        freeReplyObject(r);
        if (rc == REDSEM__EREDIRECT)
            op_redirected(o, info);
        else
            attempt_outcome(o, rc, NULL, info);
        return;
    }
    attempt_outcome(o, REDSEM_OK, r, info);
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
    o->replied = false;
    if (o->parked) { /* its WAIT ended */
        sync_resume(o);
        return;
    }
    o->pending = false;
    if (q->rc != REDSEM_OK) {
        o->maybe = o->maybe || q->written;
        op_lost(o, q->rc, q);
        return;
    }
    if (l->topo != NULL)
        l->silent_ns[o->lc->idx] = l->failed_ns[o->lc->idx] = 0; /* it answers */
    /* the replies: [SCRIPT LOAD's] [ASKING's +OK] the call's [WAIT's] */
    int ai = o->load ? 1 : 0, ri = ai + (o->asking ? 1 : 0);
    if (o->asking)
        freeReplyObject(q->replies[ai]);
    if (o->call->script == REDSEM__SCRIPT_NONE) {
        cmd_reply(o, q->replies[ri], &info);
        return;
    }
    _Atomic bool *sent = &o->lc->node.scripts->sent[o->call->script];
    redisReply *r = q->replies[ri];
    bool refused = false; /* SCRIPT LOAD refused (not a compile error): EVAL bodies */
    if (o->load) {
        const redisReply *lr = q->replies[0];
        if (lr->type == REDIS_REPLY_STRING)
            atomic_store(sent, true);
        else
            refused = lr->type == REDIS_REPLY_ERROR &&
                      strncmp(lr->str, "ERR Error compiling", 19) != 0;
        freeReplyObject(q->replies[0]);
    }
    if (refused_again(o, r, &info))
        return;
    info.maybe_applied = o->maybe;
    bool noscript = r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0;
    if (noscript && o->noscript++ < LOOP_NOSCRIPT_MAX) {
        freeReplyObject(r);
        atomic_store(sent, false);
        if (refused)
            atomic_store(&o->lc->node.scripts->eval_body, true); /* not a lost script */
        else
            REDSEM__COUNT(&l->ctx, noscript, 1);
        op_send(o);
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        int rc = redsem__node_error_reply(&o->lc->node, r, redsem__script_defs[o->call->script].name);
        (void)redsem__set_err(c, rc, "%s", l->ctx.errmsg);
        freeReplyObject(r);
        if (rc == REDSEM__EREDIRECT) {
            op_redirected(o, &info);
            return;
        }
        attempt_outcome(o, rc, NULL, &info);
        return;
    }
    atomic_store(sent, true);
    if (o->wg != SYNC_NONE || o->wdone) { /* its reply waits for its WAIT (sync_end) */
        o->pr = r;
        o->pinfo = info;
        o->parked = true;
        if (o->wdone)
            sync_resume(o);
        else if (o->wg == SYNC_NEXT) /* not sent yet: a flush skips an unread reply */
            l->sync_due = true;
        return;
    }
    attempt_outcome(o, REDSEM_OK, r, &info);
}

/* o's request (q) ended with rc (ECONN, ETIMEDOUT, ...; o->err says why) or its WAIT did: it
 * goes again within its retry window ("maybe applied" kept), or gives up at its own deadline
 * (give_up_late), or that is its outcome. */
static void op_lost(loop_op *o, int rc, const redsem__preq *q)
{
    redsem__loop *l = o->loop;
    rc = redsem__set_err(l->c, rc, "%s", o->err);
    if ((rc == REDSEM_ECONN || rc == REDSEM_ETIMEDOUT) && l->topo != NULL) {
        map_ask(l, o->lc); /* a failover may have moved its slots: the others asked first */
        l->failed_ns[o->lc->idx] = redsem__now_ns();
        if (rc == REDSEM_ETIMEDOUT)
            l->silent_ns[o->lc->idx] = l->failed_ns[o->lc->idx];
    }
    /* one server: timeouts are not retried (it may be stalled); a Cluster node that does
     * not answer may have been failed over: idempotent calls go again, maybe applied */
    if ((rc == REDSEM_ECONN || (rc == REDSEM_ETIMEDOUT && l->topo != NULL)) && retry_later(o))
        return;
    if (rc == REDSEM_ETIMEDOUT && o->maybe && redsem__now_ns() < q->deadline_ns) {
        give_up_late(o, q->deadline_ns);
        return;
    }
    redsem__req_info info = {.sent_ns = q->sent_ns, .recv_ns = q->recv_ns,
                             .maybe_applied = o->maybe, .replicas_acked = -1};
    attempt_outcome(o, rc, NULL, &info);
}

/* A Cluster node that timed out less than a command timeout ago, which the map still names
 * (not failed over yet): a call for it re-reads the map and pauses within its retry window
 * instead of waiting out another timeout there, then sends where the map says. */
static bool silent_wait(loop_op *o)
{
    redsem__loop *l = o->loop;
    if (l->topo == NULL || l->silent_ns[o->lc->idx] == 0 ||
        redsem__now_ns() - l->silent_ns[o->lc->idx] >= l->c->command_timeout_ms * REDSEM__NS_PER_MS ||
        !(o->call->flags & REDSEM__REQ_RETRY))
        return false;
    map_ask(l, NULL);
    return pause_resend(o);
}

static void op_send(loop_op *o)
{
    redsem__loop *l = o->loop;
    const redsem__acquirer *q = &o->s.q;
    if (o->reply == NULL && !o->giveback) { /* an acquire: its attempt's call of this stage */
        q->attempt_call(q->handle, o->s.id, o->s.att_mode, q->weight, o->stage, o->call);
        o->call->cap_ns = o->s.cap_ns;
    }
    sync_leave(o); /* a WAIT covers the copy sent now, not an earlier one */
    o->wdone = false;
    bool asking = o->redirected && o->asking;
    o->lc = o->redirected ? node_conn(l, o->to) : call_conn(l, o->call);
    o->redirected = o->asking = false;
    if (o->lc == NULL) {
        int rc = l->route_rc; /* its text set */
        if (map_wait(o))
            return;
        redsem__req_info info = {.maybe_applied = o->maybe, .replicas_acked = -1};
        attempt_outcome(o, rc, NULL, &info);
        return;
    }
    if (l->topo != NULL)
        redsem__cluster_touch(l->topo, o->lc->idx); /* in use: not swept */
    if (!asking && silent_wait(o))
        return;
    o->asking = asking;
    bool body = o->call->script != REDSEM__SCRIPT_NONE &&
                !atomic_load(&o->lc->node.scripts->sent[o->call->script]);
    o->req.done = op_done;
    o->req.arg = o;
    int rc = send_call(l, o->lc, &o->req, o->call, body, asking, &o->load);
    if (rc == REDSEM_OK) {
        o->pending = true;
        if (call_syncs(l, o->call))
            sync_join(o);
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
    wait_set(o, false);
    sync_leave(o);
    if (o->pr != NULL)
        freeReplyObject(o->pr);
    REDSEM__LIST_UNLINK(&o->loop->ops, o);
    redsem__free(o);
}

/* A decided acquire (rc: the step's status): a grant short of its replicas is given back
 * first; then made a permit, called back, and o freed. */
static void acquire_end(loop_op *o, int rc)
{
    if (o->s.q.att_out != NULL) { /* the rate limiter's: the attempt, no permit */
        *o->s.q.att_out = o->s.att;
        o->done(o->arg, rc, NULL);
        op_free(o);
        return;
    }
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
        wait_set(o, rc == REDSEM__WAIT);
        int64_t at = o->waiting ? redsem__now_ns() + o->s.wait_ms * REDSEM__NS_PER_MS
                                : o->s.nap_until_ns;
        wake_at(o, o->waiting && o->s.cut_ns < at ? o->s.cut_ns : at);
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
    o->call = &o->own_call;
    o->loop = l;
    o->done = done;
    o->arg = arg;
    REDSEM__LIST_PREPEND(&l->ops, o); /* newest first */
    return o;
}

int redsem__loop_acquire(redsem__loop *l, const redsem__acquirer *q, const redsem__kind *kind,
                         const char *id, int64_t timeout_ms, int64_t lease_ms, int64_t since_ns,
                         redsem__loop_done done, void *arg, atomic_bool **ret_cancel)
{
    loop_op *o = op_new(l, done, arg);
    if (o == NULL)
        return redsem__set_err(l->c, REDSEM_ENOMEM, "out of memory");
    redsem__loop *outer = stepping;
    stepping = l;
    redsem__acquire_begin(&o->s, q, kind, id, timeout_ms, lease_ms);
    if (since_ns != 0 && since_ns < o->s.since_ns)
        o->s.since_ns = since_ns; /* its call: its wait (metrics, age) counts from then */
    o->s.cancel = &o->cancel;
    if (ret_cancel != NULL)
        *ret_cancel = &o->cancel;
    op_step(o);
    stepping = outer;
    return REDSEM_OK;
}

int redsem__loop_run(redsem__loop *l, redsem__call *call, redsem__loop_reply reply,
                     redsem__loop_done done, void *arg)
{
    loop_op *o = op_new(l, done, arg);
    if (o == NULL)
        return redsem__set_err(l->c, REDSEM_ENOMEM, "out of memory");
    o->reply = reply;
    o->call = call;
    redsem__loop *outer = stepping;
    stepping = l;
    op_call(o);
    stepping = outer;
    return REDSEM_OK;
}

int redsem__loop_wait(redsem__loop *l, const char *key, const char *elem, int64_t wait_ms,
                      int64_t cut_ns, int64_t since_ns, bool *signaled,
                      redsem__wake_grant *grant, redsem__loop_done done, void *arg)
{
    if (strlen(key) >= sizeof ((loop_op *)0)->s.keybuf ||
        (elem != NULL && strlen(elem) >= sizeof ((loop_op *)0)->s.elem))
        return redsem__set_err(l->c, REDSEM_EINVAL, "the wait's key or element is too long");
    loop_op *o = op_new(l, done, arg);
    if (o == NULL)
        return redsem__set_err(l->c, REDSEM_ENOMEM, "out of memory");
    o->bare = true;
    o->bare_signaled = signaled;
    o->bare_grant = grant;
    *signaled = false;
    *grant = (redsem__wake_grant){0, 0, 0};
    snprintf(o->s.keybuf, sizeof o->s.keybuf, "%s", key);
    o->s.wkey = o->s.keybuf;
    o->s.keylen = strlen(key);
    snprintf(o->s.elem, sizeof o->s.elem, "%s", elem != NULL ? elem : "");
    o->s.since_ns = since_ns;
    o->s.wait_ms = wait_ms;
    o->s.cut_ns = cut_ns;
    redsem__loop *outer = stepping;
    stepping = l;
    wait_set(o, true);
    int64_t at = redsem__now_ns() + wait_ms * REDSEM__NS_PER_MS;
    wake_at(o, cut_ns < at ? cut_ns : at);
    pend_take(l, o);
    stepping = outer;
    return REDSEM_OK;
}

size_t redsem__loop_waiting(const redsem__loop *l)
{
    size_t n = 0;
    for (const loop_op *o = l->ops.head; o != NULL; o = o->next)
        n += o->waiting;
    return n;
}

/* The opens waiting for lc end (rc, its text err): called back, freed. */
static void opens_end(redsem__loop *l, const loop_conn *lc, int rc, const char *err)
{
    for (loop_op *prev = NULL, *o = l->ops.head; o != NULL;
         o = prev != NULL ? prev->next : l->ops.head) {
        if (o->opening != lc || lc == NULL) {
            prev = o;
            continue;
        }
        REDSEM__LIST_UNLINK(&l->ops, o); /* the next: read again after the callback */
        (void)redsem__set_err(l->c, rc, "%s", err);
        o->done(o->arg, rc, NULL);
        redsem__free(o);
    }
}

int redsem__loop_open(redsem__loop *l, redsem__loop_done done, void *arg)
{
    loop_op *o = op_new(l, done, arg);
    if (o == NULL)
        return redsem__set_err(l->c, REDSEM_ENOMEM, "out of memory");
    redsem__loop *outer = stepping;
    stepping = l;
    if (l->topo != NULL) { /* a cluster: a round of questions reads the map */
        o->opening_map = true;
        wake_at(o, redsem__now_ns() + l->c->connect_timeout_ms * REDSEM__NS_PER_MS);
        l->topo->refreshed_ns = 0;
        map_ask(l, NULL);
    } else {
        int rc = conn_open(l, &l->req);
        if (rc != REDSEM_OK || l->req.state == LC_OPEN) {
            op_free(o);
            stepping = outer;
            done(arg, rc, NULL);
            return REDSEM_OK;
        }
        o->opening = &l->req;
    }
    stepping = outer;
    return REDSEM_OK;
}

int redsem__loop_call(redsem__loop *l, void (*build)(void *arg, redsem__call *call),
                      redsem__loop_reply reply, redsem__loop_done done, void *arg)
{
    loop_op *o = op_new(l, done, arg);
    if (o == NULL)
        return redsem__set_err(l->c, REDSEM_ENOMEM, "out of memory");
    o->reply = reply;
    redsem__loop *outer = stepping;
    stepping = l;
    build(arg, o->call);
    op_call(o);
    stepping = outer;
    return REDSEM_OK;
}

/* ---------------------------------------------------------------- the waits */

/* A waiting op is woken: its wait ends now, signaled. */
static void wake(loop_op *o)
{
    REDSEM__COUNT(&o->loop->ctx, wakeups, 1);
    o->s.signaled = true;
    wake_at(o, 1);
}

static void wait_done(redsem__preq *q, void *arg)
{
    redsem__loop *l = arg;
    if (q == &l->blpop)
        l->blpop_replied = true;
    else
        l->drain_replied = true;
}

/* Whether key (hash h) is one the BLPOP in flight watches. */
static bool watched_key(const redsem__loop *l, const char *key, uint32_t h)
{
    for (int i = 0; i < l->nbkeys; i++)
        if (l->bhash[i] == h && l->bkeys[i] != NULL && strcmp(l->bkeys[i], key) == 0)
            return true;
    return false;
}

static bool watched(const redsem__loop *l, const char *key)
{
    return watched_key(l, key, key_hash(key, strlen(key)));
}

/* The keys of the waiting ops (distinct, at most LOOP_WAIT_KEYS_MAX - 1) into keys; how many,
 * and in *until the earliest end of their waits. */
static int wait_keys(const redsem__loop *l, const char **keys, uint32_t *hashes,
                     int64_t *until)
{
    /* the keys taken, by hash (open addressing, at most half full) */
    enum { SET = 2 * LOOP_WAIT_KEYS_MAX };
    int set[SET];
    memset(set, -1, sizeof set);
    int n = 0;
    *until = REDSEM__FOREVER;
    for (const loop_op *o = l->ops.head; o != NULL; o = o->next) {
        if (!o->waiting || o->s.wkey == NULL || o->s.keylen == 0)
            continue;
        if (o->wake_ns < *until)
            *until = o->wake_ns;
        size_t i = o->whash % SET;
        while (set[i] >= 0 && (hashes[set[i]] != o->whash || strcmp(keys[set[i]], o->s.wkey) != 0))
            i = (i + 1) % SET;
        if (set[i] < 0 && n < LOOP_WAIT_KEYS_MAX - 1) {
            set[i] = n;
            hashes[n] = o->whash;
            keys[n++] = o->s.wkey;
        }
    }
    return n;
}

/* Send a script call of the loop's own (a drain, a poke) as q on the request connection. */
static void send_own(redsem__loop *l, redsem__preq *q, redsem__call *call, bool *pending)
{
    q->done = wait_done;
    q->arg = l;
    bool body = !atomic_load(&l->c->scripts.sent[call->script]);
    *pending = send_call(l, &l->req, q, call, body, false, NULL) == REDSEM_OK;
}

/* The waits of the waiting ops (only the fair and locked ones, which wait by their id, if
 * fair) end now, not signaled: each goes back to its acquire loop and attempts at once. */
static void cut_waits(redsem__loop *l, bool fair)
{
    for (loop_op *o = l->ops.head; o != NULL; o = o->next)
        if (o->waiting && (!fair || o->s.elem[0] != '\0'))
            wake_at(o, 1);
}

/* A connection of the engine lost: lc, open with nothing in flight, may be cut too (a
 * CLIENT KILL of every client, a restart) without its knowing, so it is closed: its next
 * request connects anew rather than failing on it. */
static void suspect_idle(redsem__loop *l, loop_conn *lc)
{
    if (lc->state == LC_OPEN && lc->pipe.rc == REDSEM_OK && lc->pipe.head == NULL)
        conn_close(l, lc, "closed: another connection of the client was lost");
}

/* The BLPOP failed for good: lost with its connection and not issued again (retry 0, or its
 * window ended: rc REDSEM_ECONN), or refused (an error reply: REDSEM_ESERVER, say WRONGTYPE
 * for a key that is not a list): every wait ends with rc (why), and each acquire leaves its
 * queue before it returns the fault. */
static void fail_waits(redsem__loop *l, int rc, const char *why)
{
    l->blpop_rw.until = 0;
    for (loop_op *o = l->ops.head; o != NULL; o = o->next)
        if (o->waiting) {
            o->wait_rc = rc;
            snprintf(o->err, sizeof o->err, "%s", why[0] ? why : "connection lost");
            wake_at(o, 1);
        }
}

/* The drain was lost with its connection, or none could be made, or it came back LOADING
 * (again: nothing ran), or it timed out (a stalled server): a lost or refused one goes again
 * after a pause within its retry window (retry_pause: drain_at, a timer of the loop); once
 * that ends, or after a timeout, the next BLPOP drains first (drain_due). One written may
 * have run, its elements (trimmed off the list) lost with its reply: the fair waiters' waits
 * end now, and each one's attempt finds its direct grant, as its poll would a second later. */
static void drain_lost(redsem__loop *l, bool again, bool written)
{
    if (written)
        cut_waits(l, true);
    if (!again || !retry_pause(l, &l->drain_rw, 0, &l->drain_at)) {
        l->drain_rw.until = 0;
        l->drain_due = true;
    }
}

/* Drain the client's id list: its elements name the fair waiters granted. One that cannot be
 * sent goes again after a pause (drain_lost). */
static void send_drain(redsem__loop *l)
{
    if (l->drain_pending)
        l->drain_again = true; /* what was pushed after that drain ran */
    if (l->drain_pending || l->drain_at != 0 || l->c->wake_ids == NULL)
        return; /* a lost one goes again at drain_at, for all that is queued then */
    l->drain_due = false;
    redsem__call call;
    redsem__call_init(&call, REDSEM__SCRIPT_WAKE_DRAIN, REDSEM__REQ_RETRY, NULL);
    const char *keys[] = {l->c->wake_ids};
    redsem__call_keys(&call, 1, keys);
    redsem__args_i64(&call.ka, 256);
    send_own(l, &l->drain, &call, &l->drain_pending);
    if (!l->drain_pending)
        drain_lost(l, true, false);
}

/* The BLPOP q failed (r: its error reply, or NULL), watching the client's bell if bell. Lost
 * with its connection (or none could be made) or answered LOADING: issued again, on a new
 * connection for a lost one, after a pause within its retry window (retry_pause:
 * blpop_after, then a deadline of the loop), so that a wake-up pushed meanwhile, which stays
 * in its list, is popped then, one reconnect late; a bell a written one may have popped is
 * lost, not the ids: they are drained now (on the request connection). UNBLOCKED (CLIENT
 * UNBLOCK ... ERROR; a primary demoted under a wait): nothing was popped, the waits are cut
 * and each waiter attempts again, counted as a retry (the attempts find what the server says
 * now); so does READONLY under Sentinel (the primary demoted), which also gives the wait
 * connection up. Else (a timeout: a stalled server; another error reply), or once the window
 * ends: no BLPOP for 100 ms, the waits end by their timers and the attempts poll. */
static void wait_fault(redsem__loop *l, const redsem__preq *q, const redisReply *r, bool bell)
{
    if (r == NULL && q != NULL && q->rc == REDSEM_ECONN)
        suspect_idle(l, &l->req); /* what cut this one may have cut the other */
    l->blpop_after = redsem__now_ns() + 100 * REDSEM__NS_PER_MS;
    if (r != NULL && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "UNBLOCKED", 9) == 0) {
        REDSEM__COUNT(&l->ctx, retries, 1);
        l->blpop_after = 0;
        cut_waits(l, false);
        return;
    }
    if (r != NULL && r->type == REDIS_REPLY_ERROR && l->wait.node.resolve != NULL &&
        strncmp(r->str, "READONLY", 8) == 0) {
        /* Sentinel: the primary was demoted under the wait (a BLPOP sent to it after its
         * UNBLOCKED, before the watch moved): nothing was popped. The connection is given up,
         * as demoted_reply gives up a request's, and the waits are cut as after UNBLOCKED:
         * each waiter attempts again (resolving the primary anew), and no BLPOP goes for
         * 100 ms. */
        if (l->wait.pipe.rc == REDSEM_OK)
            redsem__pipe_fail(&l->wait.pipe, REDSEM_ECONN,
                              "the primary became a replica (READONLY)");
        REDSEM__COUNT(&l->ctx, retries, 1);
        cut_waits(l, false);
        return;
    }
    if (r == NULL && q != NULL && q->written && bell)
        send_drain(l);
    bool again = r == NULL ? q == NULL || q->rc == REDSEM_ECONN : redsem__loading_reply(r);
    if (again && retry_pause(l, &l->blpop_rw, 0, &l->blpop_after)) {
        l->blpop_resend = true;
        return;
    }
    if (again && r == NULL) /* lost, and not issued again */
        fail_waits(l, REDSEM_ECONN, q != NULL && q->rc != REDSEM_OK
                                        ? l->wait.pipe.err
                                        : "no wait connection could be made");
    else if (r != NULL && r->type == REDIS_REPLY_ERROR && !again) { /* refused */
        char why[256];
        snprintf(why, sizeof why, "BLPOP: %.200s", r->str);
        fail_waits(l, REDSEM_ESERVER, why);
        l->blpop_after = 0;
    }
}

/* End the BLPOP in flight by a push to our control list (one wake_push.lua call on the
 * request connection, once per BLPOP), so that the next one watches the keys waited on now. */
static void poke(redsem__loop *l)
{
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
        bool body = !atomic_load(&l->c->scripts.sent[REDSEM__SCRIPT_WAKE_PUSH]);
        sent = send_call(l, &l->req, &p->req, &call, body, false, NULL) == REDSEM_OK;
        if (!sent)
            redsem__free(p);
    }
    l->poked = sent;
    l->unwatched = !sent; /* not sent: the next step tries again */
}

/* Start the BLPOP on the waiting ops' keys and our control list, until the earliest of their
 * waits ends; or, one being in flight without a key now waited on, end it by a push to the
 * control list. */
static void wait_sync(redsem__loop *l)
{
    const char *keys[LOOP_WAIT_KEYS_MAX];
    uint32_t hashes[LOOP_WAIT_KEYS_MAX];
    int64_t until;
    if (l->topo != NULL)
        return; /* a Cluster client's waits end by their timers: its waiters poll */
    if (l->blpop_pending) {
        if (l->unwatched && !l->poked) /* an op began waiting on a key not watched */
            poke(l);
        return;
    }
    int n = wait_keys(l, keys, hashes, &until);
    int64_t now = redsem__now_ns();
    if (now < l->blpop_after)
        return; /* the waits end by their timers, or a resend by its deadline */
    l->blpop_resend = false;
    if (n > 0 && l->drain_due)
        send_drain(l);
    int64_t left_ms = (until - now) / REDSEM__NS_PER_MS;
    if (n == 0 || left_ms < 2)
        return;
    if (conn_open(l, &l->wait) != REDSEM_OK) {
        wait_fault(l, NULL, NULL, false);
        return;
    }
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
        l->poked = l->unwatched = false;
        for (int i = 0; i < n; i++) {
            l->bhash[l->nbkeys] = hashes[i];
            l->bkeys[l->nbkeys++] = redsem__strdup(keys[i]); /* NULL: not watched */
        }
    }
    redisFreeCommand(cmd);
}

static void bell_take(redsem__loop *l, const redisReply *e);

/* The BLPOP's reply: the oldest op waiting on the list popped is woken (the client's bell: the
 * waiter its element names at once, bell_take, and the fair waiters its id list names once
 * drained). A timeout or a fault wakes nobody. */
static void blpop_reply(redsem__loop *l)
{
    redsem__preq *q = &l->blpop;
    bool bell = l->c->wake_bell != NULL && watched(l, l->c->wake_bell);
    l->blpop_pending = l->blpop_replied = false;
    for (int i = 0; i < l->nbkeys; i++)
        redsem__free(l->bkeys[i]);
    l->nbkeys = 0;
    redisReply *r = q->rc == REDSEM_OK ? q->replies[0] : NULL;
    if (r == NULL || r->type == REDIS_REPLY_ERROR)
        wait_fault(l, q, r, bell);
    else
        l->blpop_rw.until = 0; /* answered: a window opens at the next fault */
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING) {
        const char *key = r->element[0]->str;
        uint32_t kh = key_hash(key, r->element[0]->len);
        loop_op *oldest = NULL;
        if (l->c->wake_bell != NULL && strcmp(key, l->c->wake_bell) == 0) {
            bell_take(l, r->element[1]);
            send_drain(l);
        } else
            for (loop_op *o = l->ops.head; o != NULL; o = o->next)
                if (o->waiting && o->s.wkey != NULL && o->whash == kh &&
                    strcmp(o->s.wkey, key) == 0 &&
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
    size_t n = o->waiting ? o->elen : strlen(o->s.elem);
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

/* The element e the bell popped (the oldest its id list had when the bell was empty: a copy)
 * wakes the op waiting as it now, a round trip before the drain brings the same text, which
 * the drain then drops (bell_taken). Unsafe it is not either way: a copy taken twice, by this
 * wait or a later one of the same id, carries a token no greater than the fence that wait's
 * attempt saw, and direct_grant (acquire.c) refuses it; the drop only spares a wake-up. */
/* Wake each waiting op the element e names, with the direct grant it carries; whether any. */
static bool wake_named(redsem__loop *l, const redisReply *e)
{
    bool taken = false;
    for (loop_op *o = l->ops.head; e->type == REDIS_REPLY_STRING && o != NULL; o = o->next)
        if (o->waiting && elem_of(o, e->str, e->len)) {
            take_grant(o, e->str + o->elen, e->len - o->elen);
            wake(o);
            taken = true;
        }
    return taken;
}

static void bell_take(redsem__loop *l, const redisReply *e)
{
    if (e == NULL || !wake_named(l, e))
        return; /* the drain's copy wakes it, or keeps it for its next wait */
    redsem__free(l->bell_taken);
    l->bell_taken = redsem__malloc(e->len + 1);
    if (l->bell_taken != NULL) {
        memcpy(l->bell_taken, e->str, e->len);
        l->bell_taken[e->len] = '\0';
    }
}

/* Whether the drained element e is the copy of the one bell_take woke its waiter with (then
 * forgotten: the token in it makes the text of one grant's element unique). */
static bool bell_copy(redsem__loop *l, const redisReply *e)
{
    if (l->bell_taken == NULL || e->type != REDIS_REPLY_STRING ||
        strlen(l->bell_taken) != e->len || memcmp(l->bell_taken, e->str, e->len) != 0)
        return false;
    redsem__free(l->bell_taken);
    l->bell_taken = NULL;
    return true;
}

/* The drain's reply: each element "<id> <meta>[ ...]" wakes the op waiting as it; one of a
 * waiter between two attempts is lost (its poll finds its grant). Full: drain again. */
static void drain_reply(redsem__loop *l)
{
    redsem__preq *q = &l->drain;
    l->drain_pending = l->drain_replied = false;
    if (q->rc != REDSEM_OK) {
        l->drain_again = false;
        drain_lost(l, q->rc == REDSEM_ECONN, q->written);
        return;
    }
    redisReply *r = q->replies[q->nreplies - 1];
    if (q->nreplies == 2)
        freeReplyObject(q->replies[0]);
    if (redsem__loading_reply(r)) {
        freeReplyObject(r);
        drain_lost(l, true, false);
        return;
    }
    l->drain_rw.until = 0; /* answered */
    if (q->nreplies == 2 || r->type != REDIS_REPLY_ERROR)
        atomic_store(&l->c->scripts.sent[REDSEM__SCRIPT_WAKE_DRAIN], r->type != REDIS_REPLY_ERROR);
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *e = r->element[i];
        bool taken = bell_copy(l, e) || wake_named(l, e);
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

/* The engine's connections: req and wait, and a cluster's node connections; how many. */
static int loop_conns(const redsem__loop *l, loop_conn *v[REDSEM__LOOP_CONNS_MAX])
{
    int n = 0;
    v[n++] = (loop_conn *)&l->req;
    v[n++] = (loop_conn *)&l->wait;
    for (size_t i = 0; l->nconn != NULL && i < REDSEM__CLUSTER_NODES_MAX && n < REDSEM__LOOP_CONNS_MAX; i++)
        if (l->nconn[i] != NULL)
            v[n++] = l->nconn[i];
    return n;
}

int redsem__loop_wants(const redsem__loop *l, redsem__loop_watch w[REDSEM__LOOP_WATCH_MAX],
                       int64_t *deadline_ns)
{
    int n = 0;
    *deadline_ns = REDSEM__FOREVER;
    loop_conn *lcs[REDSEM__LOOP_CONNS_MAX];
    int nc = loop_conns(l, lcs);
    for (int i = 0; i < nc; i++) {
        int64_t d = REDSEM__FOREVER;
        const loop_conn *lc = lcs[i];
        if (lc->state == LC_OPEN || lc->state == LC_HANDSHAKE) {
            short ev = redsem__pipe_wants(&lc->pipe, &d);
            if (ev != 0)
                w[n++] = (redsem__loop_watch){redsem__pipe_fd(&lc->pipe), ev};
            int64_t by = lc->state == LC_HANDSHAKE ? open_deadline(lc) : REDSEM__FOREVER;
            if (by < d) /* a held request's cap */
                d = by;
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
    /* a lost BLPOP's or drain's pause */
    if (l->blpop_resend && l->blpop_after < *deadline_ns)
        *deadline_ns = l->blpop_after;
    if (l->drain_at != 0 && l->drain_at < *deadline_ns)
        *deadline_ns = l->drain_at;
    /* the ops' timers; a cancel (another thread's, async.c) rings the loop, whose step runs
     * the op (is_due) */
    if (l->wake_min < *deadline_ns)
        *deadline_ns = l->wake_min;
    return n;
}

void redsem__loop_cancel(redsem__loop *l, atomic_bool *cancel)
{
    atomic_store(cancel, true);
    atomic_store(&l->any_cancel, true);
}

unsigned redsem__loop_generation(const redsem__loop *l)
{
    loop_conn *lcs[REDSEM__LOOP_CONNS_MAX];
    unsigned gen = l->gen;
    for (int i = 0, nc = loop_conns(l, lcs); i < nc; i++)
        gen += lcs[i]->dial.gen + lcs[i]->ask.gen;
    return gen;
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
    if (o->opening_map) { /* a cluster's open: the round ended, or its deadline came */
        int rc = o->loop->round.on ? REDSEM_ECONN : o->loop->map_rc;
        (void)redsem__set_err(o->loop->c, rc, "%s",
                              rc == REDSEM_OK ? ""
                              : o->loop->round.on ? "no cluster node gave the slot map "
                                                    "within the connect timeout"
                                                  : o->loop->map_err);
        o->done(o->arg, rc, NULL);
        op_free(o);
        return;
    }
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
        wait_set(o, false);
        o->s.wait_rc = o->wait_rc; /* s.signaled: set if a wake-up ended it */
        if (o->wait_rc != REDSEM_OK)
            (void)redsem__set_err(o->loop->c, o->wait_rc, "%s", o->err);
        o->wait_rc = REDSEM_OK;
        if (o->bare) { /* a wait alone: it ends */
            *o->bare_signaled = o->s.signaled;
            *o->bare_grant = o->s.grant;
            o->done(o->arg, o->s.wait_rc, NULL);
            op_free(o);
            return;
        }
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
    int64_t now = redsem__now_ns(), earliest = REDSEM__FOREVER;
    if (!l->any_replied && l->wake_min > now && !atomic_load(&l->any_cancel))
        return false; /* nothing due: no pass over a thousand ops */
    l->any_replied = false;
    atomic_store(&l->any_cancel, false);
    size_t n = 0;
    for (const loop_op *o = l->ops.head; o != NULL; o = o->next) {
        n += is_due(o, now);
        if (o->wake_ns != 0 && o->wake_ns < earliest)
            earliest = o->wake_ns;
    }
    l->wake_min = earliest; /* those run below set theirs again (wake_at) */
    if (n == 0)
        return false;
    loop_op **v = redsem__malloc(n * sizeof *v);
    if (v == NULL)
        return false; /* the next step tries again */
    size_t k = 0;
    for (loop_op *o = l->ops.head; o != NULL && k < n; o = o->next)
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
    if (lc->state == LC_HANDSHAKE && !lc->hs_replied && redsem__now_ns() >= open_deadline(lc)) {
        /* a request held behind the handshake reached its cap: the open fails (the others,
         * never written, go again within their windows) */
        conn_fail(l, lc, REDSEM_ECONN, "no reply from Redis within the deadline "
                                           "(its handshake)");
        return;
    }
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
    redsem__loop *outer = stepping;
    stepping = l;
    bool ran;
    do {
        sync_flush(l); /* the WAITs due go in the write below, after the calls they cover */
        /* writes what was queued (also by the last round), reads what arrived */
        loop_conn *lcs[REDSEM__LOOP_CONNS_MAX];
        for (int i = 0, nc = loop_conns(l, lcs); i < nc; i++)
            conn_step(l, lcs[i], ready, n);
        n = 0;
        ran = false;
        if (l->map_replied) {
            map_reply(l);
            ran = true;
        }
        if (l->blpop_replied) {
            blpop_reply(l);
            ran = true;
        }
        if (l->drain_replied) {
            drain_reply(l);
            ran = true;
        }
        if (l->drain_at != 0 && redsem__now_ns() >= l->drain_at) {
            l->drain_at = 0;
            send_drain(l);
            ran = true;
        }
        ran = run_all_due(l) || ran;
        wait_sync(l);
    } while (ran || l->sync_due);
    stepping = outer;
}

redsem__node *redsem__loop_node(redsem__loop *l, const char *key)
{
    if (l->topo == NULL)
        return &l->req.node; /* one server; under Sentinel the primary last resolved */
    int slot = redsem__key_slot(key != NULL ? key : "", key != NULL ? strlen(key) : 0);
    uint16_t at = l->topo->slots[slot];
    loop_conn *lc = at != 0 ? node_conn(l, at - 1) : NULL;
    return lc != NULL ? &lc->node : NULL;
}

/* ---------------------------------------------------------------- the node serving a key */

typedef struct node_query {
    int what; /* 0 served by, 1 not after, 2 note server clock */
    char *buf;
    size_t len;
    int64_t server_us, recv_ns, result;
} node_query;

static void answer(redsem__node *n, node_query *q)
{
    if (q->what == 1)
        q->result = n != NULL ? redsem__node_not_after_us(n) : 0;
    else if (q->what == 2 && n != NULL)
        redsem__node_note_server_clock(n, q->server_us, q->recv_ns);
    else if (q->what == 0 && n != NULL && n->ep.kind == REDSEM__EP_UNIX && n->ep.path != NULL)
        snprintf(q->buf, q->len, "%s", n->ep.path);
    else if (q->what == 0 && n != NULL && n->ep.kind == REDSEM__EP_TCP && n->ep.host != NULL)
        snprintf(q->buf, q->len, strchr(n->ep.host, ':') ? "[%s]:%d" : "%s:%d", n->ep.host,
                 n->ep.port);
}

/* The node serving key: the engine's the calling thread steps (an op's builder or reply). */
static void query_node(redsem_client *c, const char *key, node_query *q)
{
    redsem__loop *eng = redsem__loop_current(c);
    if (eng != NULL)
        answer(redsem__loop_node(eng, key), q);
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

redsem__topo *redsem__loop_topo(redsem__loop *l)
{
    return l->topo;
}

size_t redsem__loop_inflight(const redsem__loop *l)
{
    loop_conn *lcs[REDSEM__LOOP_CONNS_MAX];
    size_t n = 0;
    for (int i = 0, nc = loop_conns(l, lcs); i < nc; i++)
        if (lcs[i] != &l->wait)
            n += (size_t)lcs[i]->pipe.inflight;
    return n;
}

void redsem__loop_free(redsem__loop *l)
{
    if (l == NULL)
        return;
    redsem__stats_detach(l->c, &l->ctx); /* its counters stay in the client's */
    loop_conn *lcs[REDSEM__LOOP_CONNS_MAX];
    for (int i = 0, nc = loop_conns(l, lcs); i < nc; i++) {
        redsem__sentinel_ask_cancel(&lcs[i]->ask);
        redsem__dial_cancel(&lcs[i]->dial);
        lcs[i]->state = LC_CLOSED;
        redsem__pipe_reset(&lcs[i]->pipe); /* requests end (ops: not called back) */
    }
    l->synced.head = l->synced.tail = NULL;
    while (l->ops.head != NULL) {
        loop_op *o = l->ops.head;
        REDSEM__LIST_UNLINK(&l->ops, o);
        wait_set(o, false);
        if (o->pr != NULL)
            freeReplyObject(o->pr);
        redsem__free(o);
    }
    for (int i = 0; i < l->nbkeys; i++)
        redsem__free(l->bkeys[i]);
    for (int i = 0; i < LOOP_PEND_MAX; i++)
        redsem__free(l->pend[i]);
    redsem__free(l->bell_taken);
    cluster_free(l);
    redsem__node_close(&l->req.node);
    redsem__node_close(&l->wait.node);
    if (l->sent.kind != 0)
        redsem__topo_close(&l->sent);
    redsem__free(l);
}
