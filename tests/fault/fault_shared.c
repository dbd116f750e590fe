/* Scenario 17 (issue 10): clients shared by many threads. Two worker processes, each with 8
 * threads sharing ONE client and one semaphore or lock handle (fault-worker --threads 8; the
 * client's pool: at most 4 request connections, wait connections for BLPOP, the renewer's),
 * contend for a semaphore (limit 3) or the lock while the server suffers, in turn:
 *
 *   restart  SIGKILL and an immediate restart with AOF and appendfsync always (as S6): no
 *            permit lost, no error and no unknown outcome surfaced, tokens keep increasing;
 *   kill     CLIENT KILL TYPE normal, three times, 400 ms apart: every connection, request,
 *            wait (BLPOP) and renewal ones alike (as S12 with the default retry window): the
 *            retry window rides it out, nothing surfaces;
 *   pause    SIGSTOP of redis-server for 1200 ms, command timeout 300 ms (as S8): acquires
 *            return REDSEM_EUNKNOWN (traced as maybe-held) or REDSEM_ETIMEDOUT (the locked
 *            strategy's guard; a thread that waited for a request connection, nothing sent),
 *            refreshes and releases REDSEM_ETIMEDOUT, no other code, every call within its
 *            deadline; an acquire abandoned during the pause is not granted later than its
 *            not-after time (the moment its client gave up on it + 100 ms), as the server's
 *            holders sampled every 10 ms show (one sent in the last 400 ms of the pause may
 *            be granted on resume, as documented: held by nobody until its lease ends).
 *
 * Every run is checked as the other scenarios are: the checker's sweep line over each
 * thread's holder intervals (each thread is a holder of its own: witness slot, log), the
 * shared-memory occupancy witness, the mutex register (the lock), the server's own view
 * (status polled every 10 ms), fencing tokens increasing across the fault, quiescence.
 * Also: in the FIFO strategies (fair, locked) every thread was granted (grants per thread are
 * reported for all); one thread of each process renews in the background (holding 0.2-1.2 s,
 * beyond the lease); the first process retries an unknown outcome with the same identifier
 * (idempotent); each process forks a child while its threads contend (every call on the
 * inherited handles must say REDSEM_EFORKED, and freeing them must return); the threads did
 * share the client's connections (pool_waits + pipelined > 0); no worker has to be killed at the
 * end (nothing hangs). About 90 s on the 2-core machine. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define LEASE_MS 1000
#define PROCS 2
#define THREADS 8
#define TIMEOUT_MS 2000      /* each blocking acquire's */
#define PAUSE_MS 1200
#define PAUSE_CMD_TIMEOUT_MS 300
/* Scheduling on 2 busy cores, 18 threads; and a shared client's last attempt may first wait
 * for a request connection (up to another command timeout: see the test at the end, which
 * fails on that, and docs/guarantees.md) */
#define DEADLINE_SLACK_MS 500

enum fault { RESTART, KILL, PAUSE };
static const char *const fault_names[] = {"restart", "kill", "pause"};

static const char *const aof_args[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};

typedef struct window {
    int64_t begin, end; /* the fault, runner's clock */
} window;

static void restart_server(fh_run *r, window *w)
{
    w->begin = fw_now_ns();
    fh_fault(r, "server-kill", true);
    ts_server_kill(&r->srv);
    cr_assert_eq(ts_server_restart(&r->srv), 0, "restart failed");
    w->end = fw_now_ns();
    fh_fault(r, "server-up", false);
}

static void kill_clients(fh_run *r, window *w)
{
    w->begin = fw_now_ns();
    for (int k = 0; k < 3; k++) {
        if (k > 0)
            fw_sleep_ns(400 * 1000000LL);
        fh_fault(r, "client-kill", true);
        char reply[64] = "";
        ts_command(&r->srv, reply, sizeof reply, "CLIENT", "KILL", "TYPE", "normal", "SKIPME",
                   "yes", NULL);
        fh_note(r, "client-kill-%d-killed-%s", k, reply);
        fh_fault(r, "client-kill", false);
    }
    w->end = fw_now_ns();
}

