/* White-box tests of the event-loop driver of acquires (src/drive_loop.c): acquires stepped by
 * a poll() loop on the test's own thread, linked with the internal archive and run against
 * the suite's private redis-server (its faults and sync_replicas against servers of their
 * own). */
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "internal.h"

/* Threads of this process now (/proc/self/task). */
static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

typedef struct outcome {
    bool done;
    int rc;
    redsem_permit *permit;
    int64_t at_ms; /* when it was called back (tf_now_ms) */
} outcome;

static void on_done(void *arg, int rc, redsem_permit *p)
{
    outcome *o = arg;
    cr_assert_not(o->done, "called back twice");
    o->done = true;
    o->at_ms = tf_now_ms();
    o->rc = rc;
    o->permit = p;
}

/* One round of the loop: poll the driver's descriptor until its deadline (at most max_ms),
 * then step it. */
static void turn(redsem__loop *l, int64_t max_ms)
{
    redsem__loop_watch w[REDSEM__LOOP_WATCH_MAX];
    int64_t deadline;
    int n = redsem__loop_wants(l, w, &deadline);
    int64_t now = redsem__now_ns();
    int64_t ms = deadline == REDSEM__FOREVER ? max_ms
                                             : (deadline - now + REDSEM__NS_PER_MS - 1) /
                                                   REDSEM__NS_PER_MS;
    if (ms > max_ms)
        ms = max_ms;
    if (ms < 0)
        ms = 0;
    struct pollfd p[REDSEM__LOOP_WATCH_MAX];
    for (int i = 0; i < n; i++)
        p[i] = (struct pollfd){.fd = w[i].fd, .events = w[i].events};
    int k = poll(p, (nfds_t)n, (int)ms);
    redsem__loop_step(l, p, k > 0 ? n : 0);
}

/* Turn the loop until every outcome of os is in (at most 20 s). */
static void run_until(redsem__loop *l, outcome *os, int n)
{
    int64_t end = tf_now_ms() + 20000;
    for (;;) {
        bool all = true;
        for (int i = 0; i < n; i++)
            all = all && os[i].done;
        if (all)
            return;
        cr_assert(tf_now_ms() < end, "the loop's acquires did not end within 20 s");
        turn(l, 50);
    }
}

static void sem_start(redsem__loop *l, redsem_sem *s, int64_t timeout_ms, outcome *o,
                      atomic_bool **cancel)
{
    redsem__acquirer q;
    const redsem__kind *kind;
    char id[REDSEM_ID_BUFSIZE];
    redsem_permit *unused = NULL;
    OK(s->client,
       redsem__sem_prepare(s, NULL, false, 1, timeout_ms, &unused, &q, &kind, id));
    OK(s->client, redsem__loop_acquire(l, &q, kind, id, timeout_ms, s->lease_ms, 0, on_done, o,
                                       cancel));
}

/* Free what a test made: the loop, the permit p, the semaphore and its client. */
static void finish(redsem__loop *l, redsem_sem *s, redsem_permit *p)
{
    redsem_client *c = s->client;
    redsem_permit_free(p);
    redsem__loop_free(l);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* Every strategy: acquires up to the limit are granted on the loop, the next try is refused,
 * a waiting one is granted once a permit is released (by a blocking call between two turns),
 * and no thread was started for any of it. */
STRATEGY_TEST(loop, grants_and_waits_on_the_loop_without_a_thread, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, tf_name("loop"), strategy, 2, 10000, &s));
    int before = threads_now();
    redsem__loop *l = NULL;
    OK(c, redsem__loop_new(c, &l));
    outcome o[4] = {{0}};
    /* one after the other: two locked tries at once may find the guard taken by the other */
    sem_start(l, s, 0, &o[0], NULL);
    run_until(l, &o[0], 1);
    sem_start(l, s, 0, &o[1], NULL);
    run_until(l, &o[1], 1);
    OK(c, o[0].rc);
    OK(c, o[1].rc);
    cr_assert(redsem_permit_held(o[0].permit) && redsem_permit_held(o[1].permit));
    sem_start(l, s, 0, &o[2], NULL);
    run_until(l, &o[2], 1);
    cr_assert_eq(o[2].rc, REDSEM_EBUSY, "%s", redsem_client_errmsg(c));
    sem_start(l, s, 10000, &o[3], NULL);
    for (int i = 0; i < 10; i++)
        turn(l, 10);
    cr_assert_not(o[3].done, "granted while the semaphore was full");
    OK(c, redsem_permit_release(o[0].permit));
    run_until(l, &o[3], 1);
    OK(c, o[3].rc);
    cr_assert_eq(threads_now(), before, "the loop driver started a thread");
    for (int i = 1; i < 4; i += 2)
        OK(c, redsem_permit_release(o[i].permit));
    for (int i = 0; i < 3; i++)
        redsem_permit_free(o[i].permit);
    finish(l, s, o[3].permit);
}

