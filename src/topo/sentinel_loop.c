/* redsem - the Sentinels asked without blocking (topo.h's redsem__sentinel_ask), for the loop
 * engine's resolve step (drive_loop.c): the same question, judgement and rotation as the
 * blocking resolve (sentinel.c's shared parts), each Sentinel dialled by net/dial.c and asked
 * on a pipe (node/conn.h), the event loop waiting in between. */
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>
#include <sodium.h>

#include "topo/topo.h"

static void ask_done(redsem__preq *q, void *arg)
{
    (void)q;
    redsem__sentinel_ask *a = arg;
    a->replied = true;
}

/* Close the connection to the Sentinel asked now (nothing of it stays open). */
static void ask_close(redsem__sentinel_ask *a)
{
    if (a->state == REDSEM__ASK_DIALING)
        redsem__dial_cancel(&a->dial);
    if (a->state == REDSEM__ASK_ASKING)
        redsem__pipe_reset(&a->pipe); /* ends q if it is in flight */
    redsem__conn_close(&a->conn);
    a->state = REDSEM__ASK_IDLE;
    a->gen++;
}

/* A formatted command freed, its bytes wiped (AUTH's password). */
static void cmd_free(char *cmd, int len)
{
    if (cmd == NULL)
        return;
    if (len > 0)
        sodium_memzero(cmd, (size_t)len);
    redisFreeCommand(cmd);
}

/* The dial is done: [AUTH] SENTINEL get-master-addr-by-name go in one write. */
static int ask_send(redsem__sentinel_ask *a)
{
    redsem__args aa, qa;
    char *c1 = NULL, *c2 = NULL;
    a->auth = a->t->given.sentinel_password != NULL;
    if (a->auth)
        redsem__sentinel_args(a->t, true, &aa);
    redsem__sentinel_args(a->t, false, &qa);
    int l1 = a->auth ? redsem__args_format(&aa, &c1) : 0;
    int l2 = redsem__args_format(&qa, &c2);
    size_t len = (size_t)(l1 > 0 ? l1 : 0) + (size_t)(l2 > 0 ? l2 : 0);
    char *all = l1 >= 0 && l2 >= 0 ? redsem__malloc(len) : NULL;
    int rc = REDSEM_ENOMEM;
    a->state = REDSEM__ASK_ASKING;
    redsem__pipe_init(&a->pipe, &a->conn);
    a->gen++;
    if (all != NULL) {
        if (l1 > 0)
            memcpy(all, c1, (size_t)l1);
        memcpy(all + l1, c2, (size_t)l2);
        a->qlen = len;
        a->replied = false;
        a->q = (redsem__preq){.nreplies = a->auth ? 2 : 1, .deadline_ns = a->share_ns,
                              .done = ask_done, .arg = a};
        rc = redsem__pipe_send(&a->pipe, &a->q, all, len);
        sodium_memzero(all, len);
        redsem__free(all);
    }
    cmd_free(c1, l1);
    cmd_free(c2, l2);
    if (rc == REDSEM_OK) /* a failed write ends q: judged by the step */
        (void)redsem__pipe_step(&a->pipe, false, true, redsem__now_ns());
    return rc;
}

/* The reply came (or q failed): the Sentinel's answer judged as the blocking ask judges it.
 * REDSEM_OK with n->ep set, or its failure with the reason in why. */
static int ask_judge(redsem__sentinel_ask *a, char *why, size_t whylen)
{
    redsem__preq *q = &a->q;
    int rc = q->rc;
    if (rc != REDSEM_OK) {
        snprintf(why, whylen, "%s", a->pipe.err);
        return rc;
    }
    if (q->written)
        redsem__pipe_wipe(&a->pipe, q, a->qlen);
    if (a->auth)
        rc = redsem__sentinel_judge_auth(q->replies[0], why, whylen);
    char *host = NULL;
    int port = 0;
    if (rc == REDSEM_OK)
        rc = redsem__sentinel_judge(a->t, q->replies[q->nreplies - 1], &host, &port, why,
                                    whylen);
    for (int i = 0; i < q->nreplies; i++)
        freeReplyObject(q->replies[i]);
    if (rc == REDSEM_OK) {
        redsem__free(a->n->ep.host);
        a->n->ep.host = host;
        a->n->ep.port = port;
    }
    return rc;
}

/* Ask the next Sentinel of the round (the dial starts), skipping those that fail at once.
 * REDSEM_OK: under way; else the round's end (every Sentinel failed: a->err). */