static void pause_server(fh_run *r, window *w)
{
    w->begin = fw_now_ns();
    fh_fault(r, "server-sigstop", true);
    ts_server_pause(&r->srv, true);
    fw_sleep_ns(PAUSE_MS * 1000000LL);
    ts_server_pause(&r->srv, false);
    w->end = fw_now_ns();
    fh_fault(r, "server-sigcont", false);
}

/* Grants per thread (slot), over the whole run. */
static void grants_per_thread(const fw_event *ev, size_t n, int nslots, int *min, int *max)
{
    int cnt[FW_MAX_SLOTS] = {0};
    for (size_t i = 0; i < n; i++)
        if (ev[i].ev == EV_ACQ && ev[i].slot >= 0 && ev[i].slot < nslots)
            cnt[ev[i].slot]++;
    *min = INT32_MAX;
    *max = 0;
    for (int s = 0; s < nslots; s++) {
        if (cnt[s] < *min)
            *min = cnt[s];
        if (cnt[s] > *max)
            *max = cnt[s];
    }
}

/* Unknown outcomes retried with the same identifier (--same-id-after-unknown) and granted. */
static size_t unknown_then_granted(const fw_event *ev, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].ev == EV_UNK)
            for (size_t j = i + 1; j < n; j++)
                if (ev[j].ev == EV_ACQ && strcmp(ev[j].id, ev[i].id) == 0) {
                    k++;
                    break;
                }
    return k;
}

static bool id_acquired(const fw_event *ev, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (ev[i].ev == EV_ACQ && strcmp(ev[i].id, id) == 0)
            return true;
    return false;
}

/* Not-after: an acquire abandoned with REDSEM_EUNKNOWN (and never retried with its id) may
 * have been granted only before its not-after time, the moment its client gave up on it
 * (the event's time) + 100 ms, by the server's clock. The server's holders sampled every
 * 10 ms show when it was granted: sample time - (lease - the remaining lease). Returns how
 * many were granted later than that (+ NOT_AFTER_SLACK_MS), e.g. when the server resumed. */
#define NOT_AFTER_SLACK_MS 50
static size_t abandoned_granted(fh_run *r, const fw_event *ev, size_t n, size_t *abandoned,
                                size_t *granted)
{
    size_t late = 0;
    *abandoned = *granted = 0;
    size_t ns = atomic_load(&r->nsamples);
    for (size_t i = 0; i < n; i++) {
        if (ev[i].ev != EV_UNK || id_acquired(ev, n, ev[i].id))
            continue;
        (*abandoned)++;
        int64_t not_after = ev[i].t_ns + (100 + NOT_AFTER_SLACK_MS) * 1000000LL;
        for (size_t k = 0; k < ns; k++) {
            if (strcmp(r->samples[k].id, ev[i].id) != 0)
                continue;
            int64_t granted_at = r->samples[k].t_ns -
                                 (r->lease_ms - r->samples[k].remaining_ms) * 1000000LL;
            (*granted)++;
            if (granted_at > not_after) {
                fprintf(stderr, "  abandoned acquire %s (slot %d) granted about %lld ms after "
                                "its client gave up on it\n",
                        ev[i].id, ev[i].slot, (long long)((granted_at - ev[i].t_ns) / 1000000));
                late++;
            }
            break;
        }
    }
    return late;
}