/* A waiting acquire whose cancel flag is set ends with REDSEM_ECANCELED, its queue left. */
STRATEGY_TEST(loop, a_cancelled_wait_ends_on_the_loop, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, tf_name("loopc"), strategy, 1, 10000, &s));
    redsem_permit *held = NULL;
    OK(c, redsem_sem_try_acquire(s, &held));
    redsem__loop *l = NULL;
    OK(c, redsem__loop_new(c, &l));
    outcome o = {0};
    atomic_bool *cancel = NULL;
    sem_start(l, s, 60000, &o, &cancel);
    for (int i = 0; i < 5; i++)
        turn(l, 10);
    cr_assert_not(o.done);
    redsem__loop_cancel(l, cancel);
    run_until(l, &o, 1);
    cr_assert_eq(o.rc, REDSEM_ECANCELED, "%s", redsem_client_errmsg(c));
    cr_assert_eq(tf_waiters(s), 0, "the cancelled waiter is still queued");
    OK(c, redsem_permit_release(held));
    finish(l, s, held);
}

/* A lock on the loop: granted, then refused to a second holder until its release. */
Test(loop, a_lock_on_the_loop, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_lock *k = NULL;
    OK(c, redsem_lock_open(c, tf_name("loopl"), 10000, &k));
    redsem__loop *l = NULL;
    OK(c, redsem__loop_new(c, &l));
    outcome o[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        redsem__acquirer q;
        const redsem__kind *kind;
        char id[REDSEM_ID_BUFSIZE];
        redsem_permit *unused = NULL;
        OK(c, redsem__lock_prepare(k, NULL, false, 0, &unused, &q, &kind, id));
        OK(c, redsem__loop_acquire(l, &q, kind, id, 0, k->lease_ms, 0, on_done, &o[i], NULL));
        run_until(l, &o[i], 1);
    }
    OK(c, o[0].rc);
    cr_assert_eq(o[1].rc, REDSEM_EBUSY, "%s", redsem_client_errmsg(c));
    OK(c, redsem_permit_release(o[0].permit));
    redsem_permit_free(o[0].permit);
    redsem__loop_free(l);
    redsem_lock_free(k);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- faults */

/* A release on the loop (as async.c runs one): its call, its outcome. */
typedef struct loop_rel {
    redsem_permit *p;
    outcome o;
} loop_rel;

static void rel_call(void *arg, redsem__call *call)
{
    redsem_permit *p = ((loop_rel *)arg)->p;
    p->kind->release_call(p->handle, p, call);
}

static int rel_reply(void *arg, int rc, redisReply **r, const redsem__req_info *info)
{
    redsem_permit *p = ((loop_rel *)arg)->p;
    rc = p->kind->release_reply(p->client, p->handle, p, rc, *r, info);
    return redsem__release_end(p, rc);
}

static void rel_done(void *arg, int rc, redsem_permit *p)
{
    on_done(&((loop_rel *)arg)->o, rc, p);
}

static void rel_start(redsem__loop *l, loop_rel *r)
{
    redsem_client *c = r->p->client;
    OK(c, redsem__release_begin(r->p));
    OK(c, redsem__loop_call(l, rel_call, rel_reply, rel_done, r));
}

/* Hold the writes of srv's clients (an EVALSHA then waits, unanswered, on the server). */
static void pause_writes(ts_server *srv)
{
    char out[128] = "";
    cr_assert_eq(ts_command(srv, out, sizeof out, "CLIENT", "PAUSE", "10000", "WRITE", NULL), 0,
                 "%s", out);
}

/* Kill srv's clients (the engine's connections among them; not this one), then let the
 * writes go on: the requests they held were never run. */
static void kill_and_resume(ts_server *srv)
{
    char out[128] = "";
    cr_assert_eq(ts_command(srv, out, sizeof out, "CLIENT", "KILL", "TYPE", "normal", "SKIPME",
                            "yes", NULL),
                 0, "%s", out);
    cr_assert_eq(ts_command(srv, out, sizeof out, "CLIENT", "UNPAUSE", NULL), 0, "%s", out);
}

/* The permits of a limit-2 semaphore held by others: 2 - what another client can take. */
static int held_by_others(const char *url, const char *name, redsem_strategy strategy)
{
    redsem_client *h = tf_client_for(url, 1000, 0);
    redsem_sem *hs = NULL;
    OK(h, redsem_sem_open(h, name, strategy, 2, 10000, &hs));
    redsem_permit *p[2] = {NULL, NULL};
    int taken = 0;
    while (taken < 2 && redsem_sem_try_acquire(hs, &p[taken]) == REDSEM_OK)
        taken++;
    for (int i = 0; i < taken; i++) {
        OK(h, redsem_permit_release(p[i]));
        redsem_permit_free(p[i]);
    }
    redsem_sem_free(hs);
    redsem_client_free(h);
    return 2 - taken;
}

/* The engine's request connection killed while an acquire's reply is due (its EVALSHA held
 * on the server by CLIENT PAUSE WRITE): with a retry window the acquire is sent again on a
 * new connection and granted once (one holder on the server), the resend counted in the
 * client's stats; with retry 0 it is not sent again, and its outcome is unknown (a written
 * request: REDSEM_EUNKNOWN after REDSEM_ECONN, as on a lane). */
static void killed_acquire(redsem_strategy strategy, int64_t retry_ms)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, retry_ms, 0);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, "killed", strategy, 2, 10000, &s));
    redsem_client_stats st0, st1;
    OK(c, redsem_client_get_stats(c, &st0));
    redsem__loop *l = NULL;
    OK(c, redsem__loop_new(c, &l));
    pause_writes(&srv);
    outcome o = {0};
    sem_start(l, s, 5000, &o, NULL);
    for (int i = 0; i < 5; i++)
        turn(l, 10);
    cr_assert_not(o.done, "decided while the server held its writes");
    kill_and_resume(&srv);
    run_until(l, &o, 1);
    OK(c, redsem_client_get_stats(c, &st1));
    if (retry_ms > 0) {
        OK(c, o.rc);
        cr_assert(redsem_permit_held(o.permit));
        cr_assert_eq(held_by_others(srv.url, "killed", strategy), 1,
                     "the acquire sent again holds one permit, not two");
        cr_assert_gt(st1.retries, st0.retries, "the resend is not in the client's stats");
        cr_assert_geq(st1.connects - st0.connects, 2, "the engine's connects are not counted");
        OK(c, redsem_permit_release(o.permit));
    } else {
        cr_assert_eq(o.rc, REDSEM_EUNKNOWN, "%s: %s", redsem_err_name(o.rc),
                     redsem_client_errmsg(c));
        cr_assert(strstr(redsem_client_errmsg(c), "(REDSEM_ECONN)") != NULL, "%s",
                  redsem_client_errmsg(c));
        cr_assert_eq(st1.retries, st0.retries, "sent again with retry 0");
    }
    redsem_permit_free(o.permit);
    redsem__loop_free(l);
    redsem_sem_free(s);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