static int ask_next(redsem__sentinel_ask *a)
{
    size_t i;
    int64_t share;
    while (redsem__sentinel_round_next(a->t, &a->round, a->deadline_ns, &i, &share)) {
        const redsem__hostport *s = &a->t->given.hosts[i];
        a->which = i;
        a->share_ns = share;
        a->ep = (redsem__endpoint){.kind = REDSEM__EP_TCP, .host = s->host, .port = s->port};
        redsem__conn_tls tls = {a->n->tls_ctx, NULL}; /* verified against the Sentinel's host */
        char why[256] = "";
        int rc = redsem__dial_start(&a->dial, &a->conn, &a->ep, &tls, a->n->command_timeout_ms,
                                    why, sizeof why);
        a->gen++;
        if (rc == REDSEM_OK) {
            a->state = REDSEM__ASK_DIALING;
            if (a->dial.state != REDSEM__DIAL_DONE)
                return REDSEM_OK;
            rc = ask_send(a);
            if (rc == REDSEM_OK)
                return REDSEM_OK;
        }
        ask_close(a);
        if (rc == REDSEM_ENOMEM) {
            snprintf(a->err, sizeof a->err, "out of memory");
            return rc;
        }
        redsem__sentinel_round_failed(a->t, &a->round, i, rc, why, a->err, sizeof a->err);
    }
    a->state = REDSEM__ASK_IDLE;
    return redsem__sentinel_round_end(a->t, &a->round, a->err, sizeof a->err);
}

int redsem__sentinel_ask_start(redsem__sentinel_ask *a, redsem__topo *t, redsem__node *n,
                               int64_t deadline_ns)
{
    unsigned gen = a->gen;
    memset(a, 0, sizeof *a);
    a->gen = gen + 1;
    a->t = t;
    a->n = n;
    a->deadline_ns = deadline_ns;
    redsem__conn_init(&a->conn);
    size_t first = 0;
    int rc = redsem__sentinel_watched(t, n, &first, a->err, sizeof a->err);
    if (rc != 1)
        return rc; /* the watch's address, or out of memory */
    redsem__sentinel_round_begin(&a->round, first, a->err);
    return ask_next(a);
}

int redsem__sentinel_ask_wants(const redsem__sentinel_ask *a, struct pollfd *w, int max,
                               int64_t *deadline_ns)
{
    int n = 0;
    *deadline_ns = REDSEM__FOREVER;
    if (a->state == REDSEM__ASK_DIALING) {
        n = redsem__dial_wants(&a->dial, w, max, deadline_ns);
    } else if (a->state == REDSEM__ASK_ASKING && max > 0) {
        short ev = redsem__pipe_wants(&a->pipe, deadline_ns);
        if (ev != 0)
            w[n++] = (struct pollfd){.fd = redsem__pipe_fd(&a->pipe), .events = ev};
    }
    if (a->state != REDSEM__ASK_IDLE && a->share_ns < *deadline_ns)
        *deadline_ns = a->share_ns;
    return n;
}

int redsem__sentinel_ask_step(redsem__sentinel_ask *a, const struct pollfd *ready, int n)
{
    char why[256] = "";
    int rc = REDSEM_OK;
    int64_t now = redsem__now_ns();
    if (a->state == REDSEM__ASK_DIALING) {
        rc = redsem__dial_step(&a->dial, ready, n, why, sizeof why);
        a->gen++; /* c-ares' sockets may have changed (gen only grows: dial.gen restarts) */
        if (rc == REDSEM_OK && a->dial.state != REDSEM__DIAL_DONE && now >= a->share_ns)
            rc = redsem__dial_timeout(&a->dial, why, sizeof why);
        if (rc == REDSEM_OK && a->dial.state == REDSEM__DIAL_DONE)
            rc = ask_send(a);
        if (rc == REDSEM_OK)
            return REDSEM_OK;
    } else if (a->state == REDSEM__ASK_ASKING) {
        bool r = false, w = false;
        for (int i = 0; i < n; i++)
            if (ready[i].fd == redsem__pipe_fd(&a->pipe)) {
                r = (ready[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
                w = (ready[i].revents & POLLOUT) != 0;
            }
        (void)redsem__pipe_step(&a->pipe, r, w, now); /* its deadline: the share's */
        if (!a->replied)
            return REDSEM_OK;
        rc = ask_judge(a, why, sizeof why);
        if (rc == REDSEM_OK) {
            a->t->first = a->which; /* the first that answers moves to the front */
            ask_close(a);
            return REDSEM_OK;
        }
    } else {
        return REDSEM_OK;
    }
    ask_close(a);
    if (rc == REDSEM_ENOMEM) {
        snprintf(a->err, sizeof a->err, "out of memory");
        return rc;
    }
    redsem__sentinel_round_failed(a->t, &a->round, a->which, rc, why, a->err, sizeof a->err);
    return ask_next(a);
}

int redsem__sentinel_ask_timeout(redsem__sentinel_ask *a)
{
    ask_close(a);
    redsem__sentinel_round_failed(a->t, &a->round, a->which, REDSEM_ETIMEDOUT, "timed out",
                                  a->err, sizeof a->err);
    return redsem__sentinel_round_end(a->t, &a->round, a->err, sizeof a->err);
}

void redsem__sentinel_ask_cancel(redsem__sentinel_ask *a)
{
    if (a->state != REDSEM__ASK_IDLE)
        ask_close(a);
}