static void shared(fw_kind kind, enum fault fault)
{
    fh_run r;
    char label[64];
    snprintf(label, sizeof label, "shared-%s-%s", fault_names[fault], fw_kind_name(kind));
    uint32_t limit = kind == FW_LOCK ? 1 : 3;
    fh_setup(&r, label, kind, limit, LEASE_MS, fault == RESTART ? aof_args : NULL, false);
    fh_monitor_start(&r, 10, fault == PAUSE);
    char cmd_timeout[16];
    snprintf(cmd_timeout, sizeof cmd_timeout, "%d", PAUSE_CMD_TIMEOUT_MS);
    /* threads 0 and 1 of each process renew, holding 0.2-1.2 s; the others hold 5-50 ms */
    const char *args[PROCS][32];
    for (int p = 0; p < PROCS; p++) {
        int n = 0;
        const char *common[] = {"--hold-min-us", "5000", "--hold-max-us", "50000",
                                "--renew-threads", "1", "--renew-hold-min-us", "200000",
                                "--renew-hold-max-us", "1200000", "--timeout-ms", "2000",
                                "--fork-probe-ms", "700", NULL};
        for (int i = 0; common[i]; i++)
            args[p][n++] = common[i];
        if (p == 0)
            args[p][n++] = "--same-id-after-unknown";
        if (limit == 1)
            args[p][n++] = "--register";
        if (fault == PAUSE) {
            args[p][n++] = "--cmd-timeout-ms";
            args[p][n++] = cmd_timeout;
        }
        args[p][n] = NULL;
    }
    for (int p = 0; p < PROCS; p++)
        fh_spawn_threads(&r, NULL, THREADS, args[p]);
    cr_assert_neq(fh_wait_full(&r, -1, fw_now_ns(), 5000), -1,
                  "the threads never filled the permits");
    fw_sleep_ns(1500 * 1000000LL);
    window w;
    if (fault == RESTART)
        restart_server(&r, &w);
    else if (fault == KILL)
        kill_clients(&r, &w);
    else
        pause_server(&r, &w);
    int64_t rec = fh_wait_full(&r, -1, w.end, 5000);
    fw_sleep_ns(2000 * 1000000LL);
    int killed = fh_finish(&r, 8000);
    fh_monitor_stop(&r);

    fw_check_result res;
    fh_check(&r, &res);
    fw_event *ev = NULL;
    ssize_t nev = fw_logs_read(r.dir, &ev);
    cr_assert_geq(nev, 0);
    size_t n = (size_t)nev;
    int gmin, gmax;
    grants_per_thread(ev, n, r.nslots, &gmin, &gmax);
    /* the forked children, the pool's counters, resends */
    int forks = 0, forks_good = 0;
    long long pool_waits = 0, connects = 0, retries = 0, pipelined = 0;
    uint64_t max_before = 0, min_after = UINT64_MAX;
    int64_t worst_call_ms = 0;
    size_t bad_codes = 0;
    for (size_t i = 0; i < n; i++) {
        const fw_event *e = &ev[i];
        if (e->ev == EV_NOTE && strcmp(e->id, "fork") == 0) {
            forks++;
            forks_good += e->rc == 0;
        } else if (e->ev == EV_NOTE && strcmp(e->id, "pool") == 0) {
            pool_waits += (long long)e->token;
            connects += e->a;
            pipelined += e->b;
        } else if (e->ev == EV_STATS) {
            retries += e->rc;
        } else if (e->ev == EV_ACQ) {
            if (e->t_ns < w.begin && e->token > max_before)
                max_before = e->token;
            if (e->t_ns > w.end && e->token < min_after)
                min_after = e->token;
        } else if (e->ev == EV_UNK || (e->ev == EV_ERR && e->a > 0 && e->t_ns > e->a)) {
            /* an acquire that ended without an answer: within its deadline */
            int64_t ms = (e->t_ns - e->a) / 1000000;
            if (ms > worst_call_ms)
                worst_call_ms = ms;
        }
        if (e->ev == EV_ERR && !(fault == PAUSE && e->rc == REDSEM_ETIMEDOUT))
            bad_codes++;
        if (e->ev == EV_REL && e->rc != REDSEM_OK && e->rc != REDSEM_ELOST &&
            !(fault == PAUSE && e->rc == REDSEM_ETIMEDOUT))
            bad_codes++;
        if (e->ev == EV_RFR && e->rc != REDSEM_ELOST && e->rc != REDSEM_ESTATE &&
            !(fault == PAUSE && e->rc == REDSEM_ETIMEDOUT))
            bad_codes++;
    }
    size_t retried_granted = unknown_then_granted(ev, n);
    size_t abandoned = 0, ab_granted = 0;
    size_t late = fault == PAUSE ? abandoned_granted(&r, ev, n, &abandoned, &ab_granted) : 0;
    free(ev);
    fprintf(stderr,
            "SCENARIO 17 %s: %d processes x %d threads sharing a client; fault %lld ms; "
            "grants %zu (per thread %d..%d), violations %zu (witness %d), server max holders "
            "%d/%u, unknown %zu (max with maybe-held %d), errors %zu, lost %zu, release "
            "ok/lost/err %zu/%zu/%zu; capacity back %lld ms after the fault; resends %lld, "
            "pool waits %lld (pipelined %lld), connects %lld; forked children good %d/%d; "
            "abandoned acquires %zu, granted (in time) %zu, granted after their not-after "
            "time %zu; unknown outcomes retried with the same id and granted %zu; slowest "
            "unanswered call %lld ms; tokens before %llu < after %llu; killed at the end %d\n",
            label, PROCS, THREADS, (long long)((w.end - w.begin) / 1000000), res.acq, gmin,
            gmax, res.violations, atomic_load(&r.sh->nviol), atomic_load(&r.mon_max_holders),
            limit, res.unknown, res.max_with_maybe, res.errors, res.lost, res.rel_ok,
            res.rel_lost, res.rel_err, rec < 0 ? -1LL : (long long)(rec / 1000000), retries,
            pool_waits, pipelined, connects, forks_good, forks, abandoned, ab_granted, late,
            retried_granted,
            (long long)worst_call_ms,
            (unsigned long long)max_before, (unsigned long long)min_after, killed);

    /* every promise the single-threaded scenarios check */
    cr_expect_eq(res.violations, 0, "checker: %zu violations", res.violations);
    cr_expect_eq(atomic_load(&r.sh->nviol), 0, "witness: %d violations",
                 atomic_load(&r.sh->nviol));
    cr_expect_leq(atomic_load(&r.mon_max_holders), (int)limit);
    cr_expect_eq(atomic_load(&r.sh->max_occupancy) >= (int)limit, 1, "never full: under-grant");
    if (limit == 1)
        cr_expect_eq(r.sh->reg, atomic_load(&r.sh->reg_sections), "the mutex register lost "
                     "an update: %llu / %llu", (unsigned long long)r.sh->reg,
                     (unsigned long long)atomic_load(&r.sh->reg_sections));
    cr_expect_geq(rec, 0, "the capacity never came back after the fault");
    cr_expect_gt(min_after, max_before, "a token after the fault is not above those before");
    if (kind == FW_FAIR || kind == FW_LOCKED) /* FIFO: nobody starves */
        cr_expect_gt(gmin, 0, "a thread was never granted");
    cr_expect_eq(forks, PROCS, "%d of %d processes forked", forks, PROCS);
    cr_expect_eq(forks_good, forks, "a forked child did not get REDSEM_EFORKED everywhere");
    cr_expect_eq(killed, 0, "%d workers did not finish", killed);
    cr_expect_eq(bad_codes, 0, "%zu calls returned a code this fault does not allow", bad_codes);
    cr_expect_gt(pool_waits + pipelined, 0, "no thread ever waited for a request connection "
                 "or sent beside another thread's call in flight: the threads did not share "
                 "the client's connections");
    if (fault == RESTART || fault == KILL) {
        /* the retry window rides it out: nothing surfaces, nothing is lost */
        cr_expect_eq(res.errors, 0, "%zu errors surfaced", res.errors);
        cr_expect_eq(res.unknown, 0, "%zu unknown outcomes", res.unknown);
        cr_expect_eq(res.lost, 0, "%zu permits lost", res.lost);
        cr_expect_eq(res.rel_lost + res.rel_err, 0);
        cr_expect_gt(retries, 0, "no request was re-sent: the fault hit nothing in flight");
    } else {
        cr_expect_gt(res.unknown + res.errors, 0, "the pause surfaced nothing: it proves nothing");
        cr_expect_eq(late, 0, "%zu acquires abandoned during the pause were granted after their "
                     "not-after time",
                     late);
        cr_expect_leq(worst_call_ms, TIMEOUT_MS + PAUSE_CMD_TIMEOUT_MS + DEADLINE_SLACK_MS,
                      "an acquire returned after %lld ms", (long long)worst_call_ms);
    }
    fh_quiescence(&r);
    fh_teardown(&r);
}

