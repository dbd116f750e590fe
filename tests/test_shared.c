/* One client shared by many threads (issue 10, part 1): every call may come from any thread
 * at once. Checked from outside: an independent counter (never over the limit, the limit
 * reached), the server's own count of connections (bounded by max_connections, renewer
 * included), the per-thread error text, the pool's waits, renewal started by many threads at
 * once. The library is also run by the bench's --shared workload under ThreadSanitizer in CI
 * (Criterion cannot start under TSan). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

TestSuite(shared, .timeout = 240);

static redsem_client *shared_client(const char *url, int max_connections)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
    cr_assert_eq(redsem_options_set_max_connections(o, max_connections), REDSEM_OK);
    redsem_client *c = NULL;
    char err[256] = "";
    int rc = redsem_client_new_verbose(o, &c, err, sizeof err);
    redsem_options_free(o);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    return c;
}

/* The server's connected_clients (INFO clients), the asking connection excluded. */
static long connected(const ts_server *srv)
{
    char info[4096] = "";
    cr_assert_eq(ts_command(srv, info, sizeof info, "INFO", "clients", NULL), 0);
    const char *p = strstr(info, "connected_clients:");
    cr_assert(p != NULL, "%s", info);
    return atol(p + strlen("connected_clients:")) - 1;
}

Test(shared, max_connections_range)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_expect_eq(redsem_options_set_max_connections(o, 0), REDSEM_EINVAL);
    cr_expect_eq(redsem_options_set_max_connections(o, REDSEM_MAX_CONNECTIONS_MAX + 1),
                 REDSEM_EINVAL);
    cr_expect_eq(redsem_options_set_max_connections(NULL, 4), REDSEM_EINVAL);
    cr_expect_eq(redsem_options_set_max_connections(o, 1), REDSEM_OK);
    cr_expect_eq(redsem_options_set_max_connections(o, REDSEM_MAX_CONNECTIONS_MAX), REDSEM_OK);
    redsem_options_free(o);
}

/* ------------------------------------------------------------------ the limit holds */

enum { LIMIT_THREADS = 24, LIMIT = 3, ROUNDS = 15 };

typedef struct limit_run {
    redsem_sem *sem; /* one handle, shared by every thread */
    atomic_int inside, max_inside, grants, errors, last_error;
    atomic_ullong last_token;
    atomic_int token_reused;
} limit_run;

static void *limit_thread(void *arg)
{
    limit_run *r = arg;
    unsigned seed = (unsigned)(uintptr_t)&seed;
    for (int i = 0; i < ROUNDS; i++) {
        redsem_permit *p = NULL;
        int rc = redsem_sem_acquire(r->sem, 60000, &p);
        if (rc != REDSEM_OK) {
            atomic_fetch_add(&r->errors, 1);
            atomic_store(&r->last_error, rc);
            return NULL;
        }
        int now = atomic_fetch_add(&r->inside, 1) + 1;
        int seen = atomic_load(&r->max_inside);
        while (now > seen && !atomic_compare_exchange_weak(&r->max_inside, &seen, now))
            ;
        atomic_fetch_add(&r->grants, 1);
        usleep((useconds_t)(rand_r(&seed) % 2000));
        atomic_fetch_sub(&r->inside, 1);
        rc = redsem_permit_release(p);
        redsem_permit_free(p);
        if (rc != REDSEM_OK) {
            atomic_fetch_add(&r->errors, 1);
            atomic_store(&r->last_error, rc);
            return NULL;
        }
    }
    return NULL;
}

/* 24 threads, one client of 4 connections, one semaphore handle of limit 3: never more than 3
 * inside by a counter outside Redis, 3 reached, every acquire granted, no error. Blocked
 * waiters wait on wait connections, so the releases still find a request connection. */
