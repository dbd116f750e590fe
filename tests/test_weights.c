/* Weighted acquire (issue 12): n permits as one permit object, for each strategy.
 * The limit is checked by an independent counter in shared memory (processes), FIFO order
 * with mixed weights by fencing tokens (tokens increase in grant order), the unknown outcome
 * of a weighted acquire by a proxy that drops the acquire scripts' replies. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"
#include "fixture.h"

#define TO .timeout = 120

/* proxy.c's clock (the fault suite's witness.c has it; this binary links proxy.c alone) */
int64_t fw_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static redsem_sem *open_sem(redsem_client *c, const char *name, redsem_strategy s, uint32_t limit,
                            int64_t lease)
{
    redsem_sem *sem = NULL;
    OK(c, redsem_sem_open(c, name, s, limit, lease, &sem));
    return sem;
}

/* permits in use, holders, waiters, as the server's status says */
typedef struct usage {
    uint64_t in_use;
    size_t holders, waiters;
    uint64_t listed_weight; /* the listed holders' weights summed */
} usage;

static usage usage_of(redsem_sem *sem)
{
    redsem_status *st = NULL;
    cr_assert_eq(redsem_sem_status(sem, 100, &st), REDSEM_OK);
    usage u = {redsem_status_permits_in_use(st), redsem_status_holder_count(st),
               redsem_status_waiter_count(st), 0};
    for (size_t i = 0; i < redsem_status_holders_listed(st); i++)
        u.listed_weight += redsem_status_holder_weight(st, i);
    redsem_status_free(st);
    return u;
}

static void release_free(redsem_client *c, redsem_permit *p)
{
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
}

/* ---------------------------------------------------------------- basics and bad input */

STRATEGY_TEST(weights, all_or_nothing_and_status, TO)
{
    redsem_client *c = tf_client();
    redsem_sem *sem = open_sem(c, tf_name("w"), strategy, 5, 10000);
    redsem_permit *a = NULL, *b = NULL, *x = (redsem_permit *)0x1;
    OK(c, redsem_sem_acquire_n(sem, 3, 1000, &a));
    cr_assert_eq(redsem_permit_weight(a), 3);
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire_n(sem, 3, &x));
    cr_assert_eq(x, (redsem_permit *)0x1, "out-param written on EBUSY");
    usage u = usage_of(sem);
    cr_assert_eq(u.in_use, 3, "a refused request for 3 took some: %llu in use",
                 (unsigned long long)u.in_use);
    OK(c, redsem_sem_try_acquire_n(sem, 2, &b));
    u = usage_of(sem);
    cr_assert_eq(u.in_use, 5);
    cr_assert_eq(u.holders, 2);
    cr_assert_eq(u.listed_weight, 5);
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(sem, &x));
    OK(c, redsem_permit_refresh(a));
    release_free(c, a);
    cr_assert_eq(usage_of(sem).in_use, 2);
    OK(c, redsem_sem_try_acquire_n(sem, 3, &a));
    cr_assert_gt(redsem_permit_token(a), redsem_permit_token(b));
    release_free(c, a);
    release_free(c, b);
    u = usage_of(sem);
    cr_assert_eq(u.in_use, 0);
    cr_assert_eq(u.holders, 0);
    /* a weight-1 permit says so */
    OK(c, redsem_sem_try_acquire(sem, &a));
    cr_assert_eq(redsem_permit_weight(a), 1);
    cr_assert_eq(usage_of(sem).in_use, 1);
    release_free(c, a);
    redsem_sem_free(sem);
    redsem_client_free(c);
}

