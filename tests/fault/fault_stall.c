/* Scenario 8, a stalled server: DEBUG SLEEP longer than the command timeout, and SIGSTOP of
 * redis-server. Every call returns by its deadline (command timeout + scheduling slack) with
 * the documented code: refresh, release, status and ping REDSEM_ETIMEDOUT; an acquire
 * REDSEM_EUNKNOWN (the locked strategy: REDSEM_ETIMEDOUT when it is the guard's SET that got
 * no reply, since the guard alone grants nothing; any acquire: REDSEM_ETIMEDOUT when the
 * reconnect after an earlier timeout got no reply to its handshake, INFO memory, so that the
 * acquire was never sent); nothing hangs; service resumes after.
 * The acquire abandoned during the stall was already in the server's socket: it must not be
 * applied when the server resumes (it carries a not-after time on the server's clock). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

#include "harness.h"

#define LEASE_MS 5000
#define CMD_TIMEOUT_MS 300
#define STALL_S "3"
#define SLACK_MS 150

static void *sleeper(void *arg)
{
    ts_server *srv = arg;
    ts_command(srv, NULL, 0, "DEBUG", "SLEEP", STALL_S, NULL);
    return NULL;
}

typedef struct timed {
    const char *what;
    int rc;
    int64_t ms;
} timed;

static int64_t since(int64_t t0)
{
    return (fw_now_ns() - t0) / 1000000;
}

static void stall(fw_kind kind, bool sigstop)
{
    fh_run r;
    char label[64];
    snprintf(label, sizeof label, "stall-%s-%s", sigstop ? "sigstop" : "debug-sleep",
             fw_kind_name(kind));
    fh_setup(&r, label, kind, 2, LEASE_MS, NULL, false);
    redsem_client *c = fh_client(r.srv.url, -1, CMD_TIMEOUT_MS);
    redsem_sem *s = NULL;
    redsem_lock *l = NULL;
    fh_open(&r, c, &s, &l);
    redsem_permit *p = NULL, *q = NULL, *w = NULL;
    cr_assert_eq(fh_acquire(s, l, 0, &p), REDSEM_OK);
    cr_assert_eq(redsem_permit_refresh(p), REDSEM_OK); /* every script used below is loaded */
    if (s) {
        cr_assert_eq(fh_acquire(s, l, 0, &w), REDSEM_OK);
        cr_assert_eq(redsem_permit_release(w), REDSEM_OK);
        redsem_permit_free(w);
        w = NULL;
    }
    redsem_status *st = NULL;
    cr_assert_eq(fh_status(s, l, &st), REDSEM_OK);
    redsem_status_free(st);

    pthread_t t;
    if (sigstop) {
        ts_server_pause(&r.srv, true);
    } else {
        cr_assert_eq(pthread_create(&t, NULL, sleeper, &r.srv), 0);
        fw_sleep_ns(50 * 1000000LL); /* the DEBUG SLEEP is running */
    }
    int64_t t_stall = fw_now_ns();
    timed res[8];
    char msgs[8][512] = {{0}}; /* the acquires' messages */
    int n = 0;
    char id[REDSEM_ID_BUFSIZE];
    redsem_id_generate(id);
    int64_t t0 = fw_now_ns();
    res[n++] = (timed){"ping", redsem_client_ping(c), since(t0)};
    t0 = fw_now_ns();
    res[n++] = (timed){"refresh", redsem_permit_refresh(p), since(t0)};
    t0 = fw_now_ns();
    res[n++] = (timed){"status", fh_status(s, l, &st), since(t0)};
    t0 = fw_now_ns();
    res[n++] = (timed){"try-acquire",
                       s ? redsem_sem_acquire_as(s, id, 0, &q) : redsem_lock_acquire_as(l, id, 0, &q),
                       since(t0)};
    snprintf(msgs[n - 1], sizeof msgs[n - 1], "%s", redsem_client_errmsg(c));
    t0 = fw_now_ns();
    res[n++] = (timed){"acquire(1 s)", fh_acquire(s, l, 1000, &w), since(t0)};
    snprintf(msgs[n - 1], sizeof msgs[n - 1], "%s", redsem_client_errmsg(c));
    t0 = fw_now_ns();
    res[n++] = (timed){"release", redsem_permit_release(p), since(t0)};
    int64_t stalled_for = since(t_stall);
    cr_assert_lt(stalled_for, 2900, "the calls outlived the stall: the test proves nothing");
    if (sigstop)
        ts_server_pause(&r.srv, false);
    else
        pthread_join(t, NULL);
    int64_t t_resume = fw_now_ns();
    for (int i = 0; i < n; i++) {
        bool acquire = strstr(res[i].what, "acquire") != NULL;
        bool not_sent = res[i].rc == REDSEM_ETIMEDOUT && strstr(msgs[i], "was not sent");
        bool ok = acquire ? res[i].rc == REDSEM_EUNKNOWN || not_sent ||
                                (kind == FW_LOCKED && res[i].rc == REDSEM_ETIMEDOUT)
                          : res[i].rc == REDSEM_ETIMEDOUT;
        cr_expect(ok, "%s during the stall returned %s (%s)", res[i].what,
                  redsem_err_name(res[i].rc), msgs[i]);
        cr_expect_leq(res[i].ms, CMD_TIMEOUT_MS + SLACK_MS, "%s took %lld ms", res[i].what,
                      (long long)res[i].ms);
    }
    /* Service resumes. The requests abandoned during the stall were already in the server's
     * socket: when it resumes it may still run them (the release of p, the try-acquire for
     * id), in an order of its own. Find out, clean up, then a fresh acquire must succeed. */
    int64_t t1 = fw_now_ns();
    int rc_ping = redsem_client_ping(c);
    char ping_msg[512];
    snprintf(ping_msg, sizeof ping_msg, "%s", redsem_client_errmsg(c));
    int rc_ref = redsem_permit_refresh(p);
    cr_expect(rc_ref == REDSEM_OK || rc_ref == REDSEM_ELOST, "refresh after the stall: %s",
              redsem_err_name(rc_ref));
    if (rc_ref == REDSEM_OK)
        cr_expect_eq(redsem_permit_release(p), REDSEM_OK);
    bool applied = false;
    cr_assert_eq(fh_status(s, l, &st), REDSEM_OK);
    for (size_t i = 0; i < redsem_status_holders_listed(st); i++) {
        const char *hid;
        redsem_status_holder(st, i, &hid, NULL, NULL);
        applied |= strcmp(hid, id) == 0;
    }
    redsem_status_free(st);
    cr_expect_not(applied, "the try-acquire abandoned during the stall was applied when the "
                           "server resumed, after its not-after time");
    if (applied) { /* the caller was told "unknown": acquiring again with the id finds it */
        redsem_permit *z = NULL;
        int rc = s ? redsem_sem_acquire_as(s, id, 2000, &z) : redsem_lock_acquire_as(l, id, 2000, &z);
        cr_expect_eq(rc, REDSEM_OK, "re-acquire of the unknown outcome: %s", redsem_err_name(rc));
        if (z) {
            cr_expect_eq(redsem_permit_release(z), REDSEM_OK);
            redsem_permit_free(z);
        }
    }
    redsem_permit *x = NULL;
    int64_t t2 = fw_now_ns();
    int rc_acq = fh_acquire(s, l, 3000, &x);
    int64_t acq_ms = since(t2), resume_ms = since(t1);
    cr_expect_eq(rc_ping, REDSEM_OK, "the first ping after the stall: %s (%s)",
                 redsem_err_name(rc_ping), ping_msg);
    cr_expect_eq(rc_acq, REDSEM_OK, "acquire after the stall: %s", redsem_err_name(rc_acq));
    /* the locked strategy's guard, left by an abandoned attempt, expires after 1 s */
    cr_expect_leq(acq_ms, kind == FW_LOCKED ? 1000 + 250 : 250, "acquire after the stall took "
                  "%lld ms", (long long)acq_ms);
    fprintf(stderr, "SCENARIO 8 %s: during a %s s stall (command timeout %d ms):", label,
            STALL_S, CMD_TIMEOUT_MS);
    for (int i = 0; i < n; i++)
        fprintf(stderr, " %s=%s/%lldms", res[i].what, redsem_err_name(res[i].rc),
                (long long)res[i].ms);
    fprintf(stderr, "; after it: ping=%s, refresh of the old permit=%s, fresh acquire=%s in "
                    "%lld ms (all in %lld ms); the try-acquire abandoned during the stall %s "
                    "applied when the server resumed (%lld ms after it timed out)\n",
            redsem_err_name(rc_ping), redsem_err_name(rc_ref), redsem_err_name(rc_acq),
            (long long)acq_ms, (long long)resume_ms, applied ? "WAS" : "was not",
            (long long)((t_resume - t_stall) / 1000000 - res[0].ms));
    if (x) {
        redsem_permit_release(x);
        redsem_permit_free(x);
    }
    redsem_permit_free(p);
    redsem_permit_free(q);
    redsem_permit_free(w);
    redsem_sem_free(s);
    redsem_lock_free(l);
    redsem_client_free(c);
    fh_teardown(&r);
}