STRATEGY_TEST(shared, limit_holds, .timeout = 240)
{
    redsem_client *c = shared_client(tf_url(), 4);
    limit_run *r = calloc(1, sizeof *r);
    cr_assert(r != NULL);
    OK(c, redsem_sem_open(c, tf_name("shared-limit"), strategy, LIMIT, 10000, &r->sem));
    pthread_t th[LIMIT_THREADS];
    for (int i = 0; i < LIMIT_THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, limit_thread, r), 0);
    for (int i = 0; i < LIMIT_THREADS; i++)
        pthread_join(th[i], NULL);
    cr_expect_eq(atomic_load(&r->errors), 0, "an acquire or release failed: %s",
                 redsem_err_name(atomic_load(&r->last_error)));
    cr_expect_eq(atomic_load(&r->grants), LIMIT_THREADS * ROUNDS);
    cr_expect_leq(atomic_load(&r->max_inside), LIMIT, "%d inside at once with limit %d",
                  atomic_load(&r->max_inside), LIMIT);
    cr_expect_eq(atomic_load(&r->max_inside), LIMIT, "the limit was never reached");
    redsem_status *st = NULL;
    OK(c, redsem_sem_status(r->sem, 0, &st));
    cr_expect_eq(redsem_status_holder_count(st), 0, "permits left behind");
    redsem_status_free(st);
    redsem_sem_free(r->sem);
    free(r);
    redsem_client_free(c);
}

/* ------------------------------------------------------------------ connections */

enum { CONN_THREADS = 32 };

typedef struct conn_run {
    redsem_client *client;
    const char *name;
    atomic_bool stop;
    atomic_int errors, last_error, pairs;
} conn_run;

static void *conn_thread(void *arg)
{
    conn_run *r = arg;
    redsem_sem *s = NULL;
    /* one semaphore of limit 32 for all: nobody waits */
    int rc = redsem_sem_open(r->client, r->name, REDSEM_STRATEGY_BASIC, CONN_THREADS, 2000, &s);
    while (rc == REDSEM_OK && !atomic_load(&r->stop)) {
        redsem_permit *p = NULL;
        rc = redsem_sem_try_acquire(s, &p);
        if (rc != REDSEM_OK)
            break;
        rc = redsem_permit_auto_renew(p, 100, NULL, NULL);
        if (rc == REDSEM_OK)
            rc = redsem_permit_release(p);
        redsem_permit_free(p);
        atomic_fetch_add(&r->pairs, 1);
    }
    if (rc != REDSEM_OK) {
        atomic_fetch_add(&r->errors, 1);
        atomic_store(&r->last_error, rc);
    }
    redsem_sem_free(s);
    return NULL;
}

/* 32 threads acquire and release through one client with renewal on: the server sees at most
 * the client's 4 connections, however many threads, renewer included (its renewals take the
 * client's connections). Fails if the pool opens a connection per thread (about 33), or if the
 * renewer has a connection of its own (5, up to 0.4.5). */
Test(shared, connections_bounded)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    long before = connected(&srv);
    conn_run r = {.name = tf_name("shared-conn")};
    r.client = shared_client(srv.url, 4);
    pthread_t th[CONN_THREADS];
    for (int i = 0; i < CONN_THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, conn_thread, &r), 0);
    long most = 0;
    for (int i = 0; i < 20 || atomic_load(&r.pairs) < 2000; i++) {
        long now = connected(&srv) - before;
        if (now > most)
            most = now;
        tf_sleep_ms(25);
        if (i > 400)
            break; /* 10 s: a very slow machine; the counts below still hold */
    }
    atomic_store(&r.stop, true);
    for (int i = 0; i < CONN_THREADS; i++)
        pthread_join(th[i], NULL);
    redsem_client_stats stats;
    OK(r.client, redsem_client_get_stats(r.client, &stats));
    redsem_client_free(r.client);
    ts_server_stop(&srv);
    cr_expect_eq(atomic_load(&r.errors), 0, "%s", redsem_err_name(atomic_load(&r.last_error)));
    cr_expect_gt(atomic_load(&r.pairs), 0);
    cr_expect_leq(most, 4, "%ld connections for 32 threads with renewal on (max_connections 4)",
                  most);
    cr_expect_geq(most, 1);
    cr_expect_leq(stats.connects, 4, "request connections opened: %llu",
                  (unsigned long long)stats.connects);
}

/* Four threads on one client share its request connection: the connection count stays 1
 * (no pool of connections since 0.7, whatever max_connections allows) and their requests
 * ride together (several in flight at once: stats.pipelined). */
