/* Semaphore behaviour against a real redis-server, for each strategy. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define TO .timeout = 60

static redsem_sem *open_sem(redsem_client *c, const char *name, redsem_strategy s, uint32_t limit,
                            int64_t lease)
{
    redsem_sem *sem = NULL;
    OK(c, redsem_sem_open(c, name, s, limit, lease, &sem));
    cr_assert_not_null(sem);
    return sem;
}

static size_t holders_now(redsem_sem *sem)
{
    redsem_status *st = NULL;
    cr_assert_eq(redsem_sem_status(sem, 0, &st), REDSEM_OK);
    size_t n = redsem_status_holder_count(st);
    redsem_status_free(st);
    return n;
}

STRATEGY_TEST(sem, grants_exactly_limit, TO)
{
    redsem_client *c = tf_client();
    redsem_sem *sem = open_sem(c, tf_name("limit"), strategy, 3, 10000);
    redsem_permit *p[4] = {0};
    for (int i = 0; i < 3; i++)
        OK(c, redsem_sem_try_acquire(sem, &p[i]));
    redsem_permit *sentinel = (redsem_permit *)0x1, *q = sentinel;
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(sem, &q));
    cr_assert_eq(q, sentinel, "out-param written on EBUSY");
    cr_assert_eq(holders_now(sem), 3);
    for (int i = 0; i < 3; i++) {
        cr_assert(redsem_permit_held(p[i]));
        cr_assert_gt(redsem_permit_validity_ms(p[i]), 9000);
        cr_assert_leq(redsem_permit_validity_ms(p[i]), 10000 - 10000 / 100 - 2);
        cr_assert_eq(strlen(redsem_permit_id(p[i])), REDSEM_ID_LEN);
    }
    OK(c, redsem_permit_release(p[1]));
    cr_assert_not(redsem_permit_held(p[1]));
    EXPECT(c, REDSEM_ESTATE, redsem_permit_release(p[1]));
    EXPECT(c, REDSEM_ESTATE, redsem_permit_refresh(p[1]));
    OK(c, redsem_sem_try_acquire(sem, &p[3]));
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(sem, &q));
    for (int i = 0; i < 4; i++) {
        if (i != 1)
            OK(c, redsem_permit_release(p[i]));
        redsem_permit_free(p[i]);
    }
    cr_assert_eq(holders_now(sem), 0);
    redsem_sem_free(sem);
    redsem_client_free(c);
}

STRATEGY_TEST(sem, fencing_tokens_strictly_increase_across_clients, TO)
{
    redsem_client *a = tf_client(), *b = tf_client();
    const char *name = tf_name("fence");
    redsem_sem *sa = open_sem(a, name, strategy, 2, 5000);
    redsem_sem *sb = open_sem(b, name, strategy, 2, 5000);
    uint64_t last = 0;
    for (int i = 0; i < 60; i++) {
        redsem_sem *s = i % 2 ? sa : sb;
        redsem_client *c = i % 2 ? a : b;
        redsem_permit *p = NULL;
        OK(c, redsem_sem_acquire(s, 2000, &p));
        cr_assert_gt(redsem_permit_token(p), last, "token %llu after %llu",
                     (unsigned long long)redsem_permit_token(p), (unsigned long long)last);
        last = redsem_permit_token(p);
        OK(c, redsem_permit_release(p));
        redsem_permit_free(p);
    }
    redsem_sem_free(sa);
    redsem_sem_free(sb);
    redsem_client_free(a);
    redsem_client_free(b);
}

STRATEGY_TEST(sem, dead_holder_is_reclaimed_after_its_lease, TO)
{
    const char *name = tf_name("dead");
    int64_t lease = 300;
    /* The child's lease starts after this instant and its grant cannot be taken over before
     * the lease ends; its exit may take long after the grant (under valgrind: its leak check),
     * so the lower bound counts from before the fork, the upper one from its death. */
    int64_t forked_at = tf_now_ms();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        redsem_client *c = NULL;
        redsem_sem *s = NULL;
        redsem_permit *p = NULL;
        if (redsem_client_connect(tf_url(), &c) || redsem_sem_open(c, name, strategy, 1, lease, &s) ||
            redsem_sem_try_acquire(s, &p))
            _exit(1);
        _exit(0); /* dies holding the permit */
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert_eq(WEXITSTATUS(status), 0);
    int64_t dead_at = tf_now_ms();
    redsem_client *c = tf_client();
    redsem_sem *sem = open_sem(c, name, strategy, 1, lease);
    redsem_permit *p = NULL;
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(sem, &p));
    OK(c, redsem_sem_acquire(sem, 5000, &p));
    int64_t granted_at = tf_now_ms(), waited = granted_at - dead_at;
    /* generous bounds: not before the lease can have run out, well before 5 s */
    cr_assert_geq(granted_at - forked_at, lease - 60, "granted %lld ms after the fork",
                  (long long)(granted_at - forked_at));
    cr_assert_lt(waited, lease + 1500, "granted after %lld ms", (long long)waited);
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(sem);
    redsem_client_free(c);
}

/* Raw view of the server: is `id` still a member of the semaphore's deadline set? */
static bool member(redsem_strategy s, const char *name, const char *id)
{
    char key[256], out[64];
    snprintf(key, sizeof key, "redsem:{%s}:%s", name,
             s == REDSEM_STRATEGY_BASIC ? "holders" : "timeouts");
    ts_command(tf_server(), out, sizeof out, "ZSCORE", key, id, NULL);
    return strcmp(out, "nil") != 0;
}

STRATEGY_TEST(sem, refresh_after_expiry_is_lost_and_recreates_nothing, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("expired");
    redsem_sem *sem = open_sem(c, name, strategy, 1, 100);
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(sem, &p));
    OK(c, redsem_permit_refresh(p));
    cr_assert(member(strategy, name, redsem_permit_id(p)));
    tf_sleep_ms(250);
    cr_assert_not(redsem_permit_held(p), "validity must have run out");
    cr_assert_eq(redsem_permit_validity_ms(p), 0);
    EXPECT(c, REDSEM_ELOST, redsem_permit_refresh(p));
    cr_assert(strstr(redsem_client_errmsg(c), "lost") != NULL);
    cr_assert_eq(holders_now(sem), 0);
    EXPECT(c, REDSEM_ESTATE, redsem_permit_refresh(p));
    EXPECT(c, REDSEM_ELOST, redsem_permit_release(p));
    cr_assert_not(member(strategy, name, redsem_permit_id(p)), "entry re-created");
    redsem_permit_free(p);
    redsem_sem_free(sem);
    redsem_client_free(c);
}

