/* White-box tests of one connection's request pipeline (src/node/conn.c) against a real
 * redis-server of its own: many requests in flight on one connection, replies matched in
 * order, requests queued while earlier ones are in flight, and the faults (a deadline that
 * passes on a stopped server, a connection the server closes) ending every request in flight
 * with "written" telling which may have been applied. The pipe is driven here as any driver
 * drives it: poll() on what it wants until its deadline, then a step. */
#include <criterion/criterion.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "node/node.h"
#include "server.h"

typedef struct done_log {
    int order[64];
    int n;
} done_log;

typedef struct req {
    redsem__preq q;
    done_log *log;
    int i;
} req;

static void on_done(redsem__preq *q, void *arg)
{
    req *r = arg;
    (void)q;
    r->log->order[r->log->n++] = r->i;
}

static void open_conn(const ts_server *srv, redsem__conn *c)
{
    redsem__endpoint ep;
    char err[256] = "";
    cr_assert_eq(redsem__url_parse(srv->url, &ep, err, sizeof err), REDSEM_OK, "%s", err);
    redsem__conn_init(c);
    bool retryable = false;
    int rc = redsem__conn_open(c, &ep, NULL, redsem__now_ns() + 5000 * REDSEM__NS_PER_MS, 5000,
                               &retryable, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "connect: %s", err);
    redsem__endpoint_clear(&ep);
}

/* Queue "ECHO <i>" (or any command) as request i. */
static void send_cmd(redsem__pipe *p, req *r, done_log *log, int i, int64_t deadline,
                     const char *fmt, ...)
{
    char *cmd = NULL;
    va_list ap;
    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    cr_assert_gt(len, 0);
    *r = (req){.q = {.nreplies = 1, .deadline_ns = deadline, .done = on_done, .arg = r},
               .log = log, .i = i};
    cr_assert_eq(redsem__pipe_send(p, &r->q, cmd, (size_t)len), REDSEM_OK);
    redisFreeCommand(cmd);
}

/* Drive p until log holds want ends or the pipe fails; the last step's status. */
static int drive(redsem__pipe *p, done_log *log, int want)
{
    int rc = REDSEM_OK;
    while (log->n < want && rc == REDSEM_OK) {
        int64_t dl;
        short ev = redsem__pipe_wants(p, &dl);
        cr_assert_neq(ev, 0, "requests in flight, but the pipe wants nothing");
        struct pollfd pfd = {redsem__pipe_fd(p), ev, 0};
        int64_t left = (dl - redsem__now_ns()) / REDSEM__NS_PER_MS;
        (void)poll(&pfd, 1, left < 0 ? 0 : (int)(left + 1));
        rc = redsem__pipe_step(p, (pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0,
                               (pfd.revents & POLLOUT) != 0, redsem__now_ns());
    }
    return rc;
}

/* 40 requests in flight on one connection, 20 more queued while 30 of them are still in
 * flight (the server holds the 11th, a BLPOP, for 300 ms): each ends once, in order, with its
 * own reply. */
Test(pipe, many_in_flight_replies_in_order, .timeout = 60)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem__conn c;
    open_conn(&srv, &c);
    redsem__pipe p;
    redsem__pipe_init(&p, &c);
    done_log log = {.n = 0};
    static req r[60];
    int64_t dl = redsem__now_ns() + 10000 * REDSEM__NS_PER_MS;
    for (int i = 0; i < 40; i++)
        if (i == 10) /* held 300 ms by the server: 10..39 stay in flight meanwhile */
            send_cmd(&p, &r[i], &log, i, dl, "BLPOP nothing 0.3");
        else
            send_cmd(&p, &r[i], &log, i, dl, "ECHO r%d", i);
    cr_assert_eq(p.inflight, 40);
    cr_assert_eq(drive(&p, &log, 10), REDSEM_OK, "%s", p.err);
    cr_assert_eq(p.inflight, 30);
    for (int i = 40; i < 60; i++) /* while earlier ones are in flight */
        send_cmd(&p, &r[i], &log, i, dl, "ECHO r%d", i);
    cr_assert_eq(drive(&p, &log, 60), REDSEM_OK, "%s", p.err);
    int64_t wdl;
    cr_assert_eq(redsem__pipe_wants(&p, &wdl), 0, "idle, yet it wants events");
    for (int i = 0; i < 60; i++) {
        char want[16];
        snprintf(want, sizeof want, "r%d", i);
        cr_assert_eq(log.order[i], i, "ended out of order");
        cr_assert_eq(r[i].q.rc, REDSEM_OK);
        cr_assert(r[i].q.written);
        if (i == 10)
            cr_assert_eq(r[i].q.replies[0]->type, REDIS_REPLY_NIL, "BLPOP got another's reply");
        else
            cr_assert_str_eq(r[i].q.replies[0]->str, want, "request %d got another's reply", i);
        cr_assert_leq(r[i].q.sent_ns, r[i].q.recv_ns);
        freeReplyObject(r[i].q.replies[0]);
    }
    redsem__pipe_reset(&p);
    redsem__conn_close(&c);
    ts_server_stop(&srv);
}

