/* Automatic renewal, lost-lease notification, reentrant locks, fencing in practice, fork. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define TO .timeout = 90


struct lost_record {
    atomic_int calls;
    atomic_int reason;
    _Atomic int64_t at_ms;
    _Atomic int64_t validity_at_call;
    _Atomic int64_t deadline_at_call; /* the validity deadline the permit had when lost */
};

static void on_lost(redsem_permit *p, redsem_lost_reason why, void *arg)
{
    struct lost_record *r = arg;
    atomic_store(&r->at_ms, redsem_monotonic_ms());
    atomic_store(&r->reason, (int)why);
    atomic_store(&r->validity_at_call, redsem_permit_validity_ms(p));
    atomic_store(&r->deadline_at_call, redsem_permit_deadline_ms(p));
    atomic_fetch_add(&r->calls, 1);
}

static bool member(redsem_strategy s, const char *name, const char *id, const ts_server *srv)
{
    char key[256], out[64];
    snprintf(key, sizeof key, "redsem:{%s}:%s", name,
             s == REDSEM_STRATEGY_BASIC ? "holders" : "timeouts");
    ts_command(srv, out, sizeof out, "ZSCORE", key, id, NULL);
    return strcmp(out, "nil") != 0;
}

STRATEGY_TEST(renew, holder_keeps_its_permit_for_five_leases, TO)
{
    redsem_client *a = tf_client(), *b = tf_client();
    const char *name = tf_name("keep");
    int64_t lease = 200;
    redsem_sem *sa = NULL, *sb = NULL;
    OK(a, redsem_sem_open(a, name, strategy, 1, lease, &sa));
    OK(b, redsem_sem_open(b, name, strategy, 1, lease, &sb));
    redsem_permit *p = NULL, *q = NULL;
    OK(a, redsem_sem_try_acquire(sa, &p));
    struct lost_record rec = {0};
    OK(a, redsem_permit_auto_renew(p, 0, on_lost, &rec));
    EXPECT(a, REDSEM_ESTATE, redsem_permit_auto_renew(p, 0, on_lost, &rec));
    int64_t until = tf_now_ms() + 5 * lease;
    int tries = 0;
    while (tf_now_ms() < until) {
        EXPECT(b, REDSEM_EBUSY, redsem_sem_try_acquire(sb, &q));
        cr_assert(redsem_permit_held(p), "the holder lost its permit after %d tries", tries);
        tries++;
        tf_sleep_ms(20);
    }
    cr_assert_eq(atomic_load(&rec.calls), 0);
    redsem_renew_stats st;
    OK(a, redsem_client_renew_stats(a, &st));
    cr_assert_geq(st.renewals, 10, "only %llu renewals in 5 leases", (unsigned long long)st.renewals);
    /* renewals are requests on the client's own connections (since 0.4.6): counted there */
    redsem_client_stats cs;
    OK(a, redsem_client_get_stats(a, &cs));
    cr_assert_geq(cs.requests, st.renewals, "%llu requests for %llu renewals",
                  (unsigned long long)cs.requests, (unsigned long long)st.renewals);
    OK(a, redsem_permit_release(p));
    /* counted after release returned: a renewal may have completed between the reading
     * above and the release (release waits for one in flight), and must not count as "after" */
    OK(a, redsem_client_renew_stats(a, &st));
    uint64_t renewals = st.renewals;
    tf_sleep_ms(3 * lease);
    OK(a, redsem_client_renew_stats(a, &st));
    cr_assert_eq(st.renewals, renewals, "renewed after release");
    cr_assert_not(member(strategy, name, redsem_permit_id(p), tf_server()),
                  "renewal re-created a released entry");
    OK(b, redsem_sem_try_acquire(sb, &q));
    OK(b, redsem_permit_release(q));
    redsem_permit_free(p);
    redsem_permit_free(q);
    redsem_sem_free(sa);
    redsem_sem_free(sb);
    redsem_client_free(a);
    redsem_client_free(b);
}