STRATEGY_TEST(sem, late_release_does_not_touch_the_new_holder, TO)
{
    redsem_client *a = tf_client(), *b = tf_client();
    const char *name = tf_name("late");
    redsem_sem *sa = open_sem(a, name, strategy, 1, 100);
    redsem_sem *sb = open_sem(b, name, strategy, 1, 5000);
    redsem_permit *pa = NULL, *pb = NULL;
    OK(a, redsem_sem_try_acquire(sa, &pa));
    tf_sleep_ms(200);
    OK(b, redsem_sem_try_acquire(sb, &pb));
    EXPECT(a, REDSEM_ELOST, redsem_permit_release(pa));
    EXPECT(a, REDSEM_ESTATE, redsem_permit_release(pa));
    cr_assert_eq(holders_now(sb), 1);
    OK(b, redsem_permit_refresh(pb));
    /* a stranger's identifier owns nothing */
    char stranger[REDSEM_ID_BUFSIZE];
    OK(a, redsem_id_generate(stranger));
    redsem_permit *ps = NULL;
    EXPECT(a, REDSEM_ELOST, redsem_sem_adopt(sa, stranger, &ps));
    cr_assert_null(ps);
    cr_assert_eq(holders_now(sb), 1);
    OK(b, redsem_permit_release(pb));
    redsem_permit_free(pa);
    redsem_permit_free(pb);
    redsem_sem_free(sa);
    redsem_sem_free(sb);
    redsem_client_free(a);
    redsem_client_free(b);
}

STRATEGY_TEST(sem, adopt_by_identifier, TO)
{
    redsem_client *a = tf_client(), *b = tf_client();
    const char *name = tf_name("adopt");
    redsem_sem *sa = open_sem(a, name, strategy, 2, 5000);
    redsem_sem *sb = open_sem(b, name, strategy, 2, 5000);
    redsem_permit *pa = NULL, *pb = NULL;
    OK(a, redsem_sem_try_acquire(sa, &pa));
    EXPECT(b, REDSEM_EINVAL, redsem_sem_adopt(sb, "XYZ", &pb));
    EXPECT(b, REDSEM_EINVAL, redsem_sem_adopt(sb, redsem_permit_id(pa), NULL));
    OK(b, redsem_sem_adopt(sb, redsem_permit_id(pa), &pb));
    cr_assert_str_eq(redsem_permit_id(pb), redsem_permit_id(pa));
    cr_assert_eq(redsem_permit_token(pb), redsem_permit_token(pa));
    cr_assert_gt(redsem_permit_validity_ms(pb), 4000);
    OK(b, redsem_permit_refresh(pb));
    OK(b, redsem_permit_release(pb));
    EXPECT(a, REDSEM_ELOST, redsem_permit_refresh(pa));
    redsem_permit_free(pa);
    redsem_permit_free(pb);
    redsem_sem_free(sa);
    redsem_sem_free(sb);
    redsem_client_free(a);
    redsem_client_free(b);
}

STRATEGY_TEST(sem, acquire_is_idempotent_per_identifier, TO)
{
    redsem_client *c = tf_client();
    redsem_sem *sem = open_sem(c, tf_name("idem"), strategy, 2, 5000);
    char id[REDSEM_ID_BUFSIZE];
    OK(c, redsem_id_generate(id));
    redsem_permit *p1 = NULL, *p2 = NULL, *p3 = NULL;
    OK(c, redsem_sem_acquire_as(sem, id, 0, &p1));
    OK(c, redsem_sem_acquire_as(sem, id, 1000, &p2));
    cr_assert_eq(redsem_permit_token(p1), redsem_permit_token(p2));
    cr_assert_eq(holders_now(sem), 1, "a retry took a second permit");
    /* the other permit is still free */
    OK(c, redsem_sem_try_acquire(sem, &p3));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_as(sem, "ABCDEF", 0, &p3));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_as(sem, NULL, 0, &p3));
    char upper[REDSEM_ID_BUFSIZE];
    memcpy(upper, id, sizeof upper);
    upper[0] = 'A';
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_as(sem, upper, 0, &p3));
    OK(c, redsem_permit_release(p1));
    EXPECT(c, REDSEM_ELOST, redsem_permit_release(p2));
    OK(c, redsem_permit_release(p3));
    redsem_permit_free(p1);
    redsem_permit_free(p2);
    redsem_permit_free(p3);
    redsem_sem_free(sem);
    redsem_client_free(c);
}

STRATEGY_TEST(sem, conflicting_open_is_refused, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("conflict");
    redsem_sem *sem = open_sem(c, name, strategy, 3, 5000), *other = NULL;
    redsem_strategy different =
        strategy == REDSEM_STRATEGY_BASIC ? REDSEM_STRATEGY_FAIR : REDSEM_STRATEGY_BASIC;
    EXPECT(c, REDSEM_ECONFLICT, redsem_sem_open(c, name, different, 3, 5000, &other));
    cr_assert(strstr(redsem_client_errmsg(c), "CONFLICT") != NULL, "%s", redsem_client_errmsg(c));
    EXPECT(c, REDSEM_ECONFLICT, redsem_sem_open(c, name, strategy, 4, 5000, &other));
    cr_assert_null(other);
    /* a different lease is fine: leases are per handle */
    OK(c, redsem_sem_open(c, name, strategy, 3, 777, &other));
    redsem_sem_free(other);
    redsem_sem_free(sem);
    redsem_client_free(c);
}

STRATEGY_TEST(sem, invalid_arguments_are_einval, TO)
{
    redsem_client *c = tf_client();
    redsem_sem *s = NULL;
    static char huge[1 << 20];
    memset(huge, 'n', sizeof huge - 1);
    const char *bad_names[] = {"", "a b", "tab\tname", "br{ace", "br}ace", "\x01\x02", "caf\xc3\xa9",
                               huge};
    for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++)
        EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, bad_names[i], strategy, 1, 1000, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, NULL, strategy, 1, 1000, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, "ok", strategy, 0, 1000, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, "ok", strategy, REDSEM_LIMIT_MAX + 1, 1000, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, "ok", strategy, 1, 0, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, "ok", strategy, 1, REDSEM_LEASE_MIN_MS - 1, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, "ok", strategy, 1, -1, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, "ok", strategy, 1, REDSEM_LEASE_MAX_MS + 1, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, "ok", strategy, 1, INT64_MAX, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, "ok", (redsem_strategy)0, 1, 1000, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, "ok", (redsem_strategy)4, 1, 1000, &s));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_open(c, "ok", strategy, 1, 1000, NULL));
    cr_assert_null(s);
    s = open_sem(c, tf_name("args"), strategy, 1, 1000);
    redsem_permit *p = NULL;
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire(s, -2, &p));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire(s, REDSEM_WAIT_MAX_MS + 1, &p));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire(s, INT64_MIN, &p));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire(s, 10, NULL));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_try_acquire(s, NULL));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_set_limit(s, 0));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_set_limit(s, REDSEM_LIMIT_MAX + 1));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_set_wait_lease_ms(s, 0));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_set_guard_lease_ms(s, INT64_MAX));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_status(s, 0, NULL));
    redsem_status *st = NULL;
    EXPECT(c, REDSEM_EINVAL, redsem_sem_status(s, (size_t)REDSEM_LIMIT_MAX + 1, &st));
    cr_assert_null(p);
    cr_assert_null(st);
    /* nothing about the semaphore changed */
    OK(c, redsem_sem_try_acquire(s, &p));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