STRATEGY_TEST(weights, bad_input_writes_nothing, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("bad");
    redsem_sem *sem = open_sem(c, name, strategy, 3, 10000);
    redsem_permit *x = (redsem_permit *)0x1;
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_n(sem, 0, 100, &x));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_try_acquire_n(sem, 4, &x));
    cr_assert(strstr(redsem_client_errmsg(c), "limit on the server is 3") != NULL, "%s",
              redsem_client_errmsg(c));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_n(sem, 4, REDSEM_WAIT_FOREVER, &x));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_n(sem, REDSEM_LIMIT_MAX + 1, 100, &x));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_as_n(sem, NULL, 2, 100, &x));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_n(NULL, 2, 100, &x));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_n(sem, 2, 100, NULL));
    cr_assert_eq(x, (redsem_permit *)0x1);
    usage u = usage_of(sem);
    cr_assert_eq(u.in_use + u.holders + u.waiters, 0);

    /* one holder id is one permit object: another weight is refused, nothing changes */
    char id[REDSEM_ID_BUFSIZE];
    redsem_id_generate(id);
    redsem_permit *p = NULL, *q = NULL;
    OK(c, redsem_sem_acquire_as_n(sem, id, 2, 1000, &p));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_as_n(sem, id, 1, 1000, &x));
    cr_assert(strstr(redsem_client_errmsg(c), "already holds") != NULL, "%s",
              redsem_client_errmsg(c));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_as(sem, id, 0, &x));
    cr_assert_eq(usage_of(sem).in_use, 2);
    /* the same weight is the idempotent retry: the same permit */
    OK(c, redsem_sem_acquire_as_n(sem, id, 2, 0, &q));
    cr_assert_eq(redsem_permit_token(q), redsem_permit_token(p));
    cr_assert_eq(usage_of(sem).in_use, 2);
    release_free(c, p);
    redsem_permit_free(q);
    cr_assert_eq(usage_of(sem).in_use, 0);

    /* a limit lowered below a waiting request's weight: it leaves with EINVAL */
    redsem_sem *other = open_sem(c, name, strategy, 3, 10000);
    OK(c, redsem_sem_try_acquire(sem, &p));
    OK(c, redsem_sem_set_limit(other, 2));
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_n(sem, 3, 500, &x));
    u = usage_of(sem);
    cr_assert_eq(u.in_use, 1);
    cr_assert_eq(u.waiters, 0);
    release_free(c, p);
    redsem_sem_free(other);
    redsem_sem_free(sem);
    redsem_client_free(c);
}

/* An expired weighted holder gives its weight back (the cleanup of expired holders), and
 * its own id can take a permit again. */