STRATEGY_TEST(renew, cut_off_renewer_fires_lost_before_validity_ends, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, 1000, 2000);
    redsem_sem *s = NULL;
    int64_t lease = 600;
    OK(c, redsem_sem_open(c, "cutoff", strategy, 1, lease, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    struct lost_record rec = {0};
    OK(c, redsem_permit_auto_renew(p, 0, on_lost, &rec));
    tf_sleep_ms(lease); /* a couple of renewals go through */
    ts_server_pause(&srv, true);
    int64_t paused_at = tf_now_ms();
    while (atomic_load(&rec.calls) == 0 && tf_now_ms() < paused_at + 5000)
        tf_sleep_ms(5);
    cr_assert_eq(atomic_load(&rec.calls), 1, "lost never fired");
    cr_assert_eq(atomic_load(&rec.reason), REDSEM_LOST_DEADLINE);
    /* Judged against the deadline the permit had when it was declared lost: a renewal
     * answered just before the pause may have moved it after the pause began. */
    int64_t deadline = atomic_load(&rec.deadline_at_call);
    cr_assert_lt(atomic_load(&rec.at_ms), deadline, "fired at %lld, validity ended at %lld",
                 (long long)atomic_load(&rec.at_ms), (long long)deadline);
    cr_assert_not(redsem_permit_held(p));
    cr_assert_eq(redsem_permit_validity_ms(p), 0);
    /* The renewal in flight when the server stopped runs when it resumes. Resume only once
     * the old lease is surely over on the server, so that this renewal meets an expired
     * entry: it must not re-create it. "Surely over" is a lease after the pause, not after
     * the holder's validity deadline: a renewal that the server ran just before it stopped,
     * but whose reply it never sent, extended the entry without the holder knowing (the
     * holder then rightly gives the permit up early; the server frees it a lease after that
     * renewal). */
    while (tf_now_ms() < paused_at + lease + lease / 100 + 2 + 50)
        tf_sleep_ms(5);
    cr_assert_geq(tf_now_ms(), deadline + lease / 100 + 2 + 50);
    ts_server_pause(&srv, false);
    tf_sleep_ms(50);
    redsem_client *o = tf_client_for(srv.url, 1000, 0);
    redsem_sem *so = NULL;
    OK(o, redsem_sem_open(o, "cutoff", strategy, 1, lease, &so));
    redsem_permit *z = NULL;
    EXPECT(o, REDSEM_ELOST, redsem_sem_adopt(so, redsem_permit_id(p), &z));
    OK(o, redsem_sem_try_acquire(so, &z));
    OK(o, redsem_permit_release(z));
    redsem_permit_free(z);
    redsem_sem_free(so);
    redsem_client_free(o);
    EXPECT(c, REDSEM_ESTATE, redsem_permit_refresh(p));
    EXPECT(c, REDSEM_ELOST, redsem_permit_release(p));
    redsem_renew_stats st;
    OK(c, redsem_client_renew_stats(c, &st));
    cr_assert_eq(st.lost_deadline, 1);
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

/* Renewals take the client's own connections (since 0.4.6), so they may find all of them
 * busy: here the only one is held by another thread's request to a stalled server, which
 * keeps it for its command timeout (3 s). The renewal's wait for it must end when the holder
 * has to be told: lost fires before the permit's validity ends, not when the other request
 * gives the connection back. */
typedef struct busy_run {
    redsem_client *c;
    atomic_bool stop;
} busy_run;

static void *busy_pinger(void *arg)
{
    busy_run *b = arg;
    while (!atomic_load(&b->stop))
        (void)redsem_client_ping(b->c);
    return NULL;
}

Test(renew, a_busy_connection_does_not_delay_the_lost_notice, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, srv.url), REDSEM_OK);
    cr_assert_eq(redsem_options_set_max_connections(o, 1), REDSEM_OK);
    cr_assert_eq(redsem_options_set_command_timeout_ms(o, 3000), REDSEM_OK);
    busy_run b = {0};
    cr_assert_eq(redsem_client_new(o, &b.c), REDSEM_OK);
    redsem_options_free(o);
    redsem_sem *s = NULL;
    int64_t lease = 600;
    OK(b.c, redsem_sem_open(b.c, "busy", REDSEM_STRATEGY_BASIC, 1, lease, &s));
    redsem_permit *p = NULL;
    OK(b.c, redsem_sem_try_acquire(s, &p));
    struct lost_record rec = {0};
    OK(b.c, redsem_permit_auto_renew(p, 0, on_lost, &rec));
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, busy_pinger, &b), 0);
    tf_sleep_ms(lease / 2); /* renewals go through between the pings */
    cr_assert(redsem_permit_held(p));
    ts_server_pause(&srv, true);
    int64_t paused_at = tf_now_ms();
    while (atomic_load(&rec.calls) == 0 && tf_now_ms() < paused_at + 5000)
        tf_sleep_ms(5);
    ts_server_pause(&srv, false);
    atomic_store(&b.stop, true);
    pthread_join(th, NULL);
    cr_assert_eq(atomic_load(&rec.calls), 1, "lost never fired");
    cr_assert_eq(atomic_load(&rec.reason), REDSEM_LOST_DEADLINE);
    int64_t deadline = atomic_load(&rec.deadline_at_call);
    cr_assert_lt(atomic_load(&rec.at_ms), deadline, "fired at %lld, validity ended at %lld",
                 (long long)atomic_load(&rec.at_ms), (long long)deadline);
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(b.c);
    ts_server_stop(&srv);
}