STRATEGY_TEST(loop, a_lost_acquire_is_sent_again_and_granted_once, .timeout = 60)
{
    killed_acquire(strategy, 3000);
}

Test(loop, a_lost_acquire_with_retry_0_is_not_sent_again, .timeout = 60)
{
    killed_acquire(REDSEM_STRATEGY_BASIC, 0);
}

/* A release in flight when the engine's connection is killed: sent again, it ends OK (with
 * retry 0: REDSEM_ECONN, the permit still held until its lease ends). */
static void killed_release(redsem_strategy strategy, int64_t retry_ms)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, retry_ms, 0);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, "killedrel", strategy, 2, 10000, &s));
    redsem__loop *l = NULL;
    OK(c, redsem__loop_new(c, &l));
    outcome o = {0};
    sem_start(l, s, 0, &o, NULL);
    run_until(l, &o, 1);
    OK(c, o.rc);
    pause_writes(&srv);
    loop_rel r = {.p = o.permit};
    rel_start(l, &r);
    for (int i = 0; i < 5; i++)
        turn(l, 10);
    cr_assert_not(r.o.done, "released while the server held its writes");
    kill_and_resume(&srv);
    run_until(l, &r.o, 1);
    if (retry_ms > 0) {
        OK(c, r.o.rc);
        cr_assert_not(redsem_permit_held(o.permit));
        cr_assert_eq(held_by_others(srv.url, "killedrel", strategy), 0);
    } else {
        cr_assert_eq(r.o.rc, REDSEM_ECONN, "%s: %s", redsem_err_name(r.o.rc),
                     redsem_client_errmsg(c));
    }
    redsem_permit_free(o.permit);
    redsem__loop_free(l);
    redsem_sem_free(s);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