Test(shared, restart_basic, .timeout = 60) { shared(FW_BASIC, RESTART); }
Test(shared, restart_fair, .timeout = 60) { shared(FW_FAIR, RESTART); }
Test(shared, restart_locked, .timeout = 60) { shared(FW_LOCKED, RESTART); }
Test(shared, restart_lock, .timeout = 60) { shared(FW_LOCK, RESTART); }
Test(shared, client_kill_basic, .timeout = 60) { shared(FW_BASIC, KILL); }
Test(shared, client_kill_fair, .timeout = 60) { shared(FW_FAIR, KILL); }
Test(shared, client_kill_locked, .timeout = 60) { shared(FW_LOCKED, KILL); }
Test(shared, client_kill_lock, .timeout = 60) { shared(FW_LOCK, KILL); }
Test(shared, pause_basic, .timeout = 60) { shared(FW_BASIC, PAUSE); }
Test(shared, pause_fair, .timeout = 60) { shared(FW_FAIR, PAUSE); }
Test(shared, pause_locked, .timeout = 60) { shared(FW_LOCKED, PAUSE); }
Test(shared, pause_lock, .timeout = 60) { shared(FW_LOCK, PAUSE); }

/* Found by scenario 17 (pause_lock, every run): a blocking acquire that reached its deadline
 * while the server was stalled returned up to two command timeouts after it (2,525-2,600 ms
 * for a 2,000 ms timeout, command timeout 300 ms), where redsem_sem_acquire() promises "by
 * its deadline plus a few ms (one reconnect and one round trip at most)". Its wait (BLPOP)
 * is cut at the deadline on the client's side; then its last attempt (leave the queue) first
 * waits for a request connection, all of them busy with other threads' requests to the
 * stalled server (up to a command timeout), then waits for its own reply (another one).
 * Reproduced with one request connection, command timeout 500 ms: thread A waits for the
 * lock (800 ms), the server is stopped at 500 ms, thread B's ping takes the only request
 * connection at 700 ms (until 1,200 ms); A's last attempt must still end within its deadline
 * + one command timeout + slack (1,450 ms). The same without B's ping is the control. */