STRATEGY_TEST(sem, timed_acquire_returns_by_its_deadline, TO)
{
    redsem_client *a = tf_client(), *b = tf_client();
    const char *name = tf_name("deadline");
    redsem_sem *sa = open_sem(a, name, strategy, 1, 10000);
    redsem_sem *sb = open_sem(b, name, strategy, 1, 10000);
    redsem_permit *pa = NULL, *pb = NULL;
    OK(a, redsem_sem_try_acquire(sa, &pa));
    for (int64_t timeout = 50; timeout <= 450; timeout += 200) {
        int64_t t0 = tf_now_ms();
        EXPECT(b, REDSEM_EBUSY, redsem_sem_acquire(sb, timeout, &pb));
        int64_t took = tf_now_ms() - t0;
        cr_assert_geq(took, timeout - 2, "returned after %lld ms of %lld", (long long)took,
                      (long long)timeout);
        /* generous: the deadline plus one reconnect and one round trip on a noisy machine */
        cr_assert_lt(took, timeout + 250, "returned after %lld ms of %lld", (long long)took,
                     (long long)timeout);
    }
    /* the waiter left the queue */
    cr_assert_eq(tf_waiters(sa), 0);
    OK(a, redsem_permit_release(pa));
    redsem_permit_free(pa);
    redsem_sem_free(sa);
    redsem_sem_free(sb);
    redsem_client_free(a);
    redsem_client_free(b);
}

struct waiter_arg {
    const char *name;
    redsem_strategy strategy;
    uint32_t limit;
    int64_t timeout;
    int rc;
    int64_t granted_at;
    redsem_client_stats stats;
};

static void *waiter(void *arg)
{
    struct waiter_arg *w = arg;
    redsem_client *c = NULL;
    redsem_sem *s = NULL;
    redsem_permit *p = NULL;
    w->rc = redsem_client_connect(tf_url(), &c);
    if (w->rc == REDSEM_OK)
        w->rc = redsem_sem_open(c, w->name, w->strategy, w->limit, 10000, &s);
    if (w->rc == REDSEM_OK)
        w->rc = redsem_sem_acquire(s, w->timeout, &p);
    w->granted_at = tf_now_ms();
    if (w->rc == REDSEM_OK) {
        redsem_client_get_stats(c, &w->stats);
        redsem_permit_release(p);
    }
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
    return NULL;
}

/* One round of the wake-up scenario: a holder, a waiter queued behind it long enough for its
 * fallback poll to have backed off, then the release. */
struct wake_round {
    int64_t queued_after; /* ms from the waiter's start to its registration */
    int64_t handoff;      /* ms from the release to the waiter's grant */
    struct waiter_arg w;
};

static void wake_round(redsem_strategy strategy, struct wake_round *out)
{
    redsem_client *a = tf_client();
    const char *name = tf_name("wake");
    redsem_sem *sa = open_sem(a, name, strategy, 1, 10000);
    redsem_permit *pa = NULL;
    OK(a, redsem_sem_try_acquire(sa, &pa));
    out->w = (struct waiter_arg){.name = name, .strategy = strategy, .limit = 1,
                                 .timeout = 10000};
    pthread_t t;
    int64_t t0 = tf_now_ms();
    cr_assert_eq(pthread_create(&t, NULL, waiter, &out->w), 0);
    /* The waiter must be queued before the release, however slowly its thread starts. */
    int64_t queued_at = 0;
    for (int i = 0; i < 500 && queued_at == 0; i++) {
        if (tf_waiters(sa) > 0)
            queued_at = tf_now_ms();
        else
            tf_sleep_ms(2);
    }
    cr_assert_gt(queued_at, 0, "the waiter never queued");
    /* Long enough for the fallback backoff to have grown to ~400-800 ms: a waiter that only
     * polled would be granted hundreds of ms after the release. */
    tf_sleep_ms(900);
    int64_t released_at = tf_now_ms();
    OK(a, redsem_permit_release(pa));
    pthread_join(t, NULL);
    cr_assert_eq(out->w.rc, REDSEM_OK, "waiter: %s", redsem_err_name(out->w.rc));
    out->queued_after = queued_at - t0;
    out->handoff = out->w.granted_at - released_at;
    redsem_permit_free(pa);
    redsem_sem_free(sa);
    redsem_client_free(a);
}

/* At most this many rounds, of which only the last may be ambiguous (see below). */
#define WAKE_ROUNDS 5

STRATEGY_TEST(sem, release_wakes_a_blocked_waiter_at_once, TO)
{
    /* The waiter's fallback poll (its BLPOP timing out on the server, then one more attempt)
     * can land on the release by chance: the waiter is then granted at once without a
     * wake-up, and the round shows nothing about the wake-up path (a loaded machine stretches
     * the waiter's cycle, and the suite saw it once in 9 runs). Such a round, no wake-up yet a
     * grant within the bound, is repeated with a new semaphore. The test passes only on a
     * round with a wake-up; a round without one fails unless it was that fast, and WAKE_ROUNDS
     * fast rounds without a wake-up fail too, so a release that never wakes, or a waiter that
     * never blocks where releases push, fails every time, whatever the timing.
     *
     * The 150 ms bound is not a speed requirement: it tells "woken by the release" from
     * "found the permit by polling". By now the waiter's fallback poll has backed off to
     * waits of 400-1000 ms, so a waiter that only polled is granted at a random point of such
     * a wait after the release, typically hundreds of ms; a woken one is granted one BLPOP
     * reply and one script later, a few ms even on a loaded 2-core machine. */
    struct wake_round r;
    int round = 1;
    for (;; round++) {
        wake_round(strategy, &r);
        bool ambiguous = r.w.stats.wakeups == 0 && r.handoff < 150;
        if (!ambiguous || round == WAKE_ROUNDS)
            break;
        fprintf(stderr,
                "release_wakes_a_blocked_waiter_at_once_%s: round %d granted %lld ms after the "
                "release by a poll that coincided with it (no wake-up); again\n",
                redsem_strategy_name(strategy), round, (long long)r.handoff);
    }
    cr_assert_lt(r.handoff, 150, "hand-off took %lld ms (round %d)", (long long)r.handoff,
                 round);
    cr_assert_geq(r.w.stats.wakeups, 1,
                  "the waiter was not woken by a signal in %d rounds (last round: queued %lld ms "
                  "after start, granted %lld ms after the release; %llu requests, %llu "
                  "connects, %llu retries)",
                  round, (long long)r.queued_after, (long long)r.handoff,
                  (unsigned long long)r.w.stats.requests, (unsigned long long)r.w.stats.connects,
                  (unsigned long long)r.w.stats.retries);
}