STRATEGY_TEST(loop, a_release_cut_by_a_lost_connection_ends_ok, .timeout = 60)
{
    killed_release(strategy, 3000);
}

Test(loop, a_release_cut_with_retry_0_is_econn, .timeout = 60)
{
    killed_release(REDSEM_STRATEGY_FAIR, 0);
}

/* The id of srv's client blocked now (flags=b: the engine's BLPOP; there is one at most),
 * other than not_id, or -1 (CLIENT LIST). */
static long long blocked_client(ts_server *srv, long long not_id)
{
    char out[8192] = "";
    cr_assert_eq(ts_command(srv, out, sizeof out, "CLIENT", "LIST", NULL), 0, "%s", out);
    for (char *line = out; line != NULL && *line != '\0';) {
        char *end = strchr(line, '\n');
        if (end != NULL)
            *end = '\0';
        long long id = -1;
        const char *f = strstr(line, " flags=");
        if (sscanf(line, "id=%lld", &id) == 1 && id != not_id && f != NULL &&
            strchr(f + 7, 'b') != NULL && strchr(f + 7, 'b') < strchr(f + 7, ' '))
            return id;
        line = end != NULL ? end + 1 : NULL;
    }
    return -1;
}

/* Turn the loop as an event loop does (its descriptors, its one deadline: no turn of the
 * test's own in between) until a client other than not_id is blocked on srv, or o is done
 * (at most 10 s); that client's id (-1: none). */
static long long until_blocked(redsem__loop *l, ts_server *srv, long long not_id, outcome *o)
{
    int64_t end = tf_now_ms() + 10000;
    long long id;
    while ((id = blocked_client(srv, not_id)) < 0 && !o->done) {
        cr_assert(tf_now_ms() < end, "no BLPOP within 10 s");
        turn(l, 2000);
    }
    return id;
}

/* As run_until, by the loop's deadline alone (a wait's end then comes by its timer). */
static void run_by_deadline(redsem__loop *l, outcome *o)
{
    int64_t end = tf_now_ms() + 20000;
    while (!o->done) {
        cr_assert(tf_now_ms() < end, "the loop's acquire did not end within 20 s");
        turn(l, 2000);
    }
}

/* A fair waiter on the loop (30 s timeout) blocked in its BLPOP, on a server of its own,
 * while a holder on another client (h) keeps the permit of a limit-1 semaphore. */
typedef struct fair_wait {
    ts_server srv;
    redsem_client *c, *h;
    redsem_sem *s, *hs;
    redsem_permit *held;
    redsem__loop *l;
    outcome o;
    long long id; /* its wait connection's client id */
} fair_wait;

static void fair_wait_start(fair_wait *w)
{
    memset(w, 0, sizeof *w);
    cr_assert_eq(ts_server_start(&w->srv, NULL, false), 0);
    w->c = tf_client_for(w->srv.url, 3000, 0);
    w->h = tf_client_for(w->srv.url, 3000, 0);
    OK(w->c, redsem_sem_open(w->c, "cutwait", REDSEM_STRATEGY_FAIR, 1, 30000, &w->s));
    OK(w->h, redsem_sem_open(w->h, "cutwait", REDSEM_STRATEGY_FAIR, 1, 30000, &w->hs));
    OK(w->h, redsem_sem_try_acquire(w->hs, &w->held));
    OK(w->c, redsem__loop_new(w->c, &w->l));
    sem_start(w->l, w->s, 30000, &w->o, NULL);
    w->id = until_blocked(w->l, &w->srv, -1, &w->o);
    cr_assert_not(w->o.done, "decided while the permit was held");
}

/* The waiter granted (after the holder's release): its permit released, everything freed. */
static void fair_wait_end(fair_wait *w)
{
    OK(w->c, w->o.rc);
    cr_assert(redsem_permit_held(w->o.permit));
    OK(w->c, redsem_permit_release(w->o.permit));
    redsem_permit_free(w->o.permit);
    redsem_permit_free(w->held);
    redsem__loop_free(w->l);
    redsem_sem_free(w->s);
    redsem_sem_free(w->hs);
    redsem_client_free(w->c);
    redsem_client_free(w->h);
    ts_server_stop(&w->srv);
}

