/* Many clients at once, counted independently of Redis: an atomic counter in shared memory
 * is incremented after acquire returns and decremented before release. It must never exceed
 * the limit, and it must reach it (no under-grant when demand exceeds the limit). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fixture.h"

typedef struct shared {
    atomic_int inside;
    atomic_int max_inside;
    atomic_int grants;
    atomic_int errors;
    atomic_int last_error;
} shared;

static shared *new_shared(void)
{
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(sh, MAP_FAILED);
    atomic_init(&sh->inside, 0);
    atomic_init(&sh->max_inside, 0);
    atomic_init(&sh->grants, 0);
    atomic_init(&sh->errors, 0);
    atomic_init(&sh->last_error, 0);
    return sh;
}

struct worker {
    shared *sh;
    const char *name;
    redsem_strategy strategy;
    uint32_t limit;
    int iterations;
    unsigned seed;
};

static void run_worker(struct worker *w)
{
    redsem_client *c = NULL;
    redsem_sem *s = NULL;
    int rc = redsem_client_connect(tf_url(), &c);
    if (rc == REDSEM_OK)
        rc = redsem_sem_open(c, w->name, w->strategy, w->limit, 10000, &s);
    for (int i = 0; rc == REDSEM_OK && i < w->iterations; i++) {
        redsem_permit *p = NULL;
        rc = redsem_sem_acquire(s, 20000, &p);
        if (rc != REDSEM_OK)
            break;
        int now = atomic_fetch_add(&w->sh->inside, 1) + 1;
        int seen = atomic_load(&w->sh->max_inside);
        while (now > seen && !atomic_compare_exchange_weak(&w->sh->max_inside, &seen, now))
            ;
        atomic_fetch_add(&w->sh->grants, 1);
        usleep((useconds_t)(rand_r(&w->seed) % 2000));
        atomic_fetch_sub(&w->sh->inside, 1);
        rc = redsem_permit_release(p);
        redsem_permit_free(p);
    }
    if (rc != REDSEM_OK) {
        atomic_fetch_add(&w->sh->errors, 1);
        atomic_store(&w->sh->last_error, rc);
    }
    redsem_sem_free(s);
    redsem_client_free(c);
}

static void *thread_main(void *arg)
{
    run_worker(arg);
    return NULL;
}

static void check(shared *sh, uint32_t limit, int expected_grants)
{
    cr_assert_eq(atomic_load(&sh->errors), 0, "worker error %s",
                 redsem_err_name(atomic_load(&sh->last_error)));
    cr_assert_eq(atomic_load(&sh->grants), expected_grants);
    cr_assert_leq(atomic_load(&sh->max_inside), (int)limit, "%d holders at once, limit %u",
                  atomic_load(&sh->max_inside), limit);
    cr_assert_eq(atomic_load(&sh->max_inside), (int)limit, "the limit was never reached");
}

STRATEGY_TEST(concurrency, threads_never_exceed_the_limit, .timeout = 120)
{
    enum { N = 8, ITER = 40 };
    shared *sh = new_shared();
    const char *name = tf_name("threads");
    struct worker w[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        w[i] = (struct worker){sh, name, strategy, 3, ITER, (unsigned)i * 7919u + 1};
        cr_assert_eq(pthread_create(&t[i], NULL, thread_main, &w[i]), 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    check(sh, 3, N * ITER);
}

STRATEGY_TEST(concurrency, processes_never_exceed_the_limit, .timeout = 120)
{
    enum { N = 6, ITER = 40 };
    shared *sh = new_shared();
    const char *name = tf_name("procs");
    pid_t pids[N];
    for (int i = 0; i < N; i++) {
        pids[i] = fork();
        cr_assert_geq(pids[i], 0);
        if (pids[i] == 0) {
            struct worker w = {sh, name, strategy, 2, ITER, (unsigned)getpid()};
            run_worker(&w);
            _exit(0);
        }
    }
    for (int i = 0; i < N; i++) {
        int status;
        cr_assert_eq(waitpid(pids[i], &status, 0), pids[i]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    check(sh, 2, N * ITER);
}

/* ---------------------------------------------------------------- fair ordering */

struct ordered {
    const char *name;
    redsem_strategy strategy;
    int index;
    atomic_int *next_slot;
    int *order;
    int rc;
};

static void *ordered_waiter(void *arg)
{
    struct ordered *o = arg;
    redsem_client *c = NULL;
    redsem_sem *s = NULL;
    redsem_permit *p = NULL;
    o->rc = redsem_client_connect(tf_url(), &c);
    if (o->rc == REDSEM_OK)
        o->rc = redsem_sem_open(c, o->name, o->strategy, 1, 10000, &s);
    if (o->rc == REDSEM_OK)
        o->rc = redsem_sem_acquire(s, 30000, &p);
    if (o->rc == REDSEM_OK) {
        o->order[atomic_fetch_add(o->next_slot, 1)] = o->index;
        usleep(2000);
        o->rc = redsem_permit_release(p);
    }
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
    return NULL;
}

static void arrival_order(redsem_strategy strategy)
{
    enum { N = 6 };
    redsem_client *c = tf_client();
    const char *name = tf_name("order");
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, name, strategy, 1, 10000, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    atomic_int next = 0;
    int order[N];
    struct ordered o[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        o[i] = (struct ordered){name, strategy, i, &next, order, 0};
        cr_assert_eq(pthread_create(&t[i], NULL, ordered_waiter, &o[i]), 0);
        /* start the next waiter only once this one is queued: arrival order is known */
        for (int k = 0; k < 500 && tf_waiters(s) < (size_t)i + 1; k++)
            tf_sleep_ms(5);
        cr_assert_eq(tf_waiters(s), (size_t)i + 1);
    }
    /* while waiters are queued, a newcomer's try never barges ahead of them */
    redsem_permit *q = NULL;
    OK(c, redsem_permit_release(p));
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(s, &q));
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(o[i].rc, REDSEM_OK, "waiter %d: %s", i, redsem_err_name(o[i].rc));
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(order[i], i, "grant %d went to waiter %d", i, order[i]);
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

Test(fair, waiters_are_granted_in_arrival_order, .timeout = 60)
{
    arrival_order(REDSEM_STRATEGY_FAIR);
}

Test(fair, locked_waiters_are_granted_in_arrival_order, .timeout = 60)
{
    arrival_order(REDSEM_STRATEGY_LOCKED);
}