STRATEGY_TEST(sem, raising_the_limit_wakes_waiters, TO)
{
    redsem_client *a = tf_client();
    const char *name = tf_name("raise");
    redsem_sem *sa = open_sem(a, name, strategy, 1, 10000);
    redsem_permit *pa = NULL;
    OK(a, redsem_sem_try_acquire(sa, &pa));
    struct waiter_arg w = {.name = name, .strategy = strategy, .limit = 1, .timeout = 10000};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, waiter, &w), 0);
    tf_sleep_ms(900);
    int64_t raised_at = tf_now_ms();
    OK(a, redsem_sem_set_limit(sa, 2));
    cr_assert_eq(redsem_sem_limit(sa), 2);
    pthread_join(t, NULL);
    cr_assert_eq(w.rc, REDSEM_OK, "waiter: %s", redsem_err_name(w.rc));
    cr_assert_lt(w.granted_at - raised_at, 150, "granted %lld ms after the raise",
                 (long long)(w.granted_at - raised_at));
    /* the recorded limit is 2 now: opening with 1 conflicts, with 2 works */
    redsem_sem *other = NULL;
    EXPECT(a, REDSEM_ECONFLICT, redsem_sem_open(a, name, strategy, 1, 1000, &other));
    OK(a, redsem_sem_open(a, name, strategy, 2, 1000, &other));
    /* lowering revokes nothing */
    redsem_permit *pb = NULL;
    OK(a, redsem_sem_try_acquire(other, &pb));
    OK(a, redsem_sem_set_limit(sa, 1));
    cr_assert_eq(holders_now(sa), 2);
    OK(a, redsem_permit_refresh(pa));
    OK(a, redsem_permit_release(pb));
    redsem_permit *pc = NULL;
    EXPECT(a, REDSEM_EBUSY, redsem_sem_try_acquire(other, &pc));
    OK(a, redsem_permit_release(pa));
    redsem_permit_free(pa);
    redsem_permit_free(pb);
    redsem_sem_free(other);
    redsem_sem_free(sa);
    redsem_client_free(a);
}

STRATEGY_TEST(sem, status_lists_holders_and_waiters, TO)
{
    redsem_client *a = tf_client();
    const char *name = tf_name("status");
    redsem_sem *sa = open_sem(a, name, strategy, 2, 10000);
    redsem_status *st = NULL;
    OK(a, redsem_sem_status(sa, 10, &st));
    cr_assert(redsem_status_exists(st));
    cr_assert_eq(redsem_status_strategy(st), (int)strategy);
    cr_assert_eq(redsem_status_limit(st), 2);
    cr_assert_eq(redsem_status_holder_count(st), 0);
    redsem_status_free(st);
    redsem_permit *p1 = NULL, *p2 = NULL;
    OK(a, redsem_sem_try_acquire(sa, &p1));
    OK(a, redsem_sem_try_acquire(sa, &p2));
    struct waiter_arg w = {.name = name, .strategy = strategy, .limit = 2, .timeout = 10000};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, waiter, &w), 0);
    for (int i = 0; i < 200 && tf_waiters(sa) == 0; i++)
        tf_sleep_ms(10);
    OK(a, redsem_sem_status(sa, 10, &st));
    cr_assert_eq(redsem_status_holder_count(st), 2);
    cr_assert_eq(redsem_status_waiter_count(st), 1);
    cr_assert_eq(redsem_status_holders_listed(st), 2);
    cr_assert_eq(redsem_status_waiters_listed(st), 1);
    bool seen1 = false, seen2 = false;
    for (size_t i = 0; i < 2; i++) {
        const char *id;
        uint64_t tok;
        int64_t left;
        OK(a, redsem_status_holder(st, i, &id, &tok, &left));
        cr_assert_gt(left, 8000);
        cr_assert_leq(left, 10000);
        if (strcmp(id, redsem_permit_id(p1)) == 0)
            seen1 = tok == redsem_permit_token(p1);
        if (strcmp(id, redsem_permit_id(p2)) == 0)
            seen2 = tok == redsem_permit_token(p2);
    }
    cr_assert(seen1 && seen2, "holders listed with their tokens");
    EXPECT(a, REDSEM_EINVAL, redsem_status_holder(st, 2, NULL, NULL, NULL));
    int64_t wleft;
    OK(a, redsem_status_waiter(st, 0, NULL, NULL, &wleft));
    cr_assert_gt(wleft, 0);
    redsem_status_free(st);
    OK(a, redsem_sem_status(sa, 1, &st));
    cr_assert_eq(redsem_status_holders_listed(st), 1);
    cr_assert_eq(redsem_status_holder_count(st), 2);
    redsem_status_free(st);
    OK(a, redsem_permit_release(p1));
    pthread_join(t, NULL);
    cr_assert_eq(w.rc, REDSEM_OK);
    OK(a, redsem_permit_release(p2));
    redsem_permit_free(p1);
    redsem_permit_free(p2);
    redsem_sem_free(sa);
    /* a semaphore nobody used does not exist */
    redsem_lock *l = NULL;
    OK(a, redsem_lock_open(a, tf_name("never"), 1000, &l));
    OK(a, redsem_lock_status(l, 5, &st));
    cr_assert_not(redsem_status_exists(st));
    redsem_status_free(st);
    redsem_lock_free(l);
    redsem_client_free(a);
}

STRATEGY_TEST(sem, every_key_has_a_ttl, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("ttl");
    redsem_sem *sem = open_sem(c, name, strategy, 1, 5000);
    redsem_permit *p = NULL, *q = NULL;
    OK(c, redsem_sem_try_acquire(sem, &p));
    struct waiter_arg w = {.name = name, .strategy = strategy, .limit = 1, .timeout = 400};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, waiter, &w), 0);
    tf_sleep_ms(100);
    char pattern[256], out[64];
    snprintf(pattern, sizeof pattern, "redsem:{%s}*", name);
    redisContext *rc = redisConnectUnix(tf_sock());
    cr_assert(rc && !rc->err);
    redisReply *keys = redisCommand(rc, "KEYS %s", pattern);
    cr_assert(keys && keys->type == REDIS_REPLY_ARRAY && keys->elements >= 2);
    for (size_t i = 0; i < keys->elements; i++) {
        redisReply *ttl = redisCommand(rc, "PTTL %s", keys->element[i]->str);
        /* -1: no TTL. -2: the key went away since KEYS (the locked strategy's guard is held
         * only while the waiter runs an attempt). */
        cr_assert(ttl && ttl->type == REDIS_REPLY_INTEGER && ttl->integer != -1,
                  "%s has no TTL", keys->element[i]->str);
        freeReplyObject(ttl);
    }
    freeReplyObject(keys);
    redisFree(rc);
    (void)out;
    (void)q;
    pthread_join(t, NULL);
    cr_assert_eq(w.rc, REDSEM_EBUSY);
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(sem);
    redsem_client_free(c);
}

STRATEGY_TEST(sem, inspect_by_name_records_nothing, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("inspect");
    redsem_status *st = NULL;
    OK(c, redsem_sem_inspect(c, name, 10, &st));
    cr_assert_not(redsem_status_exists(st));
    cr_assert_eq(redsem_status_holder_count(st), 0);
    redsem_status_free(st);
    /* inspecting did not record a configuration: any strategy and limit may open it */
    redsem_sem *s = open_sem(c, name, strategy, 2, 5000);
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    OK(c, redsem_sem_inspect(c, name, 10, &st));
    cr_assert(redsem_status_exists(st));
    cr_assert_eq(redsem_status_strategy(st), (int)strategy);
    cr_assert_eq(redsem_status_limit(st), 2);
    cr_assert_eq(redsem_status_holder_count(st), 1);
    const char *id;
    uint64_t tok;
    OK(c, redsem_status_holder(st, 0, &id, &tok, NULL));
    cr_assert_str_eq(id, redsem_permit_id(p));
    cr_assert_eq(tok, redsem_permit_token(p));
    redsem_status_free(st);
    EXPECT(c, REDSEM_EINVAL, redsem_sem_inspect(c, "bad name", 1, &st));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_inspect(c, name, 1, NULL));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* Found by the fault suite (scenario 2, a worker killed while holding the locked strategy's
 * guard): a queued fair/locked waiter that dies just as a permit is handed to it keeps its
 * rank until its wait lease ends. With a wait lease longer than the lease (the old default
 * was 3 s whatever the lease), a crashed waiter withheld a permit longer than a crashed
 * holder can. */