/* A fair waiter's BLPOP cut by a fault on the engine's wait connection, then the holder
 * releases, granting the waiter directly (its element on its client's id list, the bell
 * rung). how: 0 its connection killed, the release made before the loop sees it (the bell
 * the lost BLPOP watched is drained at once); 1 killed, the BLPOP issued again on a new
 * connection after the pause (the lane's, a timer of the loop) before the release; 2 CLIENT
 * UNBLOCK ... ERROR (the wait cut: an attempt, then a new BLPOP on the same connection). In
 * each the wake-up comes by the engine (stats.wakeups), not by the waiter's poll (0.75-1 s
 * later), the fault counted in stats.retries. */
static void cut_wait(int how)
{
    fair_wait w;
    fair_wait_start(&w);
    redsem_client_stats st0, st1;
    OK(w.c, redsem_client_get_stats(w.c, &st0));
    char out[128] = "", num[32];
    snprintf(num, sizeof num, "%lld", w.id);
    if (how < 2)
        cr_assert_eq(ts_command(&w.srv, out, sizeof out, "CLIENT", "KILL", "ID", num, NULL), 0,
                     "%s", out);
    else
        cr_assert_eq(ts_command(&w.srv, out, sizeof out, "CLIENT", "UNBLOCK", num, "ERROR",
                                NULL),
                     0, "%s", out);
    if (how > 0) {
        long long again = until_blocked(w.l, &w.srv, how == 1 ? w.id : -1, &w.o);
        cr_assert_geq(again, 0, "no BLPOP after the fault");
        cr_assert(how == 1 || again == w.id, "UNBLOCKED: the wait connection was made again");
    }
    cr_assert_not(w.o.done, "decided while the permit was held");
    OK(w.h, redsem_permit_release(w.held));
    run_by_deadline(w.l, &w.o);
    OK(w.c, redsem_client_get_stats(w.c, &st1));
    cr_assert_geq(st1.wakeups - st0.wakeups, 1, "the wake-up came by the waiter's poll");
    cr_assert_geq(st1.retries - st0.retries, 1, "the cut BLPOP is not in the stats' retries");
    if (how == 1)
        cr_assert_geq(st1.connects - st0.connects, 1, "the wait connection was not made again");
    fair_wait_end(&w);
}

Test(loop, a_fair_wake_up_survives_a_killed_wait_connection, .timeout = 60)
{
    cut_wait(0);
}

Test(loop, a_blpop_lost_with_its_connection_is_issued_again, .timeout = 60)
{
    cut_wait(1);
}

Test(loop, an_unblocked_blpop_cuts_the_waits_and_is_issued_again, .timeout = 60)
{
    cut_wait(2);
}

/* A drain that ran but whose reply was lost with its connection (the server closes it: its
 * 300 elements of 200 bytes overflow a 1-byte output buffer limit), the fair waiter's element
 * among those it took.
 * - foreign_bell: the bell popped an element of no waiter of ours, pushed (with another to
 *   the id list, so that the release's grant_heads pushes to the id list only) before the
 *   release. The waiter's element is only in the drain: gone from the server with it, so
 *   the engine ends the fair waiters' waits at once, and the attempt finds its direct grant
 *   (with no wake-up to give, it would be its poll's, 0.75-1 s later).
 * - otherwise the bell popped the waiter's own element (a copy of the id list's first), which
 *   wakes it with its direct grant at once, the drain's reply not awaited: lost, it costs
 *   the waiter nothing.
 * Either way the drain is sent again after the pause, on a new connection (counted in
 * retries and connects). */