#define DL_CMD_TIMEOUT_MS 500
#define DL_SLACK_MS 150

typedef struct dl_waiter {
    redsem_lock *l;
    int rc;
    int64_t ms;
} dl_waiter;

static void *dl_wait(void *arg)
{
    dl_waiter *x = arg;
    redsem_permit *p = NULL;
    int64_t t0 = fw_now_ns();
    x->rc = redsem_lock_acquire(x->l, 800, &p);
    x->ms = (fw_now_ns() - t0) / 1000000;
    if (p) {
        (void)redsem_permit_release(p);
        redsem_permit_free(p);
    }
    return NULL;
}

static void deadline_case(bool other_thread)
{
    fh_run r;
    fh_setup(&r, "shared-deadline", FW_LOCK, 1, 10000, NULL, false);
    redsem_client *h = fh_client(r.srv.url, -1, -1);
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, r.srv.url), REDSEM_OK);
    cr_assert_eq(redsem_options_set_command_timeout_ms(o, DL_CMD_TIMEOUT_MS), REDSEM_OK);
    cr_assert_eq(redsem_options_set_max_connections(o, 1), REDSEM_OK);
    redsem_client *c = NULL;
    cr_assert_eq(redsem_client_new(o, &c), REDSEM_OK);
    redsem_options_free(o);
    redsem_sem *hs = NULL, *s = NULL;
    redsem_lock *hl = NULL, *l = NULL;
    fh_open(&r, h, &hs, &hl);
    fh_open(&r, c, &s, &l);
    redsem_permit *hp = NULL, *warm = NULL;
    cr_assert_eq(redsem_lock_try_acquire(l, &warm), REDSEM_OK); /* scripts loaded */
    cr_assert_eq(redsem_permit_release(warm), REDSEM_OK);
    redsem_permit_free(warm);
    cr_assert_eq(redsem_lock_try_acquire(hl, &hp), REDSEM_OK); /* the lock stays taken */
    dl_waiter x = {.l = l};
    pthread_t t;
    int64_t t0 = fw_now_ns();
    cr_assert_eq(pthread_create(&t, NULL, dl_wait, &x), 0);
    fw_sleep_until_ns(t0 + 500 * 1000000LL);
    ts_server_pause(&r.srv, true);
    fw_sleep_until_ns(t0 + 700 * 1000000LL);
    /* holds the only request connection 700-1,200 ms */
    int rc_ping = other_thread ? redsem_client_ping(c) : REDSEM_ETIMEDOUT;
    pthread_join(t, NULL);
    ts_server_pause(&r.srv, false);
    redsem_client_stats st;
    redsem_client_get_stats(c, &st);
    fprintf(stderr, "SHARED DEADLINE (%s): acquire(800 ms) on a stalled server returned %s after "
                    "%lld ms (bound %d); the other thread's ping %s; pool waits %llu\n",
            other_thread ? "another thread's ping" : "alone", redsem_err_name(x.rc),
            (long long)x.ms, 800 + DL_CMD_TIMEOUT_MS + DL_SLACK_MS,
            redsem_err_name(rc_ping), (unsigned long long)st.pool_waits);
    cr_expect_eq(rc_ping, REDSEM_ETIMEDOUT);
    cr_expect(x.rc == REDSEM_EUNKNOWN || x.rc == REDSEM_ETIMEDOUT || x.rc == REDSEM_EBUSY,
              "acquire: %s", redsem_err_name(x.rc));
    cr_expect_leq(x.ms, 800 + DL_CMD_TIMEOUT_MS + DL_SLACK_MS,
                  "a blocking acquire returned %lld ms after its start, %lld ms after its "
                  "deadline (command timeout %d ms)",
                  (long long)x.ms, (long long)x.ms - 800, DL_CMD_TIMEOUT_MS);
    redsem_permit_release(hp);
    redsem_permit_free(hp);
    redsem_lock_free(l);
    redsem_lock_free(hl);
    redsem_client_free(c);
    redsem_client_free(h);
    fh_teardown(&r);
}