static void dead_entitled_waiter(redsem_strategy strategy)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("deadwaiter");
    redsem_sem *s = open_sem(c, name, strategy, 1, 500);
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        redsem_client *cc = NULL;
        redsem_sem *ss = NULL;
        redsem_permit *q = NULL;
        if (redsem_client_connect(tf_url(), &cc) != REDSEM_OK ||
            redsem_sem_open(cc, name, strategy, 1, 500, &ss) != REDSEM_OK)
            _exit(2);
        _exit(redsem_sem_acquire(ss, 20000, &q) == REDSEM_OK ? 0 : 1); /* queues, then waits */
    }
    int64_t until = tf_now_ms() + 5000;
    while (tf_waiters(s) == 0 && tf_now_ms() < until)
        tf_sleep_ms(2);
    cr_assert_eq(tf_waiters(s), 1, "the child never queued");
    kill(pid, SIGSTOP); /* it is now entitled by the release below, but never claims */
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int64_t t0 = tf_now_ms();
    int rc;
    while ((rc = redsem_sem_try_acquire(s, &p)) == REDSEM_EBUSY && tf_now_ms() - t0 < 5000)
        tf_sleep_ms(5);
    int64_t took = tf_now_ms() - t0;
    OK(c, rc);
    cr_assert_leq(took, 500 + 250, "the dead waiter's place came back after %lld ms (lease 500)",
                  (long long)took);
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

Test(sem, dead_entitled_waiter_gives_its_place_back_within_the_lease_fair, TO)
{
    dead_entitled_waiter(REDSEM_STRATEGY_FAIR);
}

Test(sem, dead_entitled_waiter_gives_its_place_back_within_the_lease_locked, TO)
{
    dead_entitled_waiter(REDSEM_STRATEGY_LOCKED);
}

/* Found by the fault suite (scenario 2, guard kill: waiters could not renew their wait lease
 * while the guard was stuck): a queued fair/locked waiter whose entry expired and was cleaned
 * up by another client's acquire made fair_acquire.lua compare ZRANK's false with a number,
 * and the waiter got REDSEM_ESERVER ("attempt to compare number with boolean"). It must
 * simply queue again (or take a free permit). */
static void expired_waiter_requeues(redsem_strategy strategy)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("expiredwaiter");
    redsem_sem *s = open_sem(c, name, strategy, 1, 5000);
    redsem_permit *p = NULL, *q = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        redsem_client *cc = NULL;
        redsem_sem *ss = NULL;
        if (redsem_client_connect(tf_url(), &cc) != REDSEM_OK ||
            redsem_sem_open(cc, name, strategy, 1, 5000, &ss) != REDSEM_OK ||
            redsem_sem_set_wait_lease_ms(ss, 30) != REDSEM_OK)
            _exit(100);
        int rc = redsem_sem_acquire(ss, 1500, &q);
        _exit(-rc); /* 0 OK, 1 EBUSY, 14 ESERVER ... */
    }
    int64_t until = tf_now_ms() + 5000;
    while (tf_waiters(s) == 0 && tf_now_ms() < until)
        tf_sleep_ms(1);
    cr_assert_eq(tf_waiters(s), 1, "the child never queued");
    kill(pid, SIGSTOP);
    tf_sleep_ms(100); /* its 30 ms wait lease runs out */
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(s, &q)); /* cleans the expired entry up */
    kill(pid, SIGCONT);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status));
    cr_assert_eq(WEXITSTATUS(status), -REDSEM_EBUSY, "the waiter got %s, expected REDSEM_EBUSY",
                 redsem_err_name(-WEXITSTATUS(status)));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

Test(sem, expired_queued_waiter_queues_again_fair, TO)
{
    expired_waiter_requeues(REDSEM_STRATEGY_FAIR);
}

Test(sem, expired_queued_waiter_queues_again_locked, TO)
{
    expired_waiter_requeues(REDSEM_STRATEGY_LOCKED);
}

/* ---------------------------------------------------------------- round trips */

/* Requests one try-acquire + refresh + release cycle sends, by the client's counter. */
static void cycle_requests(redsem_client *c, redsem_sem *s, uint64_t *acq, uint64_t *ref)
{
    redsem_client_stats st0, st1, st2;
    redsem_permit *p = NULL;
    OK(c, redsem_client_get_stats(c, &st0));
    OK(c, redsem_sem_try_acquire(s, &p));
    OK(c, redsem_client_get_stats(c, &st1));
    OK(c, redsem_permit_refresh(p));
    OK(c, redsem_client_get_stats(c, &st2));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    *acq = st1.requests - st0.requests;
    *ref = st2.requests - st1.requests;
}

/* A fresh client's first acquire and first refresh cost the round trips of a warm client's,
 * whether the server has the scripts cached or not (each script's first call is its SCRIPT
 * LOAD pipelined before its EVALSHA, one round trip; the SCRIPT LOAD is not counted in
 * stats.requests). And a locked acquire is two requests, the
 * guard and the script that checks and deletes it: the grant's reply is the last one, so
 * the caller's validity is not shortened by a trailing guard release. A private server: the
 * SCRIPT FLUSH must not disturb the suite's other tests. */
STRATEGY_TEST(sem, a_fresh_client_pays_no_extra_round_trip, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    char url[512];
    snprintf(url, sizeof url, "unix://%s", srv.sock);
    uint64_t want_acq = strategy == REDSEM_STRATEGY_LOCKED ? 2 : 1;
    redsem_client *warm = tf_client_for(url, -1, 0);
    redsem_sem *ws = open_sem(warm, "fresh", strategy, 1, 10000);
    uint64_t acq, ref, wacq, wref;
    cycle_requests(warm, ws, &acq, &ref); /* the client's first calls, on a cold server */
    cr_assert_eq(acq, want_acq, "first acquire on a cold server: %llu requests",
                 (unsigned long long)acq);
    cr_assert_eq(ref, 1, "first refresh on a cold server: %llu requests", (unsigned long long)ref);
    cycle_requests(warm, ws, &wacq, &wref);
    cr_assert_eq(wacq, want_acq, "warm acquire: %llu requests", (unsigned long long)wacq);
    cr_assert_eq(wref, 1, "warm refresh: %llu requests", (unsigned long long)wref);
    for (int flushed = 0; flushed < 2; flushed++) {
        if (flushed)
            cr_assert_eq(ts_command(&srv, NULL, 0, "SCRIPT", "FLUSH", NULL), 0);
        redsem_client *fresh = tf_client_for(url, -1, 0);
        redsem_sem *fs = open_sem(fresh, "fresh", strategy, 1, 10000);
        cycle_requests(fresh, fs, &acq, &ref);
        cr_assert_eq(acq, wacq, "%s server: a fresh client's first acquire took %llu requests, "
                     "a warm one's %llu", flushed ? "flushed" : "warm",
                     (unsigned long long)acq, (unsigned long long)wacq);
        cr_assert_eq(ref, wref, "%s server: a fresh client's first refresh took %llu requests, "
                     "a warm one's %llu", flushed ? "flushed" : "warm",
                     (unsigned long long)ref, (unsigned long long)wref);
        redsem_sem_free(fs);
        redsem_client_free(fresh);
    }
    redsem_sem_free(ws);
    redsem_client_free(warm);
    ts_server_stop(&srv);
}