/* A round of renewals waits for its reply no longer than the first lost notice of any
 * permit of the renewer, in the round or not: here permit A (30 s lease) is being renewed
 * when the server stalls, and permit B (3 s lease, not due) must still be declared lost
 * before its validity ends (found by review: A's round waited until A's own lost time,
 * ~29 s, and B's notice came 3 s after its validity ended; in 0.4.5 too). */
Test(renew, a_stalled_round_does_not_delay_another_permits_lost_notice, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, -1, 500); /* command timeout 500 ms */
    redsem_sem *sa = NULL, *sb = NULL;
    OK(c, redsem_sem_open(c, "A", REDSEM_STRATEGY_BASIC, 1, 30000, &sa));
    OK(c, redsem_sem_open(c, "B", REDSEM_STRATEGY_BASIC, 1, 3000, &sb));
    redsem_permit *a = NULL, *b = NULL;
    struct lost_record ra = {0}, rb = {0};
    OK(c, redsem_sem_try_acquire(sa, &a));
    OK(c, redsem_permit_auto_renew(a, 500, on_lost, &ra));
    tf_sleep_ms(200);
    OK(c, redsem_sem_try_acquire(sb, &b));
    OK(c, redsem_permit_auto_renew(b, 2900, on_lost, &rb)); /* B: no renewal before it is lost */
    tf_sleep_ms(1000);
    ts_server_pause(&srv, true); /* A's next renewal goes out into the stall */
    int64_t paused = tf_now_ms();
    while (atomic_load(&rb.calls) == 0 && tf_now_ms() < paused + 6000)
        tf_sleep_ms(5);
    ts_server_pause(&srv, false);
    cr_assert_eq(atomic_load(&rb.calls), 1, "B's lost notice never came");
    cr_expect_lt(atomic_load(&rb.at_ms), atomic_load(&rb.deadline_at_call),
                 "B's lost notice came at %lld, after its validity ended at %lld",
                 (long long)atomic_load(&rb.at_ms), (long long)atomic_load(&rb.deadline_at_call));
    redsem_permit_free(a);
    redsem_permit_free(b);
    redsem_sem_free(sa);
    redsem_sem_free(sb);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

STRATEGY_TEST(renew, renewal_finds_a_lease_gone_and_says_expired, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("gone");
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, name, strategy, 1, 300, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    struct lost_record rec = {0};
    OK(c, redsem_permit_auto_renew(p, 0, on_lost, &rec));
    /* someone removes the entry behind the holder's back (an operator, a failover) */
    char key[256];
    snprintf(key, sizeof key, "redsem:{%s}:meta", name);
    char field[64];
    snprintf(field, sizeof field, "t:%s", redsem_permit_id(p));
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "HDEL", key, field, NULL), 0);
    for (int i = 0; i < 300 && atomic_load(&rec.calls) == 0; i++)
        tf_sleep_ms(5);
    cr_assert_eq(atomic_load(&rec.calls), 1);
    cr_assert_eq(atomic_load(&rec.reason), REDSEM_LOST_EXPIRED);
    cr_assert_not(redsem_permit_held(p));
    redsem_permit_free(p); /* free without release: detaches from the renewer */
    redsem_sem_free(s);
    redsem_client_free(c);
}