static void *ping_thread(void *arg)
{
    conn_run *r = arg;
    while (!atomic_load(&r->stop)) {
        int rc = redsem_client_ping(r->client);
        if (rc != REDSEM_OK) {
            atomic_fetch_add(&r->errors, 1);
            atomic_store(&r->last_error, rc);
            return NULL;
        }
        atomic_fetch_add(&r->pairs, 1);
    }
    return NULL;
}

Test(shared, one_connection_shared_by_threads)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    long before = connected(&srv);
    conn_run r = {.name = NULL};
    r.client = shared_client(srv.url, 1);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, ping_thread, &r), 0);
    long most = 0;
    redsem_client_stats stats = {0};
    int64_t until = tf_now_ms() + 10000;
    while (tf_now_ms() < until) {
        long now = connected(&srv) - before;
        if (now > most)
            most = now;
        OK(r.client, redsem_client_get_stats(r.client, &stats));
        if (stats.pipelined > 0 && atomic_load(&r.pairs) > 1000)
            break;
        tf_sleep_ms(20);
    }
    atomic_store(&r.stop, true);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    OK(r.client, redsem_client_get_stats(r.client, &stats));
    redsem_client_free(r.client);
    ts_server_stop(&srv);
    cr_expect_eq(atomic_load(&r.errors), 0, "%s", redsem_err_name(atomic_load(&r.last_error)));
    cr_expect_eq(most, 1, "%ld connections with max_connections 1", most);
    cr_expect_gt(stats.pipelined, 0, "4 threads on 1 connection never had 2 requests in flight");
    cr_expect_eq(stats.pool_waits, 0);
    cr_expect_geq(stats.requests, (uint64_t)atomic_load(&r.pairs));
}

/* ------------------------------------------------------------------ batched script calls */

enum { BATCH_THREADS = 16, BATCH_ROUNDS = 200 };

typedef struct batch_run {
    redsem_client *client;
    atomic_int errors, last_error, misrouted, i;
} batch_run;

static void *batch_thread(void *arg)
{
    batch_run *r = arg;
    char name[64];
    snprintf(name, sizeof name, "%s-%d", tf_name("shared-batch"), atomic_fetch_add(&r->i, 1));
    redsem_sem *s = NULL;
    int rc = redsem_sem_open(r->client, name, REDSEM_STRATEGY_FAIR, 1, 10000, &s);
    uint64_t last = 0;
    for (int i = 0; rc == REDSEM_OK && i < BATCH_ROUNDS; i++) {
        redsem_permit *p = NULL;
        rc = redsem_sem_try_acquire(s, &p); /* its own semaphore of limit 1: always granted */
        if (rc != REDSEM_OK)
            break;
        if (redsem_permit_token(p) <= last)
            atomic_fetch_add(&r->misrouted, 1); /* another semaphore's token */
        last = redsem_permit_token(p);
        rc = redsem_permit_release(p); /* REDSEM_ELOST if it got another caller's reply */
        redsem_permit_free(p);
    }
    if (rc != REDSEM_OK) {
        atomic_fetch_add(&r->errors, 1);
        atomic_store(&r->last_error, rc);
    }
    redsem_sem_free(s);
    return NULL;
}

/* 16 threads, one connection: script calls of several threads go out in one write, and
 * every reply reaches its own caller (each thread's own semaphore of limit 1 always grants,
 * its tokens only grow, every release finds its holder). */
Test(shared, batched_replies_reach_their_callers)
{
    batch_run r = {0};
    r.client = shared_client(tf_url(), 1);
    pthread_t th[BATCH_THREADS];
    for (int i = 0; i < BATCH_THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, batch_thread, &r), 0);
    for (int i = 0; i < BATCH_THREADS; i++)
        pthread_join(th[i], NULL);
    redsem_client_stats st;
    OK(r.client, redsem_client_get_stats(r.client, &st));
    redsem_client_free(r.client);
    cr_expect_eq(atomic_load(&r.errors), 0, "%s", redsem_err_name(atomic_load(&r.last_error)));
    cr_expect_eq(atomic_load(&r.misrouted), 0);
    cr_expect_gt(st.pipelined, 0, "16 threads on one connection never shared a write");
    cr_expect_leq(st.connects, 1);
}