/* ---------------------------------------------------------------- expiry takeover */

/* A holder that never releases (it crashed): the waiter must be granted when the lease ends
 * on the server, not when the server's event loop next wakes up. Redis fires a BLPOP timeout
 * only on a wake-up of its loop; an idle server with hz 1 wakes once a second, so a waiter
 * that relied on the server's timeout would be granted 0-1000 ms after the expiry (uniformly:
 * it fails the 100 ms bound below 9 times in 10, three rounds 999 in 1000). Both instants are
 * read on the server's clock: a fencing token is the server's clock in us at the grant, and
 * the lease ends at the holder's grant (ms) + lease. The 100 ms bound is 50 times the library's
 * own 2 ms margin, for a loaded machine; the waiter must never be granted before the end. */
STRATEGY_TEST(sem, an_expired_lease_is_taken_over_at_once, TO)
{
    static const char *const hz1[] = {"--hz", "1", NULL};
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, hz1, false), 0);
    char url[512];
    snprintf(url, sizeof url, "unix://%s", srv.sock);
    redsem_client *h = tf_client_for(url, -1, 0), *w = tf_client_for(url, -1, 0);
    const int64_t lease = 300;
    for (int round = 0; round < 3; round++) {
        char name[32];
        snprintf(name, sizeof name, "takeover-%d", round);
        redsem_sem *hs = open_sem(h, name, strategy, 1, lease);
        redsem_sem *ws = open_sem(w, name, strategy, 1, lease);
        redsem_permit *hp = NULL, *wp = NULL;
        OK(h, redsem_sem_try_acquire(hs, &hp)); /* never released */
        redsem_client_stats st0, st1;
        OK(w, redsem_client_get_stats(w, &st0));
        OK(w, redsem_sem_acquire(ws, 5000, &wp));
        OK(w, redsem_client_get_stats(w, &st1));
        int64_t end_ms = (int64_t)(redsem_permit_token(hp) / 1000) + lease;
        int64_t late_us = (int64_t)redsem_permit_token(wp) - end_ms * 1000;
        cr_assert_geq(late_us, 0, "round %d: granted %lld us BEFORE the holder's lease ended",
                      round, (long long)-late_us);
        cr_assert_lt(late_us, 100000,
                     "round %d: granted %lld ms after the holder's lease ended (server clock; "
                     "%llu requests, %llu connects): the wait ended on the server's tick",
                     round, (long long)(late_us / 1000),
                     (unsigned long long)(st1.requests - st0.requests),
                     (unsigned long long)(st1.connects - st0.connects));
        OK(w, redsem_permit_release(wp));
        redsem_permit_free(wp);
        redsem_permit_free(hp);
        redsem_sem_free(hs);
        redsem_sem_free(ws);
    }
    redsem_client_free(h);
    redsem_client_free(w);
    ts_server_stop(&srv);
}

/* Found by the fault suite (scenario 12, CLIENT KILL during a locked wait with a retry window
 * of 0, under load): an attempt whose guard_acquire the server applied but whose reply was
 * lost left the guard under the waiter's own id for the guard lease, and the same attempt
 * asking again was told "busy". The waiter leaving the queue after the lost connection
 * could not leave, and its entry withheld the permit that the holder's release handed to it
 * until its wait lease ended: the next acquire got REDSEM_EBUSY. The lost reply is
 * simulated by setting the guard under the holder's id, as that request had. */
Test(sem, own_guard_left_by_a_lost_reply_is_taken_again_locked, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("ownguard");
    redsem_sem *s = open_sem(c, name, REDSEM_STRATEGY_LOCKED, 1, 10000);
    OK(c, redsem_sem_set_guard_lease_ms(s, 10000));
    char id[REDSEM_ID_BUFSIZE], other[REDSEM_ID_BUFSIZE], key[256], out[64];
    redsem_id_generate(id);
    redsem_id_generate(other);
    snprintf(key, sizeof key, "redsem:{%s}:lock", name);
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "SET", key, id, "PX", "10000", NULL), 0);
    /* busy until the guard expired (10 s) before the fix: REDSEM_EBUSY after 500 ms */
    redsem_permit *p = NULL;
    OK(c, redsem_sem_acquire_as(s, id, 500, &p));
    /* and the attempt dropped it as usual */
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "EXISTS", key, NULL), 0);
    cr_assert_str_eq(out, "0", "the guard was left behind");
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    p = NULL;
    /* a guard held under another id still excludes: busy although the permit is free */
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "SET", key, other, "PX", "10000", NULL), 0);
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(s, &p));
    cr_assert_null(p);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "GET", key, NULL), 0);
    cr_assert_str_eq(out, other, "the other id's guard was touched");
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- script cache eviction */

/* A field of INFO (e.g. "evicted_scripts" in stats, "calls" of "cmdstat_eval" in
 * commandstats): its number, or -1 if the server does not report it. */
static long long info_number(const ts_server *srv, const char *section, const char *line,
                             const char *sub)
{
    static char out[1 << 16];
    cr_assert_eq(ts_command(srv, out, sizeof out, "INFO", section, NULL), 0, "INFO: %s", out);
    char want[128];
    snprintf(want, sizeof want, "\n%s:", line);
    const char *p = strstr(out, want);
    if (p == NULL)
        return -1;
    p += strlen(want);
    if (sub != NULL) {
        char s[64];
        snprintf(s, sizeof s, "%s=", sub);
        const char *eol = strchr(p, '\r');
        const char *q = strstr(p, s);
        if (q == NULL || (eol != NULL && q > eol))
            return -1;
        p = q + strlen(s);
    }
    return strtoll(p, NULL, 10);
}

/* Another application EVALs 600 distinct scripts between each of redsem's rounds. Valkey 8
 * and Redis 7.4 keep at most 500 scripts that came by EVAL (least recently used evicted)
 * and never evict one loaded by SCRIPT LOAD: redsem's scripts, loaded by SCRIPT LOAD with
 * their first EVALSHA, must never meet NOSCRIPT (redsem <= 0.4.6 sent bodies by EVAL: 95
 * NOSCRIPT in 60 pairs on Valkey 8). On a server that does not evict (Redis 7.0) the test
 * checks the same thing from the server's own counters: every EVAL it ran was the other
 * application's, and every body redsem sent went by SCRIPT LOAD, once per script. Run it
 * against another server with REDSEM_REDIS_SERVER=/path/to/valkey-server. */