Test(renew, lock_renewal_and_stop, TO)
{
    redsem_client *a = tf_client(), *b = tf_client();
    const char *name = tf_name("lrenew");
    redsem_lock *la = NULL, *lb = NULL;
    OK(a, redsem_lock_open(a, name, 150, &la));
    OK(b, redsem_lock_open(b, name, 150, &lb));
    redsem_permit *p = NULL, *q = NULL;
    OK(a, redsem_lock_try_acquire(la, &p));
    EXPECT(a, REDSEM_EINVAL, redsem_permit_auto_renew(p, 150, NULL, NULL));
    /* an interval that leaves less than the refresh margin (14 ms of a 150 ms lease): the
     * first renewal would be refused and the permit lost (accepted up to 0.4.5) */
    EXPECT(a, REDSEM_EINVAL, redsem_permit_auto_renew(p, 136, NULL, NULL));
    EXPECT(a, REDSEM_EINVAL, redsem_permit_auto_renew(p, -1, NULL, NULL));
    EXPECT(a, REDSEM_EINVAL, redsem_permit_auto_renew(NULL, 0, NULL, NULL));
    OK(a, redsem_permit_auto_renew(p, 40, NULL, NULL));
    tf_sleep_ms(600);
    EXPECT(b, REDSEM_EBUSY, redsem_lock_try_acquire(lb, &q));
    cr_assert(redsem_permit_held(p));
    OK(a, redsem_permit_stop_renewal(p));
    OK(a, redsem_permit_stop_renewal(p));
    tf_sleep_ms(300);
    cr_assert_not(redsem_permit_held(p));
    OK(b, redsem_lock_try_acquire(lb, &q));
    EXPECT(a, REDSEM_ELOST, redsem_permit_refresh(p));
    EXPECT(a, REDSEM_ESTATE, redsem_permit_auto_renew(p, 0, NULL, NULL));
    OK(b, redsem_permit_release(q));
    redsem_permit_free(p);
    redsem_permit_free(q);
    redsem_lock_free(la);
    redsem_lock_free(lb);
    redsem_client_free(a);
    redsem_client_free(b);
}

Test(renew, many_permits_share_one_renewer, TO)
{
    redsem_client *c = tf_client();
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, tf_name("many"), REDSEM_STRATEGY_FAIR, 50, 300, &s));
    redsem_permit *p[50];
    for (int i = 0; i < 50; i++) {
        OK(c, redsem_sem_try_acquire(s, &p[i]));
        OK(c, redsem_permit_auto_renew(p[i], 0, NULL, NULL));
    }
    tf_sleep_ms(1000);
    for (int i = 0; i < 50; i++)
        cr_assert(redsem_permit_held(p[i]), "permit %d lost", i);
    redsem_renew_stats st;
    OK(c, redsem_client_renew_stats(c, &st));
    cr_assert_geq(st.renewals, 50 * 2);
    cr_assert_eq(st.failures, 0);
    for (int i = 0; i < 50; i += 2)
        OK(c, redsem_permit_release(p[i]));
    for (int i = 0; i < 50; i++)
        redsem_permit_free(p[i]); /* odd ones: freed while renewed */
    redsem_sem_free(s);
    redsem_client_free(c); /* stops the renewer */
}

/* ---------------------------------------------------------------- reentrant lock */

Test(reentrant, same_owner_reenters_and_the_count_lives_on_the_server, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *a = tf_client_for(srv.url, 1000, 0), *b = tf_client_for(srv.url, 1000, 0);
    redsem_lock *l = NULL, *other = NULL, *same_client_other_handle = NULL;
    OK(a, redsem_lock_open(a, "re", 5000, &l));
    OK(a, redsem_lock_set_reentrant(l, true));
    OK(b, redsem_lock_open(b, "re", 5000, &other));
    OK(b, redsem_lock_set_reentrant(other, true));
    OK(a, redsem_lock_open(a, "re", 5000, &same_client_other_handle));
    OK(a, redsem_lock_set_reentrant(same_client_other_handle, true));
    redsem_permit *p1 = NULL, *p2 = NULL, *p3 = NULL, *q = NULL;
    OK(a, redsem_lock_try_acquire(l, &p1));
    OK(a, redsem_lock_acquire(l, 100, &p2));
    OK(a, redsem_lock_try_acquire(l, &p3));
    cr_assert_eq(redsem_permit_token(p1), redsem_permit_token(p3), "re-entry is not a new grant");
    EXPECT(b, REDSEM_EBUSY, redsem_lock_try_acquire(other, &q));
    EXPECT(a, REDSEM_EBUSY, redsem_lock_try_acquire(same_client_other_handle, &q));
    char tok[REDSEM_ID_BUFSIZE];
    OK(a, redsem_id_generate(tok));
    EXPECT(a, REDSEM_EINVAL, redsem_lock_acquire_as(l, tok, 0, &q));
    redsem_status *st = NULL;
    OK(a, redsem_lock_status(l, 1, &st));
    cr_assert_eq(redsem_status_hold_count(st), 3);
    redsem_status_free(st);
    /* the connection drops; the count is on the server, so release still works */
    ts_command(&srv, NULL, 0, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes", NULL);
    OK(a, redsem_permit_release(p3));
    OK(a, redsem_permit_refresh(p1));
    OK(a, redsem_permit_release(p2));
    EXPECT(b, REDSEM_EBUSY, redsem_lock_try_acquire(other, &q));
    OK(a, redsem_lock_status(l, 1, &st));
    cr_assert_eq(redsem_status_hold_count(st), 1);
    redsem_status_free(st);
    OK(a, redsem_permit_release(p1));
    OK(b, redsem_lock_try_acquire(other, &q));
    EXPECT(a, REDSEM_ESTATE, redsem_permit_refresh(p1));
    OK(b, redsem_permit_release(q));
    redsem_permit_free(p1);
    redsem_permit_free(p2);
    redsem_permit_free(p3);
    redsem_permit_free(q);
    redsem_lock_free(l);
    redsem_lock_free(other);
    redsem_lock_free(same_client_other_handle);
    redsem_client_free(a);
    redsem_client_free(b);
    ts_server_stop(&srv);
}

/* ---------------------------------------------------------------- fencing example */

Test(fencing, the_example_rejects_the_stale_write, TO)
{
    const char *bin = getenv("REDSEM_FENCING_EXAMPLE");
    cr_assert_not_null(bin, "REDSEM_FENCING_EXAMPLE not set by meson");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s '%s' 2>&1", bin, tf_url());
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char out[4096] = "", line[512];
    while (fgets(line, sizeof line, f))
        strncat(out, line, sizeof out - strlen(out) - 1);
    int st = pclose(f);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "example failed:\n%s", out);
    cr_assert(strstr(out, "A: the store REJECTED the write") != NULL, "%s", out);
    cr_assert(strstr(out, "B: the store ACCEPTED the write") != NULL, "%s", out);
    cr_assert(strstr(out, "held() now says false") != NULL, "%s", out);
    cr_assert(strstr(out, "refresh says REDSEM_ELOST") != NULL, "%s", out);
}

