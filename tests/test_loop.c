/* White-box tests of the event-loop driver of acquires (src/drive_loop.c): acquires stepped by
 * a poll() loop on the test's own thread, linked with the internal archive and run against
 * the suite's private redis-server. */
#include <dirent.h>
#include <poll.h>
#include <string.h>

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
} outcome;

static void on_done(void *arg, int rc, redsem_permit *p)
{
    outcome *o = arg;
    cr_assert_not(o->done, "called back twice");
    o->done = true;
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
    OK(s->client, redsem__loop_acquire(l, &q, kind, id, timeout_ms, s->lease_ms, on_done, o,
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
    atomic_store(cancel, true);
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
        OK(c, redsem__loop_acquire(l, &q, kind, id, 0, k->lease_ms, on_done, &o[i], NULL));
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