STRATEGY_TEST(weights, expired_weights_are_given_back, TO)
{
    redsem_client *c = tf_client();
    redsem_sem *sem = open_sem(c, tf_name("exp"), strategy, 4, 200);
    char id[REDSEM_ID_BUFSIZE];
    redsem_id_generate(id);
    redsem_permit *p = NULL, *q = NULL;
    OK(c, redsem_sem_acquire_as_n(sem, id, 3, 0, &p));
    tf_sleep_ms(400);
    cr_assert_eq(usage_of(sem).in_use, 0, "an expired holder still counted");
    redsem_permit_free(p);
    OK(c, redsem_sem_acquire_n(sem, 4, 0, &q));
    release_free(c, q);
    OK(c, redsem_sem_acquire_as_n(sem, id, 3, 0, &q));
    tf_sleep_ms(400);
    /* its own id again, with another weight, after the lease ran out */
    redsem_permit *r = NULL;
    OK(c, redsem_sem_acquire_as_n(sem, id, 2, 0, &r));
    cr_assert_eq(usage_of(sem).in_use, 2);
    OK(c, redsem_sem_acquire_n(sem, 2, 0, &p));
    release_free(c, p);
    release_free(c, r);
    redsem_permit_free(q);
    cr_assert_eq(usage_of(sem).in_use, 0);
    redsem_sem_free(sem);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- never above the limit */

typedef struct shared {
    atomic_int inside; /* permits held, counted by the workers */
    atomic_int max_inside;
    atomic_int grants;
    atomic_int errors;
    atomic_int last_error;
} shared;

static void *shared_map(size_t size)
{
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(m, MAP_FAILED);
    memset(m, 0, size);
    return m;
}

static void count_in(shared *sh, int w)
{
    int now = atomic_fetch_add(&sh->inside, w) + w;
    int seen = atomic_load(&sh->max_inside);
    while (now > seen && !atomic_compare_exchange_weak(&sh->max_inside, &seen, now))
        ;
    atomic_fetch_add(&sh->grants, 1);
}

static void weighted_worker(shared *sh, const char *name, redsem_strategy strategy,
                            uint32_t limit, uint32_t weight, int iterations, unsigned seed)
{
    redsem_client *c = NULL;
    redsem_sem *s = NULL;
    int rc = redsem_client_connect(tf_url(), &c);
    if (rc == REDSEM_OK)
        rc = redsem_sem_open(c, name, strategy, limit, 10000, &s);
    for (int i = 0; rc == REDSEM_OK && i < iterations; i++) {
        redsem_permit *p = NULL;
        rc = redsem_sem_acquire_n(s, weight, 30000, &p);
        if (rc != REDSEM_OK)
            break;
        count_in(sh, (int)weight);
        usleep((useconds_t)(rand_r(&seed) % 3000));
        atomic_fetch_sub(&sh->inside, (int)weight);
        rc = redsem_permit_release(p);
        redsem_permit_free(p);
    }
    if (rc != REDSEM_OK) {
        atomic_fetch_add(&sh->errors, 1);
        atomic_store(&sh->last_error, rc);
    }
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* Six processes asking for 1, 2 or 3 of 6 permits: the permits held, counted outside
 * Redis, never exceed 6, and the semaphore is used to the full (some moment has 5 or 6). */
STRATEGY_TEST(weights, processes_never_hold_more_than_the_limit, TO)
{
    shared *sh = shared_map(sizeof *sh);
    const char *name = tf_name("procs");
    enum { NPROC = 6, ITER = 25, LIMIT = 6 };
    pid_t pids[NPROC];
    for (int i = 0; i < NPROC; i++) {
        pids[i] = fork();
        cr_assert_geq(pids[i], 0);
        if (pids[i] == 0) {
            weighted_worker(sh, name, strategy, LIMIT, 1 + (uint32_t)i % 3, ITER,
                            (unsigned)getpid());
            _exit(0);
        }
    }
    for (int i = 0; i < NPROC; i++) {
        int st = 0;
        cr_assert_eq(waitpid(pids[i], &st, 0), pids[i]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    cr_assert_eq(atomic_load(&sh->errors), 0, "a worker failed: %s",
                 redsem_err_name(atomic_load(&sh->last_error)));
    cr_assert_eq(atomic_load(&sh->grants), NPROC * ITER);
    cr_assert_leq(atomic_load(&sh->max_inside), LIMIT, "%d permits held at once (limit %d)",
                  atomic_load(&sh->max_inside), LIMIT);
    cr_assert_geq(atomic_load(&sh->max_inside), LIMIT - 1);
    munmap(sh, sizeof *sh);
}

/* Two jobs that each need 2 of 3 permits: taken one by one, each can hold 1 and wait for
 * the second forever (shown first, with try-acquires); taken as one weighted permit, both
 * finish every round. */
struct job {
    const char *name;
    redsem_strategy strategy;
    int rounds, done, rc;
};

static void *job_run(void *arg)
{
    struct job *j = arg;
    redsem_client *c = tf_client();
    redsem_sem *s = open_sem(c, j->name, j->strategy, 3, 10000);
    for (int i = 0; i < j->rounds; i++) {
        redsem_permit *p = NULL;
        j->rc = redsem_sem_acquire_n(s, 2, 30000, &p);
        if (j->rc != REDSEM_OK)
            break;
        usleep(2000);
        j->rc = redsem_permit_release(p);
        redsem_permit_free(p);
        if (j->rc != REDSEM_OK)
            break;
        j->done++;
    }
    redsem_sem_free(s);
    redsem_client_free(c);
    return NULL;
}

STRATEGY_TEST(weights, two_jobs_needing_two_of_three_never_deadlock, TO)
{
    const char *name = tf_name("jobs");
    redsem_client *c = tf_client();
    redsem_sem *s = open_sem(c, name, strategy, 3, 10000);
    /* one by one: job A's first permit, job B's first, a third party's: neither second */
    redsem_permit *a1 = NULL, *b1 = NULL, *t = NULL, *x = NULL;
    OK(c, redsem_sem_try_acquire(s, &a1));
    OK(c, redsem_sem_try_acquire(s, &b1));
    OK(c, redsem_sem_try_acquire(s, &t));
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(s, &x));
    release_free(c, a1);
    release_free(c, b1);
    release_free(c, t);
    struct job j[2] = {{name, strategy, 40, 0, 0}, {name, strategy, 40, 0, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, job_run, &j[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(j[i].done, 40, "job %d: %d rounds, %s", i, j[i].done,
                     redsem_err_name(j[i].rc));
    cr_assert_eq(usage_of(s).in_use, 0);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- FIFO with weights */

struct smalls {
    const char *name;
    redsem_strategy strategy;
    atomic_int stop;
    atomic_int big_queued;      /* set once the big request is seen in the queue */
    _Atomic uint64_t big_token; /* its token once granted */
    atomic_int after;           /* small grants requested after the big one queued */
    atomic_int overtook;        /* ... granted before it (smaller token) */
    atomic_int errors;
    uint64_t tokens[4096];
    int queued_after[4096];
    atomic_int n;
};

struct small {
    struct smalls *sm;
    uint32_t weight;
};

static void *small_run(void *arg)
{
    struct smalls *sm = ((struct small *)arg)->sm;
    uint32_t weight = ((struct small *)arg)->weight;
    redsem_client *c = tf_client();
    redsem_sem *s = open_sem(c, sm->name, sm->strategy, 4, 10000);
    while (!atomic_load(&sm->stop)) {
        int queued = atomic_load(&sm->big_queued);
        redsem_permit *p = NULL;
        int rc = redsem_sem_acquire_n(s, weight, 30000, &p);
        if (rc != REDSEM_OK) {
            atomic_fetch_add(&sm->errors, 1);
            break;
        }
        int k = atomic_fetch_add(&sm->n, 1);
        if (k < 4096) {
            sm->tokens[k] = redsem_permit_token(p);
            sm->queued_after[k] = queued;
        }
        usleep(3000);
        (void)redsem_permit_release(p);
        redsem_permit_free(p);
    }
    redsem_sem_free(s);
    redsem_client_free(c);
    return NULL;
}

static bool queued(redsem_sem *s, const char *id)
{
    redsem_status *st = NULL;
    cr_assert_eq(redsem_sem_status(s, 100, &st), REDSEM_OK);
    bool found = false;
    for (size_t i = 0; i < redsem_status_waiters_listed(st); i++) {
        const char *w = NULL;
        cr_assert_eq(redsem_status_waiter(st, i, &w, NULL, NULL), REDSEM_OK);
        found = found || strcmp(w, id) == 0;
    }
    redsem_status_free(st);
    return found;
}

struct big {
    redsem_sem *s;
    char id[REDSEM_ID_BUFSIZE];
    redsem_permit *p;
    int rc;
};

static void *big_run(void *arg)
{
    struct big *b = arg;
    b->rc = redsem_sem_acquire_as_n(b->s, b->id, 4, 60000, &b->p);
    return NULL;
}

/* Three threads keep taking 1, 2 and 1 of 4 permits (so some are always held); a request
 * for all 4 queues behind them. fair and locked: it is granted in its turn, and no small request made
 * after it was queued is granted before it (tokens increase in grant order). basic has no
 * queue: the test shows it starving there (not asserted, the big request times out). */
static int fifo_trial(redsem_strategy strategy)
{
    struct smalls *sm = shared_map(sizeof *sm);
    sm->name = tf_name("fifo");
    sm->strategy = strategy;
    pthread_t th[3];
    struct small smalls[3] = {{sm, 1}, {sm, 2}, {sm, 1}};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, small_run, &smalls[i]), 0);
    while (atomic_load(&sm->n) < 10)
        usleep(1000);
    redsem_client *c = tf_client(), *c2 = tf_client();
    struct big b = {.s = open_sem(c, sm->name, strategy, 4, 10000)};
    redsem_sem *watch = open_sem(c2, sm->name, strategy, 4, 10000);
    /* until the big request is seen queued (all 4 permits may happen to be free at once) */
    for (int attempt = 0;; attempt++) {
        redsem_id_generate(b.id);
        pthread_t bt;
        cr_assert_eq(pthread_create(&bt, NULL, big_run, &b), 0);
        bool seen = false;
        while (!(seen = queued(watch, b.id)) && b.p == NULL && b.rc == 0)
            usleep(200);
        if (seen)
            atomic_store(&sm->big_queued, 1);
        pthread_join(bt, NULL);
        if (seen || b.rc != REDSEM_OK || attempt == 50)
            break;
        release_free(c, b.p);
        b.p = NULL;
    }
    OK(c, b.rc);
    cr_assert_eq(redsem_permit_weight(b.p), 4);
    uint64_t big_token = redsem_permit_token(b.p);
    release_free(c, b.p);
    atomic_store(&sm->stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    int after = 0, overtook = 0, n = atomic_load(&sm->n);
    for (int k = 0; k < n && k < 4096; k++) {
        if (!sm->queued_after[k])
            continue;
        after++;
        if (sm->tokens[k] < big_token)
            overtook++;
    }
    cr_assert_eq(atomic_load(&sm->errors), 0);
    cr_assert_eq(overtook, 0, "%d of %d small requests made after the big one queued were "
                 "granted before it", overtook, after);
    redsem_sem_free(b.s);
    redsem_sem_free(watch);
    redsem_client_free(c);
    redsem_client_free(c2);
    munmap(sm, sizeof *sm);
    return after;
}

/* A trial proves something only if small requests were made while the big one waited; on a
 * loaded machine (CI's sanitizer build) the big one can be granted before any thread made
 * one: then it is run again, up to 10 times. */
static void fifo_big_request(redsem_strategy strategy)
{
    int after = 0;
    for (int trial = 0; trial < 10 && after == 0; trial++)
        after = fifo_trial(strategy);
    cr_assert_gt(after, 0, "no small request was made while the big one waited, in 10 trials");
}

Test(weights, fifo_a_request_for_the_limit_is_not_overtaken_fair, TO)
{
    fifo_big_request(REDSEM_STRATEGY_FAIR);
}

Test(weights, fifo_a_request_for_the_limit_is_not_overtaken_locked, TO)
{
    fifo_big_request(REDSEM_STRATEGY_LOCKED);
}

/* Waiters that leave from the middle of the queue (their timeout) hold nobody back for
 * good: limit 2 held by A; queued B (1), C (1, gives up soon), D (2). A's release grants B;
 * B's release grants D. */
struct waiter {
    redsem_sem *s;
    uint32_t n;
    int64_t timeout;
    int rc;
    redsem_permit *p;
};

static void *waiter_run(void *arg)
{
    struct waiter *w = arg;
    w->rc = redsem_sem_acquire_n(w->s, w->n, w->timeout, &w->p);
    return NULL;
}

static void wait_queued(redsem_sem *watch, size_t n)
{
    for (int i = 0; i < 20000 && usage_of(watch).waiters < n; i++)
        usleep(500);
    cr_assert_geq(usage_of(watch).waiters, n);
}

/* five clients, each with a handle of NAME (the last one watches the status) */
static void open_five(const char *name, redsem_strategy strategy, uint32_t limit,
                      redsem_client *c[5], redsem_sem *s[5])
{
    for (int i = 0; i < 5; i++) {
        c[i] = tf_client();
        s[i] = open_sem(c[i], name, strategy, limit, 10000);
    }
}

static void close_five(redsem_client *c[5], redsem_sem *s[5])
{
    for (int i = 0; i < 5; i++) {
        redsem_sem_free(s[i]);
        redsem_client_free(c[i]);
    }
}

static void middle_leaver(redsem_strategy strategy)
{
    redsem_client *c[5];
    redsem_sem *s[5];
    open_five(tf_name("hole"), strategy, 2, c, s);
    redsem_permit *a = NULL;
    OK(c[0], redsem_sem_acquire_n(s[0], 2, 0, &a));
    struct waiter w[3] = {{s[1], 1, 60000, 0, NULL}, {s[2], 1, 300, 0, NULL},
                          {s[3], 2, 60000, 0, NULL}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(pthread_create(&th[i], NULL, waiter_run, &w[i]), 0);
        wait_queued(s[4], (size_t)i + 1);
    }
    pthread_join(th[1], NULL);
    EXPECT(c[2], REDSEM_EBUSY, w[1].rc);
    release_free(c[0], a);
    pthread_join(th[0], NULL);
    OK(c[1], w[0].rc);
    cr_assert_null(w[2].p);
    release_free(c[1], w[0].p);
    pthread_join(th[2], NULL);
    OK(c[3], w[2].rc);
    cr_assert_eq(usage_of(s[4]).in_use, 2);
    release_free(c[3], w[2].p);
    close_five(c, s);
}

Test(weights, a_waiter_leaving_the_middle_holds_nobody_back_fair, TO)
{
    middle_leaver(REDSEM_STRATEGY_FAIR);
}

Test(weights, a_waiter_leaving_the_middle_holds_nobody_back_locked, TO)
{
    middle_leaver(REDSEM_STRATEGY_LOCKED);
}

/* Several permits freed at once wake every waiter they entitle (fair, locked: weight 1
 * waiters granted together, as before; basic: one wake-up per permit). */
STRATEGY_TEST(weights, a_weighted_release_wakes_every_entitled_waiter, TO)
{
    redsem_client *c[5];
    redsem_sem *s[5];
    open_five(tf_name("wake"), strategy, 3, c, s);
    redsem_permit *a = NULL;
    OK(c[0], redsem_sem_acquire_n(s[0], 3, 0, &a));
    struct waiter w[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        w[i] = (struct waiter){s[i + 1], 1, 60000, 0, NULL};
        cr_assert_eq(pthread_create(&th[i], NULL, waiter_run, &w[i]), 0);
        wait_queued(s[4], (size_t)i + 1);
    }
    release_free(c[0], a);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        OK(c[i + 1], w[i].rc);
    }
    cr_assert_eq(usage_of(s[4]).in_use, 3);
    for (int i = 0; i < 3; i++)
        release_free(c[i + 1], w[i].p);
    close_five(c, s);
}

/* ---------------------------------------------------------------- unknown outcome */

/* A private server, a fault proxy in front of it, a client through the proxy (command
 * timeout 300 ms, no retry) and a client straight to the server. */
typedef struct proxied {
    ts_server srv;
    fp_proxy *px;
    redsem_client *c, *direct;
} proxied;

static void proxied_start(proxied *x)
{
    cr_assert_eq(ts_server_start(&x->srv, NULL, true), 0);
    x->px = fp_proxy_start(x->srv.port);
    cr_assert_not_null(x->px);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", fp_proxy_port(x->px));
    x->c = tf_client_for(url, 0, 300);
    x->direct = tf_client_for(x->srv.url, -1, 0);
}

static void proxied_stop(proxied *x)
{
    redsem_client_free(x->c);
    redsem_client_free(x->direct);
    fp_proxy_stop(x->px);
    ts_server_stop(&x->srv);
}

/* A blocking acquire of n permits by a new id (in id) through the proxy, whose replies are
 * dropped: REDSEM_EUNKNOWN, the request (queued if it could not be granted) left behind. */
static void wait_with_reply_lost(proxied *net, redsem_sem *s, uint32_t n,
                                 char id[REDSEM_ID_BUFSIZE])
{
    redsem_permit *p = NULL;
    redsem_id_generate(id);
    fp_proxy_set_mode(net->px, FP_DROP_EVAL_REPLIES);
    EXPECT(net->c, REDSEM_EUNKNOWN, redsem_sem_acquire_as_n(s, id, n, 5000, &p));
    fp_proxy_set_mode(net->px, FP_PASS);
}

/* The reply to a weighted acquire is lost (the proxy drops the acquire scripts' replies):
 * REDSEM_EUNKNOWN; on the server all n permits are held or none; the retry with the same id
 * and weight returns that permit (same token) without taking more. */
STRATEGY_TEST(weights, unknown_outcome_is_all_or_nothing_and_retry_is_idempotent, TO)
{
    proxied net;
    proxied_start(&net);
    redsem_client *c = net.c, *direct = net.direct;
    fp_proxy *px = net.px;
    redsem_sem *s = open_sem(c, "unknown", strategy, 5, 10000);
    redsem_sem *d = open_sem(direct, "unknown", strategy, 5, 10000);
    char id[REDSEM_ID_BUFSIZE];
    redsem_id_generate(id);
    fp_proxy_set_mode(px, FP_DROP_EVAL_REPLIES);
    redsem_permit *p = NULL;
    EXPECT(c, REDSEM_EUNKNOWN, redsem_sem_acquire_as_n(s, id, 4, 0, &p));
    fp_proxy_set_mode(px, FP_PASS);
    usage u = usage_of(d);
    cr_assert(u.in_use == 0 || u.in_use == 4, "%llu permits in use after a lost reply",
              (unsigned long long)u.in_use);
    uint64_t in_use = u.in_use;
    OK(c, redsem_sem_acquire_as_n(s, id, 4, 0, &p));
    cr_assert_eq(redsem_permit_weight(p), 4);
    cr_assert_eq(usage_of(d).in_use, 4, "the retry took more (was %llu)",
                 (unsigned long long)in_use);
    redsem_permit *x = NULL;
    EXPECT(direct, REDSEM_EBUSY, redsem_sem_try_acquire_n(d, 2, &x));
    /* a blocking weighted acquire whose replies are lost while it cannot be granted: none of
     * its permits is taken; once the permits are free, the retry gets all of them */
    char id2[REDSEM_ID_BUFSIZE];
    redsem_id_generate(id2);
    fp_proxy_set_mode(px, FP_DROP_EVAL_REPLIES);
    EXPECT(c, REDSEM_EUNKNOWN, redsem_sem_acquire_as_n(s, id2, 3, 2000, &x));
    fp_proxy_set_mode(px, FP_PASS);
    cr_assert_eq(usage_of(d).in_use, 4, "a blocked request took some permits");
    release_free(c, p);
    OK(c, redsem_sem_acquire_as_n(s, id2, 3, 5000, &p));
    cr_assert_eq(usage_of(d).in_use, 3);
    release_free(c, p);
    cr_assert_eq(usage_of(d).in_use, 0);
    redsem_sem_free(s);
    redsem_sem_free(d);
    proxied_stop(&net);
}

/* A fair semaphore kept by redsem 0.2 (owners ranked holders and waiters by ticket, no
 * 'used' or 'q' in meta) is refused, not misread as a weighted queue. */
Test(weights, a_semaphore_of_the_old_fair_layout_is_refused, TO)
{
    const char *name = tf_name("legacy");
    char meta[128], owners[128], timeouts[128];
    snprintf(meta, sizeof meta, "redsem:{%s}:meta", name);
    snprintf(owners, sizeof owners, "redsem:{%s}:owners", name);
    snprintf(timeouts, sizeof timeouts, "redsem:{%s}:timeouts", name);
    const char *holder = "0123456789abcdef0123456789abcdef01234567";
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "HSET", meta, "strategy", "fair", "limit", "1",
                            "t:0123456789abcdef0123456789abcdef01234567", "1700000000000000",
                            NULL), 0);
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "ZADD", owners, "1700000000000000", holder,
                            NULL), 0);
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "ZADD", timeouts, "99999999999999", holder,
                            NULL), 0);
    redsem_client *c = tf_client();
    redsem_sem *s = open_sem(c, name, REDSEM_STRATEGY_FAIR, 1, 10000);
    redsem_permit *p = NULL;
    EXPECT(c, REDSEM_ECONFLICT, redsem_sem_try_acquire(s, &p));
    cr_assert(strstr(redsem_client_errmsg(c), "redsem 0.2") != NULL, "%s",
              redsem_client_errmsg(c));
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* A request of an id already queued, in wait mode (the retry that REDSEM_EUNKNOWN asks for,
 * its first reply lost while it waited), whose cleanup of an expired holder hands the permit
 * to that id at the head of the queue: the request returns that permit. It must not queue the
 * id again behind its own grant: the id stayed in the queue while it held, and its release
 * handed the permit to it once more, to nobody, for good (limit 1: no permit ever again). */