/* ---------------------------------------------------------------- fork */

Test(renew, forked_child_neither_renews_nor_releases_the_parents_permit, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("forkrenew");
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, 1, 300, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    OK(c, redsem_permit_auto_renew(p, 0, NULL, NULL));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int bad = 0;
        bad |= redsem_permit_release(p) != REDSEM_EFORKED;
        bad |= redsem_permit_stop_renewal(p) != REDSEM_EFORKED;
        bad |= redsem_permit_auto_renew(p, 0, NULL, NULL) != REDSEM_EFORKED;
        redsem_permit_free(p);
        redsem_sem_free(s);
        redsem_client_free(c); /* must not join or signal the parent's renewer */
        _exit(bad);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert_eq(WEXITSTATUS(status), 0);
    tf_sleep_ms(1000); /* > 3 leases: only renewal keeps it */
    cr_assert(redsem_permit_held(p), "the parent's renewal stopped");
    cr_assert(member(REDSEM_STRATEGY_FAIR, name, redsem_permit_id(p), tf_server()));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* What the server's deadline zset gives the holder `id` of `name`, less the server's TIME: the
 * lease it has left as the server sees it (ms), or INT64_MIN. */
static int64_t server_left_ms(redsem_strategy s, const char *name, const char *id)
{
    char key[256], out[64];
    snprintf(key, sizeof key, "redsem:{%s}:%s", name,
             s == REDSEM_STRATEGY_BASIC ? "holders" : "timeouts");
    const char *script = "local t = redis.call('TIME') "
                         "local d = redis.call('ZSCORE', KEYS[1], ARGV[1]) "
                         "if not d then return -1000000 end "
                         "return tonumber(d) - (t[1] * 1000 + math.floor(t[2] / 1000))";
    if (ts_command(tf_server(), out, sizeof out, "EVAL", script, "1", key, id, NULL) != 0)
        return INT64_MIN;
    return strtoll(out, NULL, 10);
}

STRATEGY_TEST(renew, a_refresh_too_close_to_the_end_is_refused, TO)
{
    /* lease 600 ms: margin = 6 + 2 + 12 + 17 = 37 ms. A refresh arriving with less than that
     * left on the server's clock is refused (it would arrive after the renewer told the
     * holder its permit was lost). The time left is read from the server itself: the
     * client's own validity is shorter by the drift and by however long the last refresh
     * took to reach the server, which is unbounded on a loaded machine (CI once saw a
     * refresh accepted because its validity had counted 15 ms that the server had not). */
    const char *name = tf_name("late");
    redsem_client *c = tf_client();
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, name, strategy, 1, 600, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    OK(c, redsem_permit_refresh(p)); /* plenty left: fine */
    int64_t left = server_left_ms(strategy, name, redsem_permit_id(p));
    cr_assert(left > 37 && left <= 600, "the server gives the refreshed lease %lld ms",
              (long long)left);
    /* sleep until 15 ms are left on the server's clock (the two clocks tick alike: one
     * machine); a sleep that overruns leaves less, which must be refused all the same */
    tf_sleep_ms(left - 15);
    left = server_left_ms(strategy, name, redsem_permit_id(p));
    cr_assert(left < 37, "%lld ms left after the sleep", (long long)left);
    EXPECT(c, REDSEM_ELOST, redsem_permit_refresh(p));
    cr_assert(server_left_ms(strategy, name, redsem_permit_id(p)) < 37,
              "a refused refresh extended the lease");
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- lifetimes (issue 29) */

/* What the renewer has done so far: its counters summed. */
static uint64_t renewer_work(redsem_client *c)
{
    redsem_renew_stats st;
    OK(c, redsem_client_renew_stats(c, &st));
    return st.renewals + st.failures + st.lost_expired + st.lost_deadline;
}

/* Freeing a semaphore or lock handle while one of its permits is renewed stops that renewal
 * (found by review: the renewer kept refreshing through the freed handle's keys, a use after
 * free, shown under ASan). The renewer is then let run past several renewals: it does no
 * more work, the permit runs out, and another holder gets it. */
static void free_handle_while_renewed(bool lock)
{
    redsem_client *c = tf_client();
    const char *name = tf_name(lock ? "freelock" : "freesem");
    int64_t lease = 300;
    redsem_sem *s = NULL;
    redsem_lock *l = NULL;
    redsem_permit *p = NULL;
    if (lock) {
        OK(c, redsem_lock_open(c, name, lease, &l));
        OK(c, redsem_lock_try_acquire(l, &p));
    } else {
        OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, 1, lease, &s));
        OK(c, redsem_sem_try_acquire(s, &p));
    }
    struct lost_record rec = {0};
    OK(c, redsem_permit_auto_renew(p, 50, on_lost, &rec));
    /* a few renewals go through */
    for (int i = 0; i < 400 && renewer_work(c) < 2; i++)
        tf_sleep_ms(5);
    cr_assert_geq(renewer_work(c), 2, "no renewal happened");
    if (lock)
        redsem_lock_free(l);
    else
        redsem_sem_free(s);
    uint64_t done = renewer_work(c);
    tf_sleep_ms(3 * lease); /* past several renewals, and the end of the lease */
    cr_assert_eq(renewer_work(c), done, "the renewer went on renewing a permit of a freed handle");
    cr_assert_eq(atomic_load(&rec.calls), 0, "a stopped renewal reported a loss");
    cr_assert_not(redsem_permit_held(p));
    /* the lease ran out on the server too: a new handle's acquire gets it */
    redsem_permit *q = NULL;
    if (lock) {
        OK(c, redsem_lock_open(c, name, lease, &l));
        OK(c, redsem_lock_try_acquire(l, &q));
    } else {
        OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, 1, lease, &s));
        OK(c, redsem_sem_try_acquire(s, &q));
    }
    OK(c, redsem_permit_release(q));
    redsem_permit_free(q);
    redsem_permit_free(p); /* after its handle: only reading and freeing remain allowed */
    redsem_sem_free(s);
    redsem_lock_free(l);
    redsem_client_free(c);
}