/* A stopped server: at the earliest deadline in flight every request ends REDSEM_ETIMEDOUT,
 * written (maybe applied), and the pipe refuses new requests. */
Test(pipe, a_deadline_ends_everything_in_flight, .timeout = 60)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem__conn c;
    open_conn(&srv, &c);
    redsem__pipe p;
    redsem__pipe_init(&p, &c);
    done_log log = {.n = 0};
    req r[3];
    ts_server_pause(&srv, true);
    int64_t now = redsem__now_ns();
    send_cmd(&p, &r[0], &log, 0, now + 2000 * REDSEM__NS_PER_MS, "INCR k");
    send_cmd(&p, &r[1], &log, 1, now + 200 * REDSEM__NS_PER_MS, "INCR k");
    send_cmd(&p, &r[2], &log, 2, now + 3000 * REDSEM__NS_PER_MS, "INCR k");
    int rc = drive(&p, &log, 3);
    int64_t took = (redsem__now_ns() - now) / REDSEM__NS_PER_MS;
    ts_server_pause(&srv, false);
    cr_assert_eq(rc, REDSEM_ETIMEDOUT);
    cr_assert_eq(log.n, 3, "every request in flight ends");
    cr_assert_geq(took, 200, "ended %lld ms after the start, before the earliest deadline",
                  (long long)took);
    cr_assert_lt(took, 1900, "ended %lld ms after the start: not at the earliest deadline",
                 (long long)took);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(r[i].q.rc, REDSEM_ETIMEDOUT);
        cr_assert(r[i].q.written, "request %d was written: it may have been applied", i);
    }
    req late;
    char *cmd = NULL;
    int len = redisFormatCommand(&cmd, "PING");
    late.q = (redsem__preq){.nreplies = 1, .deadline_ns = now, .done = on_done, .arg = &late};
    cr_assert_eq(redsem__pipe_send(&p, &late.q, cmd, (size_t)len), REDSEM_ETIMEDOUT);
    redisFreeCommand(cmd);
    redsem__pipe_reset(&p);
    redsem__conn_abort(&c);
    ts_server_stop(&srv);
}

/* The server closes the connection (CLIENT KILL) with requests in flight: each ends
 * REDSEM_ECONN, written. */
Test(pipe, a_lost_connection_ends_everything_in_flight, .timeout = 60)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem__conn c;
    open_conn(&srv, &c);
    redsem__pipe p;
    redsem__pipe_init(&p, &c);
    done_log log = {.n = 0};
    req r[3];
    int64_t dl = redsem__now_ns() + 10000 * REDSEM__NS_PER_MS;
    /* the first blocks on the server (1 s), so the others are still in flight at the kill */
    send_cmd(&p, &r[0], &log, 0, dl, "BLPOP nothing 1");
    send_cmd(&p, &r[1], &log, 1, dl, "INCR k");
    send_cmd(&p, &r[2], &log, 2, dl, "INCR k");
    cr_assert_eq(redsem__pipe_step(&p, false, true, redsem__now_ns()), REDSEM_OK);
    cr_assert_eq(ts_command(&srv, NULL, 0, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes",
                            NULL),
                 0);
    cr_assert_eq(drive(&p, &log, 3), REDSEM_ECONN, "%s", p.err);
    cr_assert_eq(log.n, 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(r[i].q.rc, REDSEM_ECONN);
        cr_assert(r[i].q.written);
        cr_assert_null(r[i].q.replies[0]);
    }
    redsem__pipe_reset(&p);
    redsem__conn_abort(&c);
    ts_server_stop(&srv);
}