STRATEGY_TEST(weights, a_retried_waiter_granted_by_the_cleanup_is_not_queued_again, TO)
{
    proxied net;
    proxied_start(&net);
    redsem_client *c = net.c, *direct = net.direct;
    redsem_sem *s = open_sem(c, "requeue", strategy, 1, 10000);
    redsem_sem *d = open_sem(direct, "requeue", strategy, 1, 1500);
    redsem_permit *h = NULL, *p = NULL, *x = NULL;
    OK(direct, redsem_sem_try_acquire(d, &h)); /* a holder that will let its lease run out */
    char id[REDSEM_ID_BUFSIZE];
    wait_with_reply_lost(&net, s, 1, id);
    if (strategy != REDSEM_STRATEGY_BASIC)
        cr_assert(queued(d, id), "the lost request did not queue");
    tf_sleep_ms(2000); /* the holder's lease runs out (nobody cleans it up yet) */
    OK(c, redsem_sem_acquire_as(s, id, 5000, &p));
    usage u = usage_of(d);
    cr_assert_eq(u.in_use, 1);
    if (strategy != REDSEM_STRATEGY_BASIC) /* basic: the lost registration lapses by itself */
        cr_assert_eq(u.waiters, 0, "the holder is still queued");
    release_free(c, p);
    cr_assert_eq(usage_of(d).in_use, 0, "the release handed the permit to nobody");
    OK(direct, redsem_sem_try_acquire(d, &x));
    release_free(direct, x);
    redsem_permit_free(h);
    redsem_sem_free(s);
    redsem_sem_free(d);
    proxied_stop(&net);
}

