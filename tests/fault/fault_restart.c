/* Scenarios 5 and 6: Redis killed (SIGKILL) and restarted while workers hold and renew.
 *
 * 5a, without persistence, restarted at once (a documented limit): the server forgets every
 *     permit, so new holders overlap the old ones until these learn it; the overlaps are
 *     counted, every old holder must learn it lost within a second of the restart, and
 *     fencing tokens keep increasing across the restart.
 * 5b, without persistence, restarted after longer than the lease: the old holders' validity
 *     ends before the server is back: no violation.
 * 6,  with AOF and appendfsync always, restarted at once: no permit lost, no error surfaced
 *     to any caller (the retry window rides the restart out), holders keep renewing. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define LEASE_MS 1000

enum { AT_ONCE, AFTER_LEASE, AOF };

static const char *const aof_args[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};

static void restart(fw_kind kind, int mode)
{
    fh_run r;
    char label[64];
    static const char *const names[] = {"restart-at-once", "restart-after-lease",
                                        "restart-aof"};
    snprintf(label, sizeof label, "%s-%s", names[mode], fw_kind_name(kind));
    uint32_t limit = kind == FW_LOCK ? 1 : 3;
    fh_setup(&r, label, kind, limit, LEASE_MS, mode == AOF ? aof_args : NULL, false);
    const char *args[] = {"--hold-min-us", "200000", "--hold-max-us", "1200000", "--renew",
                          "--timeout-ms", "3000", NULL};
    int workers = (int)limit + 3;
    for (int i = 0; i < workers; i++)
        fh_spawn(&r, NULL, args);
    fw_sleep_ns(1200 * 1000000LL);
    /* who holds at the kill: kill while somebody does (the lock can be between holders at
     * any given instant, and slow workers may not have started yet) */
    int held[FW_MAX_SLOTS], nheld = 0;
    uint64_t tok[FW_MAX_SLOTS];
    for (int tries = 0; nheld == 0 && tries < 500; tries++) {
        for (int i = 0; i < r.nslots; i++)
            if (atomic_load(&r.sh->slot[i].active) && atomic_load(&r.sh->slot[i].wrote)) {
                held[nheld] = i;
                tok[nheld++] = atomic_load(&r.sh->slot[i].token);
            }
        if (nheld == 0)
            fw_sleep_ns(10 * 1000000LL);
    }
    fh_fault(&r, "server-kill", true);
    int64_t t_before_kill = fw_now_ns();
    ts_server_kill(&r.srv);
    if (mode == AFTER_LEASE)
        fw_sleep_ns((LEASE_MS + 300) * 1000000LL);
    cr_assert_eq(ts_server_restart(&r.srv), 0, "restart failed");
    int64_t t_up = fw_now_ns();
    fh_fault(&r, "server-up", false);
    fw_sleep_ns(2000 * 1000000LL);
    fh_finish(&r, 8000);

    fw_check_result res;
    fh_check(&r, &res);
    /* what each holder of the kill moment learned, and when */
    int learned = 0, kept = 0, finished = 0, left_before = 0, released_at_kill = 0;
    int64_t worst_learn = 0;
    for (int k = 0; k < nheld; k++) {
        fw_event e;
        /* sampled as a holder, but it left its section (and may have released) before the
         * kill: not a holder at the kill (a race of the sampling, more likely under load) */
        bool ended = fh_wait_event(&r, held[k], EV_END, tok[k], 0, 0, &e);
        if (ended && e.t_ns < t_before_kill) {
            left_before++;
            continue;
        }
        /* it left its section between the sampling's last moment and the restart, and its
         * release came back REDSEM_OK: the release was written before the SIGKILL (a release
         * written only after the restart finds nothing there: REDSEM_ELOST), so the old
         * server ran it, or it was in flight and "maybe applied" (design.md section 10: a
         * release re-sent after its reply was lost reports success). It gave its permit back
         * before the restart: not an old holder after it (seen once under load: '1 of 3 old
         * holders never learned', its section left 0-12 ms around the kill) */
        fw_event rel;
        if (mode == AT_ONCE && ended && e.t_ns < t_up &&
            fh_wait_event(&r, held[k], EV_REL, tok[k], 0, 0, &rel) && rel.rc == REDSEM_OK) {
            released_at_kill++;
            continue;
        }
        if (fh_wait_event(&r, held[k], EV_LOST, tok[k], 0, 0, &e)) {
            learned++;
            int64_t ms = (e.t_ns - t_up) / 1000000;
            if (ms > worst_learn)
                worst_learn = ms;
        } else if (fh_wait_event(&r, held[k], EV_REL, tok[k], 0, 0, &e)) {
            if (e.rc == REDSEM_OK)
                kept++;
            else
                finished++;
        }
    }
    /* tokens granted after the restart exceed every token granted before the kill */
    fw_event *ev = NULL;
    ssize_t n = fw_logs_read(r.dir, &ev);
    uint64_t max_before = 0, min_after = UINT64_MAX;
    int64_t t_kill = 0;
    for (ssize_t i = 0; i < n; i++) {
        if (ev[i].ev == EV_FAULT && ev[i].a == 1)
            t_kill = ev[i].t_ns;
        if (ev[i].ev == EV_ACQ) {
            if (t_kill == 0 && ev[i].token > max_before)
                max_before = ev[i].token;
            if (ev[i].t_ns > t_up && ev[i].token < min_after)
                min_after = ev[i].token;
        }
    }
    free(ev);
    nheld -= left_before;
    fprintf(stderr,
            "SCENARIO %s %s: %d holders at the kill: %d learned they lost (worst %lld ms after "
            "the restart), %d kept their permit, %d ended otherwise, %d released as it was "
            "killed; overlaps above the limit "
            "%zu (%.1f ms); errors %zu, unknown %zu, lost %zu, release lost %zu, release errors %zu; "
            "server down %lld ms; tokens before %llu < after %llu\n",
            mode == AOF ? "6" : "5", label, nheld, learned, (long long)worst_learn, kept,
            finished, released_at_kill, res.violations, (double)res.violation_ns / 1e6, res.errors, res.unknown,
            res.lost, res.rel_lost, res.rel_err, (long long)((t_up - t_kill) / 1000000),
            (unsigned long long)max_before, (unsigned long long)min_after);
    cr_expect_gt(nheld, 0, "nobody held at the kill: the scenario proves nothing");
    cr_expect_gt(min_after, max_before, "a token after the restart is not above those before");
    if (mode == AT_ONCE) {
        /* documented limit: overlaps allowed, but every old holder learns within 1 s */
        cr_expect_eq(learned + finished + released_at_kill, nheld,
                     "%d of %d old holders never learned",
                     nheld - learned - finished - released_at_kill, nheld);
        cr_expect_leq(worst_learn, 1000, "an old holder learned after %lld ms",
                      (long long)worst_learn);
    } else {
        cr_expect_eq(res.violations, 0, "checker: %zu violations", res.violations);
        cr_expect_eq(atomic_load(&r.sh->nviol), 0);
    }
    if (mode == AOF) {
        cr_expect_eq(res.errors, 0, "%zu errors surfaced", res.errors);
        cr_expect_eq(res.unknown, 0);
        cr_expect_eq(res.lost, 0, "%zu permits lost", res.lost);
        cr_expect_eq(res.rel_lost + res.rel_err, 0);
        cr_expect_eq(kept, nheld, "%d of %d holders kept their permit", kept, nheld);
    }
    fh_quiescence(&r);
    fh_teardown(&r);
}