static void drain_lost_with_elements(bool foreign_bell)
{
    fair_wait w;
    fair_wait_start(&w);
    char out[128] = "";
    if (foreign_bell)
        cr_assert_eq(ts_command(&w.srv, out, sizeof out, "EVAL",
                                "redis.call('RPUSH', KEYS[1], 'x') "
                                "return redis.call('RPUSH', KEYS[2], 'x')",
                                "2", w.c->wake_ids, w.c->wake_bell, NULL),
                     0, "%s", out);
    OK(w.h, redsem_permit_release(w.held)); /* the bell: the BLPOP's reply, not read yet */
    cr_assert_eq(ts_command(&w.srv, out, sizeof out, "EVAL",
                            "for i=1,300 do redis.call('RPUSH', KEYS[1], string.rep('x', 200)) "
                            "end return 1",
                            "1", w.c->wake_ids, NULL),
                 0, "%s", out);
    cr_assert_eq(ts_command(&w.srv, out, sizeof out, "CONFIG", "SET",
                            "client-output-buffer-limit", "normal 1 0 0", NULL),
                 0, "%s", out);
    redsem_client_stats st0, st1;
    OK(w.c, redsem_client_get_stats(w.c, &st0));
    /* the loop's deadline now: the end of the waiter's wait (its poll) */
    redsem__loop_watch ws[REDSEM__LOOP_WATCH_MAX];
    int64_t poll_ns = 0, t0 = tf_now_ms();
    (void)redsem__loop_wants(w.l, ws, &poll_ns);
    run_by_deadline(w.l, &w.o);
    /* the lost drain and its new connection (a turn after its pause sends it again): the
     * waiter granted by the bell's element may have been done before either */
    for (int i = 0; i < 200; i++) {
        OK(w.c, redsem_client_get_stats(w.c, &st1));
        if (st1.retries > st0.retries && st1.connects > st0.connects)
            break;
        turn(w.l, 50);
    }
    /* granted before its poll was due (judged only if that was 300 ms away at least) */
    int64_t poll_ms = poll_ns / REDSEM__NS_PER_MS;
    cr_assert(poll_ms - t0 < 300 || w.o.at_ms < poll_ms,
              "granted %lld ms after the drain, by its poll (due %lld ms after)",
              (long long)(w.o.at_ms - t0), (long long)(poll_ms - t0));
    cr_assert_eq(ts_command(&w.srv, out, sizeof out, "CONFIG", "SET",
                            "client-output-buffer-limit", "normal 0 0 0", NULL),
                 0, "%s", out);
    if (foreign_bell) {
        cr_assert_eq(st1.wakeups, st0.wakeups, "woken: the drain's reply was not lost");
    } else {
        cr_assert_eq(st1.wakeups - st0.wakeups, 1, "not woken by the bell's element alone");
        cr_assert_eq(st1.direct_grants - st0.direct_grants, 1, "no direct grant");
    }
    cr_assert_geq(st1.retries - st0.retries, 1, "the lost drain is not in the stats' retries");
    cr_assert_geq(st1.connects - st0.connects, 1, "the request connection was not made again");
    fair_wait_end(&w);
}

Test(loop, a_drain_lost_with_its_elements_lets_the_fair_waiters_attempt, .timeout = 60)
{
    drain_lost_with_elements(true);
}

Test(loop, the_bells_own_element_wakes_its_waiter_before_the_drain, .timeout = 60)
{
    drain_lost_with_elements(false);
}

/* A stalled server (SIGSTOP): the pipe gives up every request in flight at the earliest
 * deadline among them, but an acquire sent later gives up at its own (one command timeout
 * after it was sent), which its not-after time was set from; both end REDSEM_EUNKNOWN. */
Test(loop, a_request_behind_a_stalled_one_gives_up_at_its_own_deadline, .timeout = 60)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, 1000, 1000);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, "stalled", REDSEM_STRATEGY_BASIC, 4, 10000, &s));
    redsem__loop *l = NULL;
    OK(c, redsem__loop_new(c, &l));
    outcome o[3] = {{0}};
    sem_start(l, s, 0, &o[0], NULL); /* connected, the script loaded */
    run_until(l, &o[0], 1);
    OK(c, o[0].rc);
    ts_server_pause(&srv, true);
    sem_start(l, s, 0, &o[1], NULL);
    int64_t t1 = tf_now_ms() + 500;
    while (tf_now_ms() < t1)
        turn(l, 20);
    int64_t sent = tf_now_ms();
    sem_start(l, s, 0, &o[2], NULL);
    run_until(l, &o[1], 2);
    ts_server_pause(&srv, false);
    for (int i = 1; i < 3; i++)
        cr_assert_eq(o[i].rc, REDSEM_EUNKNOWN, "%d: %s", i, redsem_err_name(o[i].rc));
    cr_assert_lt(o[1].at_ms, sent + 1000, "the first was not given up at its deadline");
    cr_assert_geq(o[2].at_ms, sent + 1000, "the second gave up %lld ms after it was sent",
                  (long long)(o[2].at_ms - sent));
    OK(c, redsem_permit_release(o[0].permit));
    redsem_permit_free(o[0].permit);
    redsem__loop_free(l);
    redsem_sem_free(s);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

/* A server restarted and loading its AOF (key-load-delay: ~1.5 s) answers LOADING: the
 * engine reconnects, waits on its timer and sends again within the retry window, so a try
 * on the loop finds the permit the AOF kept (REDSEM_EBUSY) and its release ends OK. */