/* A permit object of weight 1 whose lease ran out, released after its id took a permit of
 * weight 3 (allowed: its own id again, with another weight, after the lease ran out): the
 * release removes that id's entry (one id is one permit) and every one of its permits comes
 * back. Basic release trusts a weight of 1 from the client: it left the 3's two extra permits
 * counted for good. */
STRATEGY_TEST(weights, a_stale_permit_of_weight_1_gives_back_what_its_id_holds, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("stale1");
    redsem_sem *brief = open_sem(c, name, strategy, 4, 200);
    redsem_sem *sem = open_sem(c, name, strategy, 4, 30000);
    char id[REDSEM_ID_BUFSIZE];
    redsem_id_generate(id);
    redsem_permit *p = NULL, *q = NULL, *all = NULL;
    OK(c, redsem_sem_acquire_as(brief, id, 0, &p));
    tf_sleep_ms(400);
    OK(c, redsem_sem_acquire_as_n(sem, id, 3, 0, &q));
    cr_assert_eq(usage_of(sem).in_use, 3);
    /* ELOST (its validity had ended), but it removes the id's entry, of whatever weight */
    EXPECT(c, REDSEM_ELOST, redsem_permit_release(p));
    redsem_permit_free(p);
    cr_assert_eq(usage_of(sem).in_use, 0, "permits left counted after the id's release");
    OK(c, redsem_sem_try_acquire_n(sem, 4, &all));
    release_free(c, all);
    redsem_permit_free(q);
    redsem_sem_free(brief);
    redsem_sem_free(sem);
    redsem_client_free(c);
}