STRATEGY_TEST(sem, scripts_survive_an_application_that_evals_many, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    char url[512];
    snprintf(url, sizeof url, "unix://%s", srv.sock);
    redsem_client *c = tf_client_for(url, -1, 0);
    redsem_client *d = tf_client_for(url, -1, 0); /* another holder's client */
    redsem_sem *s = open_sem(c, "evict", strategy, 1, 10000);
    redsem_sem *ds = open_sem(d, "evict", strategy, 1, 10000);
    redisContext *app = redisConnectUnix(srv.sock);
    cr_assert(app != NULL && !app->err);
    enum { ROUNDS = 5, DISTINCT = 600 };
    long long evals = 0;
    for (int round = 0; round < ROUNDS; round++) {
        redsem_permit *p = NULL, *q = NULL;
        OK(c, redsem_sem_acquire(s, 2000, &p));
        OK(c, redsem_permit_refresh(p));
        /* a try that finds the permit taken, then a release that frees it */
        EXPECT(d, REDSEM_EBUSY, redsem_sem_try_acquire(ds, &q));
        OK(c, redsem_permit_release(p));
        OK(d, redsem_sem_acquire(ds, 2000, &q));
        OK(d, redsem_permit_release(q));
        redsem_permit_free(p);
        redsem_permit_free(q);
        cr_assert_eq(holders_now(s), 0);
        for (int i = 0; i < DISTINCT; i++) {
            char body[64];
            snprintf(body, sizeof body, "return 'application script %d'", round * DISTINCT + i);
            cr_assert_eq(redisAppendCommand(app, "EVAL %s 0", body), REDIS_OK);
        }
        for (int i = 0; i < DISTINCT; i++) {
            redisReply *r = NULL;
            cr_assert_eq(redisGetReply(app, (void **)&r), REDIS_OK);
            cr_assert(r != NULL && r->type == REDIS_REPLY_STRING, "EVAL: %s",
                      r && r->str ? r->str : "?");
            freeReplyObject(r);
        }
        evals += DISTINCT;
    }
    redisFree(app);
    redsem_client_stats sc, sd;
    OK(c, redsem_client_get_stats(c, &sc));
    OK(d, redsem_client_get_stats(d, &sd));
    cr_assert_eq(sc.noscript + sd.noscript, 0, "redsem met %llu NOSCRIPT replies",
                 (unsigned long long)(sc.noscript + sd.noscript));
    long long evicted = info_number(&srv, "stats", "evicted_scripts", NULL);
    long long eval_calls = info_number(&srv, "commandstats", "cmdstat_eval", "calls");
    long long load_calls = info_number(&srv, "commandstats", "cmdstat_script|load", "calls");
    unsigned long long loads = sc.script_loads + sd.script_loads;
    cr_log_info("%s: evicted_scripts %lld, EVAL calls %lld, SCRIPT LOAD calls %lld, redsem "
                "loads %llu", ts_redis_server_path(), evicted, eval_calls, load_calls, loads);
    cr_assert_eq(eval_calls, evals, "the server ran %lld EVALs, the application sent %lld: "
                 "redsem sent bodies by EVAL", eval_calls, evals);
    cr_assert_eq(load_calls, (long long)loads, "SCRIPT LOAD calls %lld, redsem's loads %llu",
                 load_calls, loads);
    /* each script once per client: sem_open, acquire, refresh, release, status (and
     * locked: guard_acquire) on c; sem_open, acquire, release (guard_acquire) on d */
    cr_assert_leq(sc.script_loads, 6, "%llu loads", (unsigned long long)sc.script_loads);
    cr_assert_leq(sd.script_loads, 4, "%llu loads", (unsigned long long)sd.script_loads);
    if (evicted >= 0) /* a server that evicts: the application's scripts were evicted */
        cr_assert_gt(evicted, 0, "the server evicted no script: the test proves nothing here");
    redsem_sem_free(s);
    redsem_sem_free(ds);
    redsem_client_free(c);
    redsem_client_free(d);
    ts_server_stop(&srv);
}

/* A user whose ACL refuses SCRIPT LOAD (but allows EVAL and EVALSHA) loses nothing: the
 * refused SCRIPT LOAD and the NOSCRIPT of the EVALSHA after it are answered with EVAL of
 * the body, once per script, and later bodies go by EVAL at once; the NOSCRIPT that follows
 * a refused SCRIPT LOAD is not counted as a lost script. */