Test(renew, freeing_the_semaphore_handle_stops_its_renewals, TO)
{
    free_handle_while_renewed(false);
}

Test(renew, freeing_the_lock_handle_stops_its_renewals, TO)
{
    free_handle_while_renewed(true);
}

/* A handle freed while a renewal of its permit is in flight (stuck in a stalled server) waits
 * for that renewal to end (it reads the handle's keys, and its outcome is the permit's): when
 * the free returns, the renewal has ended (counted), and the renewer does nothing more. */
Test(renew, freeing_a_handle_waits_for_its_renewal_in_flight, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, 1000, 2000);
    redsem_sem *s = NULL;
    int64_t lease = 600;
    OK(c, redsem_sem_open(c, "inflight", REDSEM_STRATEGY_BASIC, 1, lease, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    OK(c, redsem_permit_auto_renew(p, 50, NULL, NULL));
    for (int i = 0; i < 400 && renewer_work(c) < 2; i++)
        tf_sleep_ms(5);
    ts_server_pause(&srv, true);
    /* the next renewal, due within 50 ms, goes out into the stall and waits there until the
     * permit's lost time (about half a second after the pause) */
    tf_sleep_ms(250);
    uint64_t before = renewer_work(c);
    redsem_sem_free(s);
    uint64_t at_free = renewer_work(c);
    ts_server_pause(&srv, false);
    tf_sleep_ms(3 * lease);
    cr_assert_gt(at_free, before, "the free returned before the renewal in flight ended");
    cr_assert_eq(renewer_work(c), at_free, "the renewer worked on after the free");
    redsem_permit_free(p);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

/* Freeing the client while its permits are renewed, one of them already found lost, stops
 * the renewer and lets go of every permit, the lost one too: its permits and handles may
 * then still be freed (found by review: the lost permit kept its renewal, and its free
 * reached into the freed client, a use after free shown under ASan). */
Test(renew, freeing_the_client_stops_its_renewals, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("freeclient");
    redsem_sem *s = NULL;
    redsem_lock *l = NULL;
    OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_BASIC, 2, 300, &s));
    OK(c, redsem_lock_open(c, name, 300, &l));
    redsem_permit *p = NULL, *gone = NULL, *lp = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    OK(c, redsem_sem_try_acquire(s, &gone));
    OK(c, redsem_lock_try_acquire(l, &lp));
    struct lost_record rec = {0}, rgone = {0};
    OK(c, redsem_permit_auto_renew(p, 50, on_lost, &rec));
    OK(c, redsem_permit_auto_renew(lp, 50, on_lost, &rec));
    OK(c, redsem_permit_auto_renew(gone, 50, on_lost, &rgone));
    char key[256], field[64];
    snprintf(key, sizeof key, "redsem:{%s}:meta", name);
    snprintf(field, sizeof field, "t:%s", redsem_permit_id(gone));
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "HDEL", key, field, NULL), 0);
    for (int i = 0; i < 1000 && atomic_load(&rgone.calls) == 0; i++)
        tf_sleep_ms(5);
    cr_assert_eq(atomic_load(&rgone.calls), 1, "the removed entry was never found lost");
    redsem_client_free(c); /* stops the renewer, waiting for a renewal in flight */
    tf_sleep_ms(400);      /* past several renewals and the end of the leases */
    cr_assert_eq(atomic_load(&rec.calls), 0, "a stopped renewal reported a loss");
    cr_assert_not(redsem_permit_held(p));
    cr_assert_not(redsem_permit_held(lp));
    redsem_permit_free(p);
    redsem_permit_free(gone);
    redsem_permit_free(lp);
    redsem_sem_free(s);
    redsem_lock_free(l);
    /* nothing renewed them: their leases ran out on the server */
    redsem_client *o = tf_client();
    redsem_sem *so = NULL;
    redsem_lock *lo = NULL;
    redsem_permit *q1 = NULL, *q2 = NULL, *q3 = NULL;
    OK(o, redsem_sem_open(o, name, REDSEM_STRATEGY_BASIC, 2, 300, &so));
    OK(o, redsem_lock_open(o, name, 300, &lo));
    OK(o, redsem_sem_try_acquire(so, &q1));
    OK(o, redsem_sem_try_acquire(so, &q2));
    OK(o, redsem_lock_try_acquire(lo, &q3));
    redsem_permit_free(q1);
    redsem_permit_free(q2);
    redsem_permit_free(q3);
    redsem_sem_free(so);
    redsem_lock_free(lo);
    redsem_client_free(o);
}