/* A waiter queued for 3 permits (its reply lost: REDSEM_EUNKNOWN), asked for again with
 * another weight: refused (REDSEM_EINVAL, one id is one permit object), as a queued waiter's
 * next attempt is. A first request in wait mode did not look for its id in the queue: it
 * rewrote the queued waiter's weight to 1, which then fitted at the head without being
 * granted, and it waited out its whole timeout next to two free permits. */
Test(weights, a_queued_waiter_asked_for_again_with_another_weight_is_refused_fair, TO)
{
    proxied net;
    proxied_start(&net);
    redsem_client *c = net.c, *direct = net.direct;
    redsem_sem *s = open_sem(c, "reweigh", REDSEM_STRATEGY_FAIR, 4, 10000);
    redsem_sem *d = open_sem(direct, "reweigh", REDSEM_STRATEGY_FAIR, 4, 30000);
    redsem_permit *h = NULL, *p = NULL;
    OK(direct, redsem_sem_try_acquire_n(d, 2, &h));
    char id[REDSEM_ID_BUFSIZE];
    wait_with_reply_lost(&net, s, 3, id);
    cr_assert(queued(d, id), "the lost request did not queue");
    EXPECT(c, REDSEM_EINVAL, redsem_sem_acquire_as_n(s, id, 1, 2000, &p));
    cr_assert_eq(usage_of(d).in_use, 2);
    cr_assert(queued(d, id), "the refused request changed the queue");
    release_free(direct, h);
    OK(c, redsem_sem_acquire_as_n(s, id, 3, 5000, &p));
    cr_assert_eq(usage_of(d).in_use, 3);
    release_free(c, p);
    redsem_sem_free(s);
    redsem_sem_free(d);
    proxied_stop(&net);
}