Test(stall, debug_sleep_basic, .timeout = 60) { stall(FW_BASIC, false); }
Test(stall, debug_sleep_fair, .timeout = 60) { stall(FW_FAIR, false); }
Test(stall, debug_sleep_locked, .timeout = 60) { stall(FW_LOCKED, false); }
Test(stall, debug_sleep_lock, .timeout = 60) { stall(FW_LOCK, false); }
Test(stall, sigstop_basic, .timeout = 60) { stall(FW_BASIC, true); }
Test(stall, sigstop_fair, .timeout = 60) { stall(FW_FAIR, true); }
Test(stall, sigstop_locked, .timeout = 60) { stall(FW_LOCKED, true); }
Test(stall, sigstop_lock, .timeout = 60) { stall(FW_LOCK, true); }

/* Replies delayed 300 ms by a proxy, lease 1000 ms (issue 14): the validity a caller holds
 * when its acquire returns. Every strategy counts validity from when the granting request was
 * sent, so what is left on return is the lease minus the drift margin minus the time from
 * that send to the return. The locked strategy sends the guard first and the granting script
 * second, and returns with the grant's reply (the script deletes the guard): it must hold
 * within 5 % of the fair strategy's validity (before, a trailing guard release left it 386 ms
 * against fair's 687). A ratio within one run, with a delay far above scheduling noise. */