Test(loop, a_server_loading_its_data_is_waited_for_on_the_loop, .timeout = 60)
{
    ts_server srv;
    tf_slow_loading_server(&srv);
    redsem_client *c = tf_client_for(srv.url, 4000, 0);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, "loading", REDSEM_STRATEGY_BASIC, 1, 10000, &s));
    redsem__loop *l = NULL;
    OK(c, redsem__loop_new(c, &l));
    outcome o[2] = {{0}};
    sem_start(l, s, 0, &o[0], NULL);
    run_until(l, &o[0], 1);
    OK(c, o[0].rc);
    ts_server_kill(&srv);
    tf_restarter r = {.srv = &srv, .rc = -1};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, tf_restart_later, &r), 0);
    while (!atomic_load(&r.restarted)) {
        char pong[64] = "";
        if (ts_command(&srv, pong, sizeof pong, "PING", NULL) != 0 &&
            strncmp(pong, "LOADING", 7) == 0)
            break;
        usleep(2000);
    }
    cr_assert_not(atomic_load(&r.restarted), "the load ended before the test could act");
    redsem_client_stats st0, st1;
    OK(c, redsem_client_get_stats(c, &st0));
    sem_start(l, s, 0, &o[1], NULL);
    run_until(l, &o[1], 1);
    cr_assert_eq(o[1].rc, REDSEM_EBUSY, "%s: %s", redsem_err_name(o[1].rc),
                 redsem_client_errmsg(c));
    loop_rel rel = {.p = o[0].permit};
    rel_start(l, &rel);
    run_until(l, &rel.o, 1);
    OK(c, rel.o.rc);
    OK(c, redsem_client_get_stats(c, &st1));
    cr_assert_gt(st1.retries, st0.retries, "no retry: the load was not seen");
    redsem_permit_free(o[0].permit);
    redsem__loop_free(l);
    redsem_sem_free(s);
    redsem_client_free(c);
    while (!atomic_load(&r.restarted))
        usleep(1000);
    cr_assert_eq(r.rc, 0);
    ts_server_stop(&srv);
    atomic_store(&r.done, 1);
    pthread_join(t, NULL);
}

/* ---------------------------------------------------------------- sync_replicas */



/* The WAITs srv has run (INFO commandstats). */
static long long wait_calls(ts_server *srv)
{
    char out[8192] = "";
    cr_assert_eq(ts_command(srv, out, sizeof out, "INFO", "commandstats", NULL), 0);
    const char *w = strstr(out, "cmdstat_wait:calls=");
    return w != NULL ? atoll(w + strlen("cmdstat_wait:calls=")) : 0;
}

/* A client that waits for replicas, on the loop: with its one replica up, a grant reaches
 * it (the script, then WAIT: 2 requests); many acquires started at once share their WAITs
 * (group commit: one WAIT covers the calls written before it, so far fewer WAITs than
 * grants), each granted; a client that asks for 2 replicas gets REDSEM_EREPLICA once WAIT
 * times out, and the grant is given back (no holder left), also with several acquires in
 * flight at once (they share a WAIT). */