/* What a lost-lease callback does: calls on its own permit, its handle, or its client, from
 * the renewer thread (found by review: a release there waited for the renewer, itself: a
 * deadlock). */
enum { CB_RELEASE, CB_FREE, CB_FREE_HANDLE, CB_FREE_CLIENT };

typedef struct cb_run {
    int what;
    redsem_client *c;
    redsem_sem *s;
    redsem_permit *other; /* renewed too, by the same renewer */
    atomic_int refresh_rc, release_rc, stop_rc, other_release_rc;
    atomic_int calls;
} cb_run;

static void on_lost_calls(redsem_permit *p, redsem_lost_reason why, void *arg)
{
    (void)why;
    cb_run *r = arg;
    switch (r->what) {
    case CB_RELEASE:
        atomic_store(&r->refresh_rc, redsem_permit_refresh(p));
        atomic_store(&r->stop_rc, redsem_permit_stop_renewal(p));
        atomic_store(&r->release_rc, redsem_permit_release(p));
        /* another permit of the same renewer, renewed too: released from here as well */
        atomic_store(&r->other_release_rc, redsem_permit_release(r->other));
        break;
    case CB_FREE:
        atomic_store(&r->release_rc, redsem_permit_release(p));
        redsem_permit_free(p);
        break;
    case CB_FREE_HANDLE:
        redsem_permit_free(p);
        redsem_permit_free(r->other);
        redsem_sem_free(r->s); /* its other permits stop being renewed */
        break;
    case CB_FREE_CLIENT:
        redsem_permit_free(p);
        redsem_permit_free(r->other);
        redsem_sem_free(r->s);
        redsem_client_free(r->c); /* from its own renewer thread */
        break;
    }
    atomic_fetch_add(&r->calls, 1);
}