Test(shared, blocking_acquire_alone_ends_within_one_command_timeout_of_its_deadline,
     .timeout = 60)
{
    deadline_case(false);
}

Test(shared, blocking_acquire_ends_within_one_command_timeout_of_its_deadline, .timeout = 60)
{
    deadline_case(true);
}

/* Found by scenario 17 (restart_lock on 2 busy cores: 6 calls returned REDSEM_ECONN across a
 * ~400 ms restart): a call behind another on the connection had its retry window after a
 * lost connection cut by its first attempt's command timeout. Since 0.7 the calls share one
 * connection, many in flight: with command timeout 1000 ms and retry window 2000 ms, the
 * server is stopped at 0; thread B's PING goes out at 0 and thread A's try-acquire at 500 ms,
 * written behind it (in flight together: stats.pipelined); the server is killed at 700 ms
 * (both requests are lost with the connection: their retry window opens, to 2700 ms) and
 * restarted at 1750 ms, past both first attempts' deadlines (1000 and 1500 ms). Both must
 * succeed on the restarted server (cut by the first attempt: B REDSEM_ECONN at 1000 ms, A
 * REDSEM_EUNKNOWN at 1500 ms). */
typedef struct rw_caller {
    redsem_client *c;
    redsem_lock *l;
    int rc;
    int64_t start_ns, ms;
    char why[256];
} rw_caller;