STRATEGY_TEST(loop, waits_for_replicas_on_the_loop, .timeout = 60)
{
    ts_server prim, rep;
    cr_assert_eq(ts_server_start(&prim, NULL, true), 0);
    char port[16];
    snprintf(port, sizeof port, "%d", prim.port);
    const char *rargs[] = {"--replicaof", "127.0.0.1", port, NULL};
    cr_assert_eq(ts_server_start(&rep, rargs, false), 0);
    char out[4096] = "";
    int64_t end = tf_now_ms() + 10000;
    while (ts_command(&rep, out, sizeof out, "INFO", "replication", NULL) != 0 ||
           strstr(out, "master_link_status:up") == NULL) {
        cr_assert_lt(tf_now_ms(), end, "the replica did not sync: %s", out);
        usleep(20000);
    }
    redsem_client *one = tf_sync_client(prim.url, 1, 1500), *two = tf_sync_client(prim.url, 2, 300);
    redsem_sem *s1 = NULL, *s2 = NULL;
    OK(one, redsem_sem_open(one, "sync", strategy, 4, 10000, &s1));
    OK(two, redsem_sem_open(two, "sync", strategy, 4, 10000, &s2));
    redsem__loop *l1 = NULL, *l2 = NULL;
    OK(one, redsem__loop_new(one, &l1));
    OK(two, redsem__loop_new(two, &l2));
    outcome w = {0}, o = {0};
    sem_start(l1, s1, 0, &w, NULL); /* the script's first use: SCRIPT LOAD too */
    run_until(l1, &w, 1);
    OK(one, w.rc);
    redsem_client_stats st0, st1;
    OK(one, redsem_client_get_stats(one, &st0));
    sem_start(l1, s1, 0, &o, NULL);
    run_until(l1, &o, 1);
    OK(one, o.rc);
    OK(one, redsem_client_get_stats(one, &st1));
    uint64_t asked = strategy == REDSEM_STRATEGY_LOCKED ? 3 : 2; /* locked: its guard too */
    cr_assert_eq(st1.requests - st0.requests, asked,
                 "a synced grant is the script and WAIT: %llu requests",
                 (unsigned long long)(st1.requests - st0.requests));
    cr_assert_eq(tf_holders(s1), 2);
    enum { MANY = 24 };
    redsem_sem *sm = NULL;
    OK(one, redsem_sem_open(one, "many", strategy, MANY, 10000, &sm));
    outcome m[MANY] = {{0}};
    sem_start(l1, sm, 5000, &m[0], NULL); /* its scripts loaded: the rest as above */
    run_until(l1, m, 1);
    OK(one, m[0].rc);
    long long waits0 = wait_calls(&prim);
    for (int i = 1; i < MANY; i++)
        sem_start(l1, sm, 5000, &m[i], NULL);
    run_until(l1, m, MANY);
    long long waits = wait_calls(&prim) - waits0;
    for (int i = 1; i < MANY; i++) {
        cr_assert_eq(m[i].rc, REDSEM_OK, "%s: %s", redsem_err_name(m[i].rc),
                     redsem_client_errmsg(one));
        OK(one, redsem_permit_release(m[i].permit));
        redsem_permit_free(m[i].permit);
    }
    OK(one, redsem_permit_release(m[0].permit));
    redsem_permit_free(m[0].permit);
    /* a WAIT each would be MANY - 1 at least; shared: a few (locked: its guard lets one
     * attempt in at a time, the others try again after a pause: seldom shared, none more) */
    long long most = strategy == REDSEM_STRATEGY_LOCKED ? MANY - 1 : (MANY - 1) / 2;
    cr_assert(waits > 0 && waits <= most, "%lld WAITs for %d synced grants: not shared",
              waits, MANY - 1);
    redsem_sem_free(sm);
    outcome f[3] = {{0}};
    for (int i = 0; i < 3; i++) /* blocking: locked tries at once may find the guard taken */
        sem_start(l2, s2, 5000, &f[i], NULL);
    run_until(l2, f, 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(f[i].rc, REDSEM_EREPLICA, "%s: %s", redsem_err_name(f[i].rc),
                     redsem_client_errmsg(two));
        cr_assert_null(f[i].permit);
    }
    cr_assert(strstr(redsem_client_errmsg(two), "1 of the 2 replicas") != NULL, "%s",
              redsem_client_errmsg(two));
    cr_assert_eq(tf_holders(s1), 2, "a grant that did not reach 2 replicas was not given back");
    OK(one, redsem_permit_release(w.permit));
    OK(one, redsem_permit_release(o.permit));
    redsem_permit_free(w.permit);
    redsem_permit_free(o.permit);
    redsem__loop_free(l1);
    redsem__loop_free(l2);
    redsem_sem_free(s1);
    redsem_sem_free(s2);
    redsem_client_free(one);
    redsem_client_free(two);
    ts_server_stop(&rep);
    ts_server_stop(&prim);
}

/* Acquires started while the connection opens wait behind its handshake and go once it is
 * open: both granted. */
Test(loop, requests_sent_while_it_opens_go_once_it_is_open, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, tf_name("loopo"), REDSEM_STRATEGY_BASIC, 2, 10000, &s));
    redsem__loop *l = NULL;
    OK(c, redsem__loop_new(c, &l));
    outcome o[2] = {{0}};
    sem_start(l, s, 0, &o[0], NULL);
    sem_start(l, s, 0, &o[1], NULL);
    cr_assert(!o[0].done && !o[1].done, "decided before the loop turned");
    run_until(l, o, 2);
    OK(c, o[0].rc);
    OK(c, o[1].rc);
    for (int i = 0; i < 2; i++)
        OK(c, redsem_permit_release(o[i].permit));
    redsem_permit_free(o[0].permit);
    finish(l, s, o[1].permit);
}