Test(restart, at_once_basic, .timeout = 90) { restart(FW_BASIC, AT_ONCE); }
Test(restart, at_once_fair, .timeout = 90) { restart(FW_FAIR, AT_ONCE); }
Test(restart, at_once_locked, .timeout = 90) { restart(FW_LOCKED, AT_ONCE); }
Test(restart, at_once_lock, .timeout = 90) { restart(FW_LOCK, AT_ONCE); }
Test(restart, after_lease_basic, .timeout = 90) { restart(FW_BASIC, AFTER_LEASE); }
Test(restart, after_lease_fair, .timeout = 90) { restart(FW_FAIR, AFTER_LEASE); }
Test(restart, after_lease_locked, .timeout = 90) { restart(FW_LOCKED, AFTER_LEASE); }
Test(restart, after_lease_lock, .timeout = 90) { restart(FW_LOCK, AFTER_LEASE); }
Test(restart, aof_basic, .timeout = 90) { restart(FW_BASIC, AOF); }
Test(restart, aof_fair, .timeout = 90) { restart(FW_FAIR, AOF); }
Test(restart, aof_locked, .timeout = 90) { restart(FW_LOCKED, AOF); }
Test(restart, aof_lock, .timeout = 90) { restart(FW_LOCK, AOF); }

/* Found by scenario 6 (aof_locked, two busy loops beside it): one release of 18 said
 * REDSEM_ELOST although the restart kept every permit. The release was applied (and
 * fsynced) just before the kill, its reply was lost with the connection, and the copy
 * re-sent to the restarted server got NOSCRIPT (a restart empties the script cache); the
 * request after the reload forgot that the first copy may have been applied, and "not there"
 * read as lost. Reproduced deterministically: the proxy drops the release's reply, and once
 * the server has applied it, the script cache is flushed and the connection killed, the two
 * things a restart does to the client. */