static void calls_from_the_lost_callback(int what)
{
    cb_run run = {.what = what};
    run.c = tf_client();
    const char *name = tf_name("cbcalls");
    OK(run.c, redsem_sem_open(run.c, name, REDSEM_STRATEGY_BASIC, 3, 300, &run.s));
    redsem_permit *p = NULL, *third = NULL;
    OK(run.c, redsem_sem_try_acquire(run.s, &p));
    OK(run.c, redsem_sem_try_acquire(run.s, &run.other));
    OK(run.c, redsem_sem_try_acquire(run.s, &third));
    OK(run.c, redsem_permit_auto_renew(p, 50, on_lost_calls, &run));
    OK(run.c, redsem_permit_auto_renew(run.other, 50, NULL, NULL));
    OK(run.c, redsem_permit_auto_renew(third, 50, NULL, NULL));
    char key[256], field[64];
    snprintf(key, sizeof key, "redsem:{%s}:meta", name);
    snprintf(field, sizeof field, "t:%s", redsem_permit_id(p));
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "HDEL", key, field, NULL), 0);
    for (int i = 0; i < 1000 && atomic_load(&run.calls) == 0; i++)
        tf_sleep_ms(5);
    cr_assert_eq(atomic_load(&run.calls), 1, "the lost callback did not return (a deadlock?)");
    if (what == CB_RELEASE) {
        cr_assert_eq(atomic_load(&run.refresh_rc), REDSEM_ESTATE, "refresh: %s",
                     redsem_err_name(atomic_load(&run.refresh_rc)));
        cr_assert_eq(atomic_load(&run.stop_rc), REDSEM_OK);
        /* the entry's token was removed; its membership may remain, which the release takes */
        int rel = atomic_load(&run.release_rc);
        cr_assert(rel == REDSEM_ELOST || rel == REDSEM_OK, "release: %s", redsem_err_name(rel));
        cr_assert_eq(atomic_load(&run.other_release_rc), REDSEM_OK, "other release: %s",
                     redsem_err_name(atomic_load(&run.other_release_rc)));
        cr_assert_not(redsem_permit_held(run.other));
    }
    if (what == CB_FREE) {
        int rel = atomic_load(&run.release_rc);
        cr_assert(rel == REDSEM_ELOST || rel == REDSEM_OK, "release: %s", redsem_err_name(rel));
    }
    if (what == CB_RELEASE || what == CB_FREE) {
        /* the renewer goes on renewing the others */
        uint64_t done = renewer_work(run.c);
        for (int i = 0; i < 400 && renewer_work(run.c) < done + 2; i++)
            tf_sleep_ms(5);
        cr_assert_geq(renewer_work(run.c), done + 2, "the renewer stopped");
        cr_assert(redsem_permit_held(third));
    }
    if (what == CB_FREE_HANDLE || what == CB_FREE_CLIENT) {
        tf_sleep_ms(400); /* nothing renews the third permit any more: its lease runs out */
        cr_assert_not(redsem_permit_held(third));
    }
    if (what == CB_RELEASE) {
        redsem_permit_free(p);
        redsem_permit_free(run.other);
    }
    if (what == CB_FREE)
        redsem_permit_free(run.other);
    if (what != CB_FREE_CLIENT)
        OK(run.c, redsem_permit_stop_renewal(third));
    redsem_permit_free(third);
    if (what == CB_RELEASE || what == CB_FREE)
        redsem_sem_free(run.s);
    if (what != CB_FREE_CLIENT)
        redsem_client_free(run.c);
}

Test(renew, release_and_refresh_from_the_lost_callback, TO)
{
    calls_from_the_lost_callback(CB_RELEASE);
}

Test(renew, freeing_the_permit_from_the_lost_callback, TO)
{
    calls_from_the_lost_callback(CB_FREE);
}

Test(renew, freeing_the_handle_from_the_lost_callback, TO)
{
    calls_from_the_lost_callback(CB_FREE_HANDLE);
}

Test(renew, freeing_the_client_from_the_lost_callback, TO)
{
    calls_from_the_lost_callback(CB_FREE_CLIENT);
}