Test(sem, a_user_without_script_load_sends_bodies_by_eval, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    char out[256], url[512];
    cr_assert_eq(ts_command(&srv, out, sizeof out, "ACL", "SETUSER", "dave", "on", ">pw",
                            "~redsem:*", "+@all", "-script", NULL), 0, "%s", out);
    snprintf(url, sizeof url, "unix://dave:pw@%s", srv.sock);
    redsem_client *c = tf_client_for(url, -1, 0);
    redsem_sem *s = open_sem(c, "noload", REDSEM_STRATEGY_FAIR, 1, 10000);
    for (int i = 0; i < 3; i++) {
        redsem_permit *p = NULL;
        OK(c, redsem_sem_acquire(s, 2000, &p));
        OK(c, redsem_permit_refresh(p));
        OK(c, redsem_permit_release(p));
        redsem_permit_free(p);
    }
    redsem_client_stats st;
    OK(c, redsem_client_get_stats(c, &st));
    cr_assert_eq(st.noscript, 0, "%llu NOSCRIPT counted", (unsigned long long)st.noscript);
    /* sem_open's SCRIPT LOAD was refused, then its EVAL; the other three by EVAL at once */
    cr_assert_eq(st.script_loads, 5, "%llu loads", (unsigned long long)st.script_loads);
    redsem_sem_free(s);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

/* ---------------------------------------------------------------- planted wake-up fields */

/* Every key name on srv, sorted, one per line, into out. */
static void all_keys(const ts_server *srv, char *out, size_t outlen)
{
    redisContext *rc = redisConnectUnix(srv->sock);
    cr_assert(rc != NULL && !rc->err);
    redisReply *r = redisCommand(rc, "KEYS *");
    cr_assert(r != NULL && r->type == REDIS_REPLY_ARRAY);
    out[0] = '\0';
    for (size_t i = 0; i < r->elements; i++) {
        size_t l = strlen(out);
        snprintf(out + l, outlen - l, "%s\n", r->element[i]->str);
    }
    freeReplyObject(r);
    redisFree(rc);
}

/* The c:<id> and L:<id> fields of a fair semaphore's meta hash are data: a user who can
 * write the semaphore's keys could plant a waiter whose "client id list" is any key, and a
 * "lease" that makes a write fail after others. A release that grants such a waiter must
 * write nothing outside redsem's keys (no key outside the prefix is created or changed) and
 * must not fail halfway (it returns REDSEM_OK, and the waiter holds the permit with a sane
 * deadline). A private server: the test lists every key. */
Test(sem, planted_wake_fields_write_nothing_outside_redsem, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    char url[512];
    snprintf(url, sizeof url, "unix://%s", srv.sock);
    redsem_client *c = tf_client_for(url, -1, 0);
    redisContext *rc = redisConnectUnix(srv.sock);
    cr_assert(rc != NULL && !rc->err);
    /* someone else's keys: a list, a hash, a string */
    freeReplyObject(redisCommand(rc, "RPUSH victim keep"));
    freeReplyObject(redisCommand(rc, "HSET victim:hash f v"));
    freeReplyObject(redisCommand(rc, "SET victim:string v"));
    static const char *const lists[] = {
        "victim", "victim:hash", "victim:string", "other:wake:0123456789abcdef:ids",
        "redsem:wake:0123456789ABCDEF:ids", "redsem:wake:0123456789abcdef:ids:x", "",
    };
    static const char *const leases[] = {
        "inf", "1e400", "nan", "-5", "0", "99999999999999999999", "abc", "", "2592000001",
        "1e3", " 10", "10000",
    };
    const char *fake = "abababababababababababababababababababab"; /* a holder id's form */
    int n = 0;
    for (size_t li = 0; li < sizeof lists / sizeof *lists; li++)
        for (size_t ei = 0; ei < sizeof leases / sizeof *leases; ei++) {
            char name[64];
            snprintf(name, sizeof name, "planted%d", n++);
            redsem_sem *s = open_sem(c, name, REDSEM_STRATEGY_FAIR, 1, 10000);
            redsem_permit *p = NULL;
            OK(c, redsem_sem_try_acquire(s, &p));
            /* a queued waiter planted by hand, with a wait lease of a minute */
            redisReply *r = redisCommand(rc, "EVAL %s 3 redsem:{%s}:meta redsem:{%s}:owners "
                                         "redsem:{%s}:timeouts %s %s %s",
                                         "local t = redis.call('TIME') "
                                         "redis.call('ZADD', KEYS[2], '1', ARGV[1]) "
                                         "redis.call('ZADD', KEYS[3], t[1] * 1000 + 60000, "
                                         "ARGV[1]) "
                                         "redis.call('HSET', KEYS[1], 'q', '1', 'c:' .. ARGV[1], "
                                         "ARGV[2], 'L:' .. ARGV[1], ARGV[3]) "
                                         "return 1",
                                         name, name, name, fake, lists[li], leases[ei]);
            cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER, "plant: %s",
                      r && r->str ? r->str : "?");
            freeReplyObject(r);
            OK(c, redsem_permit_release(p));
            redsem_permit_free(p);
            /* the planted waiter holds the permit, with a deadline within a minute from now
             * (its wait lease, or a direct grant of at most the lease it asked for) */
            redsem_status *st = NULL;
            OK(c, redsem_sem_status(s, 4, &st));
            cr_assert_eq(redsem_status_holder_count(st), 1, "list '%s', lease '%s'", lists[li],
                         leases[ei]);
            cr_assert_eq(redsem_status_waiter_count(st), 0);
            int64_t left = -1;
            cr_assert_eq(redsem_status_holder(st, 0, NULL, NULL, &left), REDSEM_OK);
            cr_assert(left > 0 && left <= 60000, "list '%s', lease '%s': %lld ms left",
                      lists[li], leases[ei], (long long)left);
            redsem_status_free(st);
            r = redisCommand(rc, "PTTL redsem:{%s}:meta", name);
            cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer > 10000,
                      "list '%s', lease '%s': meta's TTL %lld", lists[li], leases[ei],
                      r ? r->integer : -9);
            freeReplyObject(r);
            redsem_sem_free(s);
        }
    /* nothing outside the prefix was created or changed */
    char keys[1 << 16];
    all_keys(&srv, keys, sizeof keys);
    for (char *line = keys, *nl; *line != '\0'; line = nl + 1) {
        nl = strchr(line, '\n');
        *nl = '\0';
        cr_assert(strncmp(line, "redsem:", 7) == 0 || strcmp(line, "victim") == 0 ||
                      strcmp(line, "victim:hash") == 0 || strcmp(line, "victim:string") == 0,
                  "a key outside redsem's: '%s'", line);
        cr_assert(strstr(line, "0123456789") == NULL, "a planted list was written: '%s'",
                  line);
    }
    redisReply *r = redisCommand(rc, "LRANGE victim 0 -1");
    cr_assert(r != NULL && r->elements == 1 && strcmp(r->element[0]->str, "keep") == 0,
              "the list 'victim' was written (%zu elements)", r ? r->elements : 0);
    freeReplyObject(r);
    r = redisCommand(rc, "HLEN victim:hash");
    cr_assert(r != NULL && r->integer == 1);
    freeReplyObject(r);
    r = redisCommand(rc, "PTTL victim");
    cr_assert(r != NULL && r->integer == -1, "the list 'victim' was given a TTL");
    freeReplyObject(r);
    redisFree(rc);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

/* ---------------------------------------------------------------- partly evicted keys */

/* A server whose maxmemory policy evicts keys (anything but noeviction) may evict the meta
 * hash alone. The next acquire then found a "new" semaphore and, the meta hash's count gone
 * (fair: used; basic: extra, the weights above 1), granted past the limit: a second holder
 * of a limit-1 fair semaphore, a third and fourth permit of a limit-2 basic one held by a
 * weight-2 permit (issue 29.3). The scripts refuse instead while the deadline set has live
 * entries, with an error that says so; nothing is granted or written. The holder's release
 * finds its record gone (REDSEM_ELOST) and removes its entry, after which the name works
 * again. */
STRATEGY_TEST(sem, an_evicted_meta_hash_gives_no_second_holder, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("evicted");
    uint32_t limit = strategy == REDSEM_STRATEGY_BASIC ? 2 : 1;
    redsem_sem *s = open_sem(c, name, strategy, limit, 10000);
    redsem_permit *p = NULL, *q = NULL;
    OK(c, redsem_sem_acquire_n(s, limit, 1000, &p));
    char meta[600];
    snprintf(meta, sizeof meta, "redsem:{%s}:meta", name);
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "DEL", meta, NULL), 0);
    EXPECT(c, REDSEM_ESERVER, redsem_sem_try_acquire(s, &q));
    cr_assert(strstr(redsem_client_errmsg(c), "partly missing (evicted?)") != NULL, "%s",
              redsem_client_errmsg(c));
    EXPECT(c, REDSEM_ESERVER, redsem_sem_acquire(s, 200, &q));
    cr_assert_null(q);
    char out[64];
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "EXISTS", meta, NULL), 0);
    cr_assert_str_eq(out, "0", "the refused acquires wrote the meta hash");
    /* a new handle's open records a fresh meta hash (strategy and limit only): its
     * acquires and set_limit are refused the same way */
    redsem_sem *s2 = open_sem(c, name, strategy, limit, 10000);
    EXPECT(c, REDSEM_ESERVER, redsem_sem_try_acquire(s2, &q));
    EXPECT(c, REDSEM_ESERVER, redsem_sem_set_limit(s2, limit + 1));
    cr_assert(strstr(redsem_client_errmsg(c), "partly missing (evicted?)") != NULL, "%s",
              redsem_client_errmsg(c));
    redsem_sem_free(s2);
    if (strategy == REDSEM_STRATEGY_BASIC) {
        OK(c, redsem_permit_release(p)); /* basic: its entry is the holders set's */
    } else {
        EXPECT(c, REDSEM_ELOST, redsem_permit_release(p));
    }
    OK(c, redsem_sem_try_acquire(s, &q));
    OK(c, redsem_permit_release(q));
    redsem_permit_free(p);
    redsem_permit_free(q);
    redsem_sem_free(s);
    redsem_client_free(c);
}