/* ------------------------------------------------------------------ one wait for all */

enum { WAIT_THREADS = 16 };

typedef struct wait_run {
    redsem_client *client;
    redsem_sem *sem;
    atomic_int errors, last_error, grants, inside, max_inside;
} wait_run;

static void *wait_thread(void *arg)
{
    wait_run *r = arg;
    redsem_permit *p = NULL;
    int rc = redsem_sem_acquire(r->sem, 60000, &p);
    if (rc == REDSEM_OK) {
        int now = atomic_fetch_add(&r->inside, 1) + 1;
        int seen = atomic_load(&r->max_inside);
        while (now > seen && !atomic_compare_exchange_weak(&r->max_inside, &seen, now))
            ;
        atomic_fetch_add(&r->grants, 1);
        usleep(2000);
        atomic_fetch_sub(&r->inside, 1);
        rc = redsem_permit_release(p);
        redsem_permit_free(p);
    }
    if (rc != REDSEM_OK) {
        atomic_fetch_add(&r->errors, 1);
        atomic_store(&r->last_error, rc);
    }
    return NULL;
}

static long info_field(const ts_server *srv, const char *field)
{
    char info[4096] = "";
    cr_assert_eq(ts_command(srv, info, sizeof info, "INFO", "clients", NULL), 0);
    const char *p = strstr(info, field);
    cr_assert(p != NULL, "%s", info);
    return atol(p + strlen(field));
}

/* 16 threads of one client block on a semaphore held elsewhere: the server sees ONE blocked
 * connection (a BLPOP on every waiter's list), not 16, and the client no more connections
 * than its request connections and that one. Then every waiter is granted in turn, one at a
 * time, woken by the releases. Fails with a wait connection per waiting thread. */
STRATEGY_TEST(shared, waiters_share_one_blocking_connection, .timeout = 240)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    long before = connected(&srv);
    redsem_client *holder = shared_client(srv.url, 1);
    wait_run r = {0};
    r.client = shared_client(srv.url, 2);
    const char *name = tf_name("shared-wait");
    redsem_sem *hs = NULL;
    OK(holder, redsem_sem_open(holder, name, strategy, 1, 30000, &hs));
    OK(r.client, redsem_sem_open(r.client, name, strategy, 1, 30000, &r.sem));
    redsem_permit *hp = NULL;
    OK(holder, redsem_sem_try_acquire(hs, &hp));
    pthread_t th[WAIT_THREADS];
    for (int i = 0; i < WAIT_THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, wait_thread, &r), 0);
    /* every thread has made its first attempt and waits (or is about to) */
    redsem_status *st = NULL;
    for (int i = 0; i < 3000; i++) {
        OK(holder, redsem_sem_status(hs, 0, &st));
        size_t waiting = redsem_status_waiter_count(st);
        redsem_status_free(st);
        if (waiting >= WAIT_THREADS && info_field(&srv, "blocked_clients:") >= 1)
            break;
        tf_sleep_ms(10);
    }
    long most_blocked = 0, most_conns = 0;
    for (int i = 0; i < 20; i++) {
        long b = info_field(&srv, "blocked_clients:");
        long n = connected(&srv) - before - 1; /* the holder's */
        most_blocked = b > most_blocked ? b : most_blocked;
        most_conns = n > most_conns ? n : most_conns;
        tf_sleep_ms(10);
    }
    OK(holder, redsem_permit_release(hp));
    redsem_permit_free(hp);
    for (int i = 0; i < WAIT_THREADS; i++)
        pthread_join(th[i], NULL);
    redsem_client_stats stats;
    OK(r.client, redsem_client_get_stats(r.client, &stats));
    redsem_sem_free(r.sem);
    redsem_sem_free(hs);
    redsem_client_free(r.client);
    redsem_client_free(holder);
    ts_server_stop(&srv);
    cr_expect_eq(atomic_load(&r.errors), 0, "%s", redsem_err_name(atomic_load(&r.last_error)));
    cr_expect_eq(atomic_load(&r.grants), WAIT_THREADS);
    cr_expect_eq(atomic_load(&r.max_inside), 1);
    cr_expect_eq(most_blocked, 1, "%ld blocked connections for %d waiting threads",
                 most_blocked, WAIT_THREADS);
    cr_expect_leq(most_conns, 2 + 1, "%ld connections: 2 request + 1 wait expected", most_conns);
    cr_expect_gt(stats.wakeups, 0, "no waiter was woken by a release");
}