Test(stall, locked_validity_with_delayed_replies, .timeout = 60)
{
    fh_run r;
    fh_setup(&r, "delayed-replies", FW_FAIR, 1, 1000, NULL, true);
    fp_proxy *px = fp_proxy_start(r.srv.port);
    cr_assert_not_null(px);
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", fp_proxy_port(px));
    redsem_client *c = fh_client(url, -1, 5000);
    fp_proxy_set_reply_delay_ms(px, 300);
    int64_t validity[4] = {0};
    for (int k = 1; k <= 3; k++) {
        char name[32];
        snprintf(name, sizeof name, "delayed-%d", k);
        redsem_sem *s = NULL;
        cr_assert_eq(redsem_sem_open(c, name, (redsem_strategy)k, 1, 1000, &s), REDSEM_OK);
        redsem_permit *p = NULL;
        int rc = redsem_sem_try_acquire(s, &p);
        validity[k] = redsem_permit_validity_ms(p);
        cr_assert_eq(rc, REDSEM_OK, "%s: %s (%s)", redsem_strategy_name(k), redsem_err_name(rc),
                     redsem_client_errmsg(c));
        cr_assert_eq(redsem_permit_release(p), REDSEM_OK);
        redsem_permit_free(p);
        redsem_sem_free(s);
    }
    fprintf(stderr, "DELAYED REPLIES (300 ms, lease 1000 ms): validity on return basic %lld ms, "
                    "fair %lld ms, locked %lld ms (locked / fair %.2f)\n",
            (long long)validity[1], (long long)validity[2], (long long)validity[3],
            (double)validity[3] / (double)validity[2]);
    cr_expect_geq(validity[3] * 100, validity[2] * 95,
                  "locked validity %lld ms is not within 5 %% of fair's %lld ms",
                  (long long)validity[3], (long long)validity[2]);
    redsem_client_free(c);
    fp_proxy_stop(px);
    fh_teardown(&r);
}