static void *rw_ping(void *arg)
{
    rw_caller *x = arg;
    x->rc = redsem_client_ping(x->c);
    return NULL;
}

static void *rw_acquire(void *arg)
{
    rw_caller *x = arg;
    redsem_permit *p = NULL;
    fw_sleep_until_ns(x->start_ns);
    x->rc = redsem_lock_try_acquire(x->l, &p);
    x->ms = (fw_now_ns() - x->start_ns) / 1000000;
    snprintf(x->why, sizeof x->why, "%s", redsem_client_errmsg(x->c));
    if (p) {
        (void)redsem_permit_release(p);
        redsem_permit_free(p);
    }
    return NULL;
}

Test(shared, a_call_behind_another_keeps_its_retry_window, .timeout = 60)
{
    fh_run r;
    fh_setup(&r, "shared-wait-retry", FW_LOCK, 1, 10000, NULL, false);
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, r.srv.url), REDSEM_OK);
    cr_assert_eq(redsem_options_set_command_timeout_ms(o, 1000), REDSEM_OK);
    cr_assert_eq(redsem_options_set_retry_ms(o, 2000), REDSEM_OK);
    cr_assert_eq(redsem_options_set_max_connections(o, 1), REDSEM_OK);
    redsem_client *c = NULL;
    cr_assert_eq(redsem_client_new(o, &c), REDSEM_OK);
    redsem_options_free(o);
    redsem_sem *s = NULL;
    redsem_lock *l = NULL;
    fh_open(&r, c, &s, &l);
    redsem_permit *warm = NULL;
    cr_assert_eq(redsem_lock_try_acquire(l, &warm), REDSEM_OK); /* connected, scripts loaded */
    cr_assert_eq(redsem_permit_release(warm), REDSEM_OK);
    redsem_permit_free(warm);
    int64_t t0 = fw_now_ns();
    rw_caller b = {.c = c}, a = {.c = c, .l = l, .start_ns = t0 + 500 * 1000000LL};
    ts_server_pause(&r.srv, true);
    pthread_t tb, ta;
    cr_assert_eq(pthread_create(&tb, NULL, rw_ping, &b), 0);
    cr_assert_eq(pthread_create(&ta, NULL, rw_acquire, &a), 0);
    fw_sleep_until_ns(t0 + 700 * 1000000LL);
    ts_server_kill(&r.srv);
    fw_sleep_until_ns(t0 + 1750 * 1000000LL);
    cr_assert_eq(ts_server_restart(&r.srv), 0, "restart failed");
    int64_t up_ms = (fw_now_ns() - t0) / 1000000;
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    redsem_client_stats st;
    redsem_client_get_stats(c, &st);
    fprintf(stderr, "SHARED RETRY BEHIND ANOTHER: the ping %s; the try-acquire behind it %s "
                    "after %lld ms (server back at %lld ms); pipelined %llu, retries %llu\n",
            redsem_err_name(b.rc), redsem_err_name(a.rc), (long long)a.ms, (long long)up_ms,
            (unsigned long long)st.pipelined, (unsigned long long)st.retries);
    cr_expect_eq(b.rc, REDSEM_OK, "the ping: %s", redsem_err_name(b.rc));
    cr_expect_eq(a.rc, REDSEM_OK, "the call behind it: %s after %lld ms (%s)",
                 redsem_err_name(a.rc), (long long)a.ms, a.why);
    cr_expect_gt(st.pipelined, 0, "the call was not in flight behind the ping: proves nothing");
    cr_expect_gt(st.retries, 1, "neither call was retried: proves nothing");
    redsem_lock_free(l);
    redsem_client_free(c);
    fh_teardown(&r);
}