struct lost_release {
    ts_server *srv;
    fp_proxy *px;
    redsem_sem *obs;
    int applied;
};

static void *lose_release_reply(void *arg)
{
    struct lost_release *x = arg;
    for (int i = 0; i < 1000 && !x->applied; i++) {
        redsem_status *st = NULL;
        if (redsem_sem_status(x->obs, 0, &st) == REDSEM_OK &&
            redsem_status_holder_count(st) == 0)
            x->applied = 1;
        redsem_status_free(st);
        if (!x->applied)
            fw_sleep_ns(1000000);
    }
    fp_proxy_set_mode(x->px, FP_PASS);
    ts_command(x->srv, NULL, 0, "SCRIPT", "FLUSH", NULL);
    ts_command(x->srv, NULL, 0, "CLIENT", "KILL", "TYPE", "normal", NULL);
    return NULL;
}

Test(restart, release_reply_lost_then_noscript_is_ok, .timeout = 60)
{
    fh_run r;
    fh_setup(&r, "release-reply-lost", FW_BASIC, 1, 10000, NULL, true);
    fp_proxy *px = fp_proxy_start(r.srv.port);
    cr_assert_not_null(px);
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", fp_proxy_port(px));
    redsem_client *c = fh_client(url, -1, 5000);
    redsem_client *obs = fh_client(r.srv.url, -1, -1);
    redsem_sem *s = NULL, *os = NULL;
    redsem_lock *l = NULL, *ol = NULL;
    fh_open(&r, c, &s, &l);
    fh_open(&r, obs, &os, &ol);
    redsem_permit *p = NULL;
    /* warm: a client's first call of a script carries its body (EVAL), which cannot meet
     * NOSCRIPT; the release measured below is an EVALSHA */
    cr_assert_eq(redsem_sem_acquire(s, 0, &p), REDSEM_OK);
    cr_assert_eq(redsem_permit_release(p), REDSEM_OK);
    redsem_permit_free(p);
    p = NULL;
    cr_assert_eq(redsem_sem_acquire(s, 0, &p), REDSEM_OK);
    fp_proxy_set_mode(px, FP_DROP_EVAL_REPLIES);
    struct lost_release x = {.srv = &r.srv, .px = px, .obs = os};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, lose_release_reply, &x), 0);
    int rc = redsem_permit_release(p);
    pthread_join(t, NULL);
    redsem_client_stats st;
    redsem_client_get_stats(c, &st);
    fprintf(stderr, "release with a lost reply, then NOSCRIPT: %s (%s); applied %d; retries "
                    "%llu, noscript %llu\n",
            redsem_err_name(rc), rc ? redsem_client_errmsg(c) : "", x.applied,
            (unsigned long long)st.retries, (unsigned long long)st.noscript);
    cr_assert(x.applied, "the release never reached the server");
    cr_expect_geq(st.retries, 1, "the release was not re-sent");
    cr_expect_geq(st.noscript, 1, "the re-sent release did not meet NOSCRIPT");
    cr_expect_eq(rc, REDSEM_OK, "a release applied before its reply was lost: %s (%s)",
                 redsem_err_name(rc), redsem_client_errmsg(c));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_sem_free(os);
    redsem_client_free(c);
    redsem_client_free(obs);
    fp_proxy_stop(px);
    fh_teardown(&r);
}