/* A short wait on a list the shared BLPOP already watches, for a longer time: the short one
 * still ends by its own deadline (found by review: it waited for the other's BLPOP, up to
 * 1 s). Thread A waits long on a basic semaphore (its backoff grows to 1 s BLPOPs); then the
 * main thread makes three 50 ms acquires on the same semaphore, one after another. Each must
 * end long before A's 1 s BLPOP would (bound 600 ms, for valgrind and busy machines). */
typedef struct long_wait {
    redsem_sem *sem;
    int rc;
} long_wait;

static void *long_waiter(void *arg)
{
    long_wait *w = arg;
    redsem_permit *p = NULL;
    w->rc = redsem_sem_acquire(w->sem, 8000, &p);
    redsem_permit_free(p);
    return NULL;
}

Test(shared, a_short_wait_beside_a_long_one_ends_by_its_deadline, .timeout = 120)
{
    redsem_client *holder = tf_client();
    redsem_client *c = shared_client(tf_url(), 2);
    const char *name = tf_name("shared-short");
    redsem_sem *hs = NULL, *s = NULL;
    OK(holder, redsem_sem_open(holder, name, REDSEM_STRATEGY_BASIC, 1, 60000, &hs));
    OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_BASIC, 1, 60000, &s));
    redsem_permit *hp = NULL;
    OK(holder, redsem_sem_try_acquire(hs, &hp));
    long_wait w = {s, -1};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, long_waiter, &w), 0);
    tf_sleep_ms(2500); /* A's waits: 50, 100, 200, 400, 800 ms, then 1 s each */
    int64_t worst = 0;
    for (int i = 0; i < 3; i++) {
        redsem_permit *p = NULL;
        int64_t t0 = tf_now_ms();
        EXPECT(c, REDSEM_EBUSY, redsem_sem_acquire(s, 50, &p));
        int64_t took = tf_now_ms() - t0;
        worst = took > worst ? took : worst;
    }
    OK(holder, redsem_permit_release(hp));
    redsem_permit_free(hp);
    pthread_join(th, NULL);
    cr_expect_eq(w.rc, REDSEM_OK, "the long waiter: %s", redsem_err_name(w.rc));
    cr_expect_lt(worst, 600, "a 50 ms acquire took %lld ms beside a 1 s wait",
                 (long long)worst);
    redsem_sem_free(s);
    redsem_sem_free(hs);
    redsem_client_free(c);
    redsem_client_free(holder);
}

/* ------------------------------------------------------------------ error text per thread */

typedef struct err_run {
    redsem_client *client;
    pthread_barrier_t failed, checked;
    char seen[512];
} err_run;

static void *err_thread(void *arg)
{
    err_run *r = arg;
    pthread_barrier_wait(&r->failed); /* the main thread's call has failed */
    int rc = redsem_client_ping(r->client);
    snprintf(r->seen, sizeof r->seen, "%s|%s", redsem_err_name(rc),
             redsem_client_errmsg(r->client));
    pthread_barrier_wait(&r->checked);
    return NULL;
}

/* The error text is the calling thread's: another thread's success neither clears nor shows
 * it, as with errno. */
Test(shared, error_text_is_per_thread)
{
    err_run r;
    r.client = shared_client(tf_url(), 4);
    pthread_barrier_init(&r.failed, NULL, 2);
    pthread_barrier_init(&r.checked, NULL, 2);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, err_thread, &r), 0);
    redsem_sem *s = NULL;
    OK(r.client, redsem_sem_open(r.client, tf_name("shared-err"), REDSEM_STRATEGY_BASIC, 2,
                                 10000, &s));
    redsem_permit *p = NULL;
    cr_assert_eq(redsem_sem_acquire_n(s, 0, 0, &p), REDSEM_EINVAL);
    char mine[512];
    snprintf(mine, sizeof mine, "%s", redsem_client_errmsg(r.client));
    cr_assert(mine[0] != '\0', "no error text for n = 0");
    pthread_barrier_wait(&r.failed);
    pthread_barrier_wait(&r.checked);
    pthread_join(th, NULL);
    cr_expect_str_eq(r.seen, "REDSEM_OK|", "the other thread saw '%s'", r.seen);
    cr_expect_str_eq(redsem_client_errmsg(r.client), mine,
                     "this thread's text changed after the other's call");
    pthread_barrier_destroy(&r.failed);
    pthread_barrier_destroy(&r.checked);
    redsem_sem_free(s);
    redsem_client_free(r.client);
}

/* ------------------------------------------------------------------ renewal from many threads */

enum { RENEW_THREADS = 16 };

typedef struct renew_run {
    int64_t lease_ms;
    redsem_client *client;
    redsem_sem *sem;
    pthread_barrier_t go;
    atomic_int errors, last_error, lost;
} renew_run;

static void on_lost(redsem_permit *p, redsem_lost_reason why, void *arg)
{
    (void)p;
    (void)why;
    renew_run *r = arg;
    atomic_fetch_add(&r->lost, 1);
}

static void *renew_thread(void *arg)
{
    renew_run *r = arg;
    redsem_permit *p = NULL;
    int rc = redsem_sem_try_acquire(r->sem, &p);
    pthread_barrier_wait(&r->go); /* every thread enables renewal at once */
    if (rc == REDSEM_OK)
        rc = redsem_permit_auto_renew(p, 0, on_lost, r);
    if (rc == REDSEM_OK) {
        usleep((useconds_t)(r->lease_ms * 4 * 1000)); /* 4 leases */
        if (!redsem_permit_held(p))
            rc = REDSEM_ELOST;
    }
    if (rc == REDSEM_OK)
        rc = redsem_permit_release(p);
    redsem_permit_free(p);
    if (rc != REDSEM_OK) {
        atomic_fetch_add(&r->errors, 1);
        atomic_store(&r->last_error, rc);
    }
    return NULL;
}

/* 16 threads enable renewal on one client at the same moment: one renewer starts (a second
 * one would leak, which ASan and valgrind report), every permit outlives its lease 4 times. */
Test(shared, renewal_started_by_many_threads)
{
    renew_run r = {0};
    /* under valgrind the 16 grants and the barrier take longer than a 300 ms lease */
    r.lease_ms = getenv("REDSEM_VALGRIND") != NULL ? 2000 : 300;
    r.client = shared_client(tf_url(), 4);
    OK(r.client, redsem_sem_open(r.client, tf_name("shared-renew"), REDSEM_STRATEGY_FAIR,
                                 RENEW_THREADS, r.lease_ms, &r.sem));
    pthread_barrier_init(&r.go, NULL, RENEW_THREADS);
    pthread_t th[RENEW_THREADS];
    for (int i = 0; i < RENEW_THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, renew_thread, &r), 0);
    for (int i = 0; i < RENEW_THREADS; i++)
        pthread_join(th[i], NULL);
    redsem_renew_stats rs;
    OK(r.client, redsem_client_renew_stats(r.client, &rs));
    cr_expect_eq(atomic_load(&r.errors), 0, "%s", redsem_err_name(atomic_load(&r.last_error)));
    cr_expect_eq(atomic_load(&r.lost), 0);
    cr_expect_geq(rs.renewals, (uint64_t)RENEW_THREADS * 3, "renewals: %llu",
                  (unsigned long long)rs.renewals);
    /* granted together, renewed together: fewer round trips than renewals (about one per
     * interval here; only "fewer" is asserted, for slow machines and valgrind) */
    cr_expect_lt(rs.round_trips, rs.renewals, "%llu renewals took %llu round trips",
                  (unsigned long long)rs.renewals, (unsigned long long)rs.round_trips);
    pthread_barrier_destroy(&r.go);
    redsem_sem_free(r.sem);
    redsem_client_free(r.client);
}
