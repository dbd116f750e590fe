/* Redis Cluster (redis+cluster://): 3 primaries and 3 replicas on loopback, started and
 * joined here (tests/support/cluster.c). The key slot against CLUSTER KEYSLOT, semaphores
 * spread over the shards under load, every strategy and the lock, live resharding of a busy
 * slot, failovers, and the bad topologies. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <hiredis/hiredis.h>

#include "cluster.h"
#include "fixture.h"
#include "internal.h"

#define TO .timeout = 300

static void start(ts_cluster *c, int replicas)
{
    int rc = ts_cluster_start(c, 3, replicas);
    if (rc == 77)
        cr_skip_test("redis-server is not installed");
    cr_assert_eq(rc, 0, "could not start the cluster");
}

static redsem_client *client(const ts_cluster *c, int64_t retry_ms)
{
    char err[512];
    int rc;
    redsem_client *cl = tf_client_try(c->url, retry_ms, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    return cl;
}

/* The slot of a key, as the cluster computes it (CLUSTER KEYSLOT on node 0). */
static int keyslot(const ts_cluster *c, const char *key)
{
    char out[32] = "";
    cr_assert_eq(ts_command(&c->node[0], out, sizeof out, "CLUSTER", "KEYSLOT", key, NULL), 0);
    return atoi(out);
}

/* The slot of semaphore NAME's keys ("redsem:{NAME}..."). */
static int slot_of(const ts_cluster *c, const char *name)
{
    char key[300];
    snprintf(key, sizeof key, "redsem:{%s}:meta", name);
    return keyslot(c, key);
}

/* The client computes the slot of every key itself (CRC16 of the hash tag {NAME}; names and
 * prefixes cannot hold braces): for many names and a few prefixes the node it sends a call to
 * is the owner of CLUSTER KEYSLOT's slot at once: no MOVED. A prefix with braces is refused,
 * so no name can leave its own slot. */
Test(cluster, key_slot_is_cluster_keyslot, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_options *bad = NULL;
    cr_assert_eq(redsem_options_new(&bad), REDSEM_OK);
    cr_expect_eq(redsem_options_set_key_prefix(bad, "a{b}:"), REDSEM_EINVAL);
    redsem_options_free(bad);
    static const char *const prefixes[] = {"redsem:", "", "app/7:", "z"};
    for (size_t k = 0; k < sizeof prefixes / sizeof *prefixes; k++) {
        redsem_options *o = NULL;
        cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
        cr_assert_eq(redsem_options_set_url(o, c.url), REDSEM_OK);
        cr_assert_eq(redsem_options_set_key_prefix(o, prefixes[k]), REDSEM_OK);
        redsem_client *cl = NULL;
        cr_assert_eq(redsem_client_new(o, &cl), REDSEM_OK);
        redsem_options_free(o);
        int names = k == 0 ? 400 : 40;
        for (int i = 0; i < names; i++) {
            char name[64], key[128], want[64];
            snprintf(name, sizeof name, i % 3 ? "n%d-%d" : "job.%d_%d", i * 7919, i);
            snprintf(key, sizeof key, "%s{%s}:meta", prefixes[k], name);
            int owner = ts_cluster_owner(&c, 0, keyslot(&c, key));
            cr_assert(owner >= 0);
            snprintf(want, sizeof want, "127.0.0.1:%d", c.node[owner].port);
            redsem_sem *s = NULL;
            redsem_status *st = NULL;
            OK(cl, redsem_sem_open(cl, name, REDSEM_STRATEGY_BASIC, 2, 5000, &s));
            OK(cl, redsem_sem_status(s, 0, &st));
            cr_expect_str_eq(redsem_status_server(st), want, "key %s: %s", key, redsem_status_server(st));
            redsem_status_free(st);
            redsem_sem_free(s);
        }
        redsem_client_stats stats;
        OK(cl, redsem_client_get_stats(cl, &stats));
        cr_expect_eq(stats.redirects, 0, "prefix '%s': %llu redirections", prefixes[k],
                     (unsigned long long)stats.redirects);
        redsem_client_free(cl);
    }
    ts_cluster_stop(&c);
}

Test(cluster, every_strategy_and_the_lock, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_client *cl = client(&c, -1);
    int seen[TS_CLUSTER_MAX] = {0};
    for (int k = 0; k < 24; k++) {
        char name[32];
        snprintf(name, sizeof name, "every-%d", k);
        redsem_sem *s = NULL;
        redsem_lock *l = NULL;
        redsem_permit *p = NULL, *p2 = NULL;
        if (k % 4 < 3) {
            OK(cl, redsem_sem_open(cl, name, (redsem_strategy)(k % 4 + 1), 1, 5000, &s));
            OK(cl, redsem_sem_acquire(s, 1000, &p));
            EXPECT(cl, REDSEM_EBUSY, redsem_sem_try_acquire(s, &p2));
        } else {
            OK(cl, redsem_lock_open(cl, name, 5000, &l));
            OK(cl, redsem_lock_acquire(l, 1000, &p));
        }
        OK(cl, redsem_permit_refresh(p));
        OK(cl, redsem_permit_release(p));
        redsem_permit_free(p);
        redsem_sem_free(s);
        redsem_lock_free(l);
        /* the keys are on the slot's primary */
        int owner = ts_cluster_owner(&c, 0, slot_of(&c, name));
        cr_assert(owner >= 0 && owner < 3);
        char key[64], out[32] = "";
        snprintf(key, sizeof key, "redsem:{%s}:meta", name);
        cr_assert_eq(ts_command(&c.node[owner], out, sizeof out, "EXISTS", key, NULL), 0);
        seen[owner]++;
    }
    cr_expect(seen[0] > 0 && seen[1] > 0 && seen[2] > 0, "spread %d/%d/%d", seen[0], seen[1],
              seen[2]);
    redsem_client_stats st;
    OK(cl, redsem_client_get_stats(cl, &st));
    cr_expect_eq(st.redirects, 0, "the slot map was right: no redirection expected");
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* ================================================================ load with a witness */

#define NAMES_MAX 1000

/* Threads, each with its own client, acquiring semaphores NAME-0 .. NAME-(nsem-1) (each of
 * limit `limit`) in turn from a different start, holding each permit `hold_us`; the witness
 * counts holders per semaphore in this process, independently of Redis. */
typedef struct load load;
struct load {
    const ts_cluster *c;
    const char *base;
    int nsem, limit, threads, rounds; /* rounds: per thread over all nsem; 0: until stop */
    redsem_strategy strategy;
    int64_t retry_ms, lease_ms, hold_us;
    int64_t command_timeout_ms; /* 0: the default */
    atomic_int inside[NAMES_MAX];
    atomic_int over, errors, release_errors, grants;
    atomic_bool stop;
    atomic_llong last_grant_ms;
    atomic_llong longest_acquire_ms; /* the longest successful acquire call */
    char first_error[256];
    pthread_mutex_t mu;
    pthread_t tid[16];
    struct worker {
        struct load *L;
        int i;
    } w[16];
};

static void note_error(load *L, redsem_client *cl, const char *what, int rc)
{
    pthread_mutex_lock(&L->mu);
    if (L->first_error[0] == '\0')
        snprintf(L->first_error, sizeof L->first_error, "%s: %s (%s)", what, redsem_err_name(rc),
                 redsem_client_errmsg(cl));
    pthread_mutex_unlock(&L->mu);
}

static void *load_thread(void *arg)
{
    struct worker *w = arg;
    load *L = w->L;
    const int *idx = &w->i;
    int rc;
    char err[512];
    redsem_client *cl = NULL;
    if (L->command_timeout_ms > 0) {
        redsem_options *o = NULL;
        cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
        cr_assert_eq(redsem_options_set_url(o, L->c->url), REDSEM_OK);
        cr_assert_eq(redsem_options_set_retry_ms(o, L->retry_ms), REDSEM_OK);
        cr_assert_eq(redsem_options_set_connect_timeout_ms(o, 1000), REDSEM_OK);
        cr_assert_eq(redsem_options_set_command_timeout_ms(o, L->command_timeout_ms), REDSEM_OK);
        rc = redsem_client_new_verbose(o, &cl, err, sizeof err);
        redsem_options_free(o);
    } else {
        cl = tf_client_try(L->c->url, L->retry_ms, &rc, err, sizeof err);
    }
    if (rc != REDSEM_OK) {
        atomic_fetch_add(&L->errors, 1);
        return NULL;
    }
    redsem_sem **sems = calloc((size_t)L->nsem, sizeof *sems);
    for (int round = 0; L->rounds == 0 ? !atomic_load(&L->stop) : round < L->rounds; round++) {
        for (int k = 0; k < L->nsem && !(L->rounds == 0 && atomic_load(&L->stop)); k++) {
            int i = (k + *idx * 7919 + round * 31) % L->nsem;
            if (sems[i] == NULL) {
                char name[64];
                snprintf(name, sizeof name, "%s-%d", L->base, i);
                rc = redsem_sem_open(cl, name, L->strategy, (uint32_t)L->limit, L->lease_ms,
                                     &sems[i]);
                if (rc != REDSEM_OK) {
                    note_error(L, cl, "open", rc);
                    atomic_fetch_add(&L->errors, 1);
                    continue;
                }
            }
            redsem_permit *p = NULL;
            int64_t t0 = tf_now_ms();
            rc = redsem_sem_acquire(sems[i], 30000, &p);
            if (rc != REDSEM_OK) {
                note_error(L, cl, "acquire", rc);
                atomic_fetch_add(&L->errors, 1);
                continue;
            }
            long long took = tf_now_ms() - t0, was = atomic_load(&L->longest_acquire_ms);
            while (took > was && !atomic_compare_exchange_weak(&L->longest_acquire_ms, &was, took))
                ;
            if (atomic_fetch_add(&L->inside[i], 1) + 1 > L->limit)
                atomic_fetch_add(&L->over, 1);
            atomic_fetch_add(&L->grants, 1);
            atomic_store(&L->last_grant_ms, tf_now_ms());
            if (L->hold_us > 0)
                usleep((useconds_t)L->hold_us);
            atomic_fetch_sub(&L->inside[i], 1);
            rc = redsem_permit_release(p);
            if (rc != REDSEM_OK) {
                note_error(L, cl, "release", rc);
                atomic_fetch_add(&L->release_errors, 1);
            }
            redsem_permit_free(p);
        }
    }
    for (int i = 0; i < L->nsem; i++)
        redsem_sem_free(sems[i]);
    free(sems);
    redsem_client_free(cl);
    return NULL;
}

/* What a load does (as the fields of load). */
typedef struct load_cfg {
    const char *base;
    int nsem, limit, threads, rounds;
    redsem_strategy strategy;
    int64_t retry_ms, lease_ms, hold_us;
    int64_t command_timeout_ms; /* 0: the default */
} load_cfg;

static void load_start(load *L, const ts_cluster *c, load_cfg cfg)
{
    memset(L, 0, sizeof *L);
    L->c = c;
    L->base = cfg.base;
    L->nsem = cfg.nsem;
    L->limit = cfg.limit;
    L->threads = cfg.threads;
    L->rounds = cfg.rounds;
    L->strategy = cfg.strategy;
    L->retry_ms = cfg.retry_ms;
    L->lease_ms = cfg.lease_ms;
    L->hold_us = cfg.hold_us;
    L->command_timeout_ms = cfg.command_timeout_ms;
    pthread_mutex_init(&L->mu, NULL);
    for (int t = 0; t < L->threads; t++) {
        L->w[t].L = L;
        L->w[t].i = t;
        cr_assert_eq(pthread_create(&L->tid[t], NULL, load_thread, &L->w[t]), 0);
    }
}

static void load_join(load *L)
{
    atomic_store(&L->stop, true);
    for (int t = 0; t < L->threads; t++)
        pthread_join(L->tid[t], NULL);
}

/* Wait until the load has made `more` grants beyond what it had (or ms pass). */
static void wait_grants(load *L, int more, int ms)
{
    int want = atomic_load(&L->grants) + more;
    int64_t until = tf_now_ms() + ms;
    while (atomic_load(&L->grants) < want && tf_now_ms() < until)
        tf_sleep_ms(5);
}

Test(cluster, a_thousand_semaphores_spread_and_capped, TO)
{
    ts_cluster c;
    start(&c, 0);
    /* under valgrind (the CI's valgrind setup) one round: the same checks, fewer grants */
    int rounds = getenv("REDSEM_VALGRIND") != NULL ? 1 : 2;
    static load L;
    load_start(&L, &c,
               (load_cfg){.base = "spread", .nsem = 1000, .limit = 2, .threads = 6,
                          .rounds = rounds, .strategy = REDSEM_STRATEGY_BASIC, .retry_ms = -1,
                          .lease_ms = 10000, .hold_us = 200});
    load_join(&L);
    cr_expect_eq(atomic_load(&L.errors), 0, "errors: first %s", L.first_error);
    cr_expect_eq(atomic_load(&L.release_errors), 0, "release errors: first %s", L.first_error);
    cr_expect_eq(atomic_load(&L.over), 0, "holders over the limit");
    cr_expect_eq(atomic_load(&L.grants), 6 * rounds * 1000);
    /* the spread: every primary holds a share of the 1,000 (the map from CLUSTER SLOTS) */
    int per[TS_CLUSTER_MAX] = {0};
    for (int i = 0; i < 1000; i++) {
        char name[32];
        snprintf(name, sizeof name, "spread-%d", i);
        int slot = slot_of(&c, name);
        per[16384 / 3 > slot ? 0 : 2 * 16384 / 3 > slot ? 1 : 2]++;
    }
    for (int p = 0; p < 3; p++) {
        char out[32] = "";
        cr_assert_eq(ts_command(&c.node[p], out, sizeof out, "DBSIZE", NULL), 0);
        cr_expect(per[p] > 250, "primary %d serves %d of the 1,000", p, per[p]);
        cr_expect(atoi(out) >= per[p], "primary %d holds %s keys for its %d semaphores", p, out,
                  per[p]);
    }
    fprintf(stderr, "spread: %d / %d / %d semaphores per primary\n", per[0], per[1], per[2]);
    ts_cluster_stop(&c);
}

/* ================================================================ resharding */

typedef struct pause_arg {
    load *L;
} pause_arg;

/* Between the first migrated batch and the rest: the slot is half-moved (ASK, TRYAGAIN);
 * let the load run into it. */
static void half_moved(void *arg)
{
    pause_arg *a = arg;
    wait_grants(a->L, 20, 3000);
}

STRATEGY_TEST(cluster_reshard, a_busy_slot_moves_under_contended_load, TO)
{
    ts_cluster c;
    start(&c, 0);
    static load L;
    load_start(&L, &c,
               (load_cfg){.base = "busy", .nsem = 1, .limit = 2, .threads = 6, .rounds = 0,
                          .strategy = strategy, .retry_ms = 10000, .lease_ms = 10000,
                          .hold_us = 2000});
    wait_grants(&L, 50, 20000);
    int slot = slot_of(&c, "busy-0");
    int from = ts_cluster_owner(&c, 0, slot), to = (from + 1) % 3;
    pause_arg pa = {&L};
    cr_assert_eq(ts_cluster_move_slot(&c, slot, from, to, half_moved, &pa), 0);
    cr_assert_eq(ts_cluster_wait_ok(&c, slot, 20000), 0);
    cr_assert_eq(ts_cluster_owner(&c, from, slot), to);
    /* and back again, while the load goes on */
    wait_grants(&L, 50, 20000);
    cr_assert_eq(ts_cluster_move_slot(&c, slot, to, from, half_moved, &pa), 0);
    wait_grants(&L, 50, 20000);
    load_join(&L);
    fprintf(stderr, "reshard (strategy %d): %d grants, %d over, %d errors, %d release errors%s%s\n",
            (int)strategy, atomic_load(&L.grants), atomic_load(&L.over), atomic_load(&L.errors),
            atomic_load(&L.release_errors), L.first_error[0] ? ": " : "", L.first_error);
    cr_expect_eq(atomic_load(&L.over), 0, "holders over the limit");
    cr_expect_eq(atomic_load(&L.errors), 0, "errors: first %s", L.first_error);
    cr_expect_eq(atomic_load(&L.release_errors), 0, "release errors: first %s", L.first_error);
    /* the keys moved: the semaphore's keys are all on the final owner */
    char key[64], out[32] = "";
    snprintf(key, sizeof key, "redsem:{busy-0}:meta");
    cr_expect_eq(ts_command(&c.node[from], out, sizeof out, "EXISTS", key, NULL), 0);
    cr_expect_str_eq(out, "1");
    ts_cluster_stop(&c);
}

/* ================================================================ failover */

/* Fail the primary serving busy-0 over (planned: CLUSTER FAILOVER on its replica; or SIGKILL)
 * under contended load; report the time to the first grant after it and the counts. */
static void failover_under_load(bool planned)
{
    ts_cluster c;
    start(&c, 1);
    static load L;
    load_start(&L, &c,
               (load_cfg){.base = planned ? "planned" : "unplanned", .nsem = 1, .limit = 2,
                          .threads = 4, .strategy = REDSEM_STRATEGY_FAIR, .retry_ms = 20000,
                          .lease_ms = 3000, .hold_us = 2000});
    wait_grants(&L, 50, 20000);
    char name[32];
    snprintf(name, sizeof name, "%s-0", L.base);
    int slot = slot_of(&c, name);
    int primary = ts_cluster_owner(&c, 0, slot), replica = primary + 3;
    int64_t at = tf_now_ms();
    if (planned) {
        cr_assert_eq(ts_command(&c.node[replica], NULL, 0, "CLUSTER", "FAILOVER", NULL), 0);
    } else {
        kill(c.node[primary].pid, SIGKILL);
        waitpid(c.node[primary].pid, NULL, 0);
        c.node[primary].pid = 0;
    }
    int64_t until = tf_now_ms() + 30000;
    while (ts_cluster_owner(&c, replica, slot) != replica && tf_now_ms() < until)
        tf_sleep_ms(10);
    cr_assert_eq(ts_cluster_owner(&c, replica, slot), replica, "the replica was not promoted");
    int64_t promoted = tf_now_ms();
    int before = atomic_load(&L.grants);
    while (atomic_load(&L.grants) == before && tf_now_ms() < until)
        tf_sleep_ms(1);
    int64_t first = tf_now_ms();
    wait_grants(&L, 100, 20000);
    load_join(&L);
    fprintf(stderr,
            "%s failover: promoted after %lld ms, first grant %lld ms after promotion "
            "(%lld ms after the %s); %d grants, %d over the limit, %d errors, %d release "
            "errors%s%s\n",
            planned ? "planned" : "unplanned", (long long)(promoted - at),
            (long long)(first - promoted), (long long)(first - at),
            planned ? "CLUSTER FAILOVER" : "SIGKILL", atomic_load(&L.grants),
            atomic_load(&L.over), atomic_load(&L.errors), atomic_load(&L.release_errors),
            L.first_error[0] ? "; first: " : "", L.first_error);
    cr_expect(atomic_load(&L.grants) > before, "no grant after the failover");
    cr_expect_eq(atomic_load(&L.errors), 0, "acquire errors: first %s", L.first_error);
    if (planned) /* a planned failover waits for the replica to catch up: nothing is lost */
        cr_expect_eq(atomic_load(&L.over), 0, "holders over the limit");
    ts_cluster_stop(&c);
}

Test(cluster_failover, planned, TO)
{
    failover_under_load(true);
}

Test(cluster_failover, unplanned_sigkill, TO)
{
    failover_under_load(false);
}

/* A primary that stops answering: SIGSTOP, so its port still accepts connections (the kernel
 * completes them) and nothing answers, as a host gone down, a partition or a black-holed
 * address look to a client; nothing refuses or resets, so no ECONN drives the client. Under
 * contended load (4 threads, a fair semaphore of limit 2, command timeout 500 ms, retry window
 * 20 s) the replica is promoted after cluster-node-timeout (1 s) plus the election, and the
 * calls waiting on the silent primary time out, re-read the map from the other nodes and
 * are granted by the promoted replica: the first grant comes soon after the promotion, no
 * acquire fails, none takes much longer than the failover, and nobody is over the limit.
 * Before timeouts drove a map refresh, every call timed out on the silent primary for good. */
Test(cluster_failover, a_primary_that_stops_answering, TO)
{
    ts_cluster c;
    start(&c, 1);
    static load L;
    load_start(&L, &c,
               (load_cfg){.base = "silent", .nsem = 1, .limit = 2, .threads = 4,
                          .strategy = REDSEM_STRATEGY_FAIR, .retry_ms = 20000,
                          .lease_ms = 3000, .hold_us = 2000, .command_timeout_ms = 500});
    wait_grants(&L, 50, 20000);
    int slot = slot_of(&c, "silent-0");
    int primary = ts_cluster_owner(&c, 0, slot), replica = primary + 3;
    cr_assert(primary >= 0 && primary < 3);
    int64_t at = tf_now_ms();
    kill(c.node[primary].pid, SIGSTOP);
    int64_t until = tf_now_ms() + 30000;
    while (ts_cluster_owner(&c, replica, slot) != replica && tf_now_ms() < until)
        tf_sleep_ms(10);
    int64_t promoted = tf_now_ms();
    bool was_promoted = ts_cluster_owner(&c, replica, slot) == replica;
    int before = atomic_load(&L.grants);
    while (was_promoted && atomic_load(&L.grants) == before && tf_now_ms() < until)
        tf_sleep_ms(1);
    int64_t first = tf_now_ms();
    if (was_promoted)
        wait_grants(&L, 100, 20000);
    load_join(&L);
    kill(c.node[primary].pid, SIGKILL);
    waitpid(c.node[primary].pid, NULL, 0);
    c.node[primary].pid = 0;
    long long longest = atomic_load(&L.longest_acquire_ms);
    fprintf(stderr,
            "silent primary: promoted %lld ms after SIGSTOP, first grant %lld ms after the "
            "promotion; longest acquire %lld ms; %d grants, %d over the limit, %d errors, %d "
            "release errors%s%s\n",
            (long long)(promoted - at), (long long)(first - promoted), longest,
            atomic_load(&L.grants), atomic_load(&L.over), atomic_load(&L.errors),
            atomic_load(&L.release_errors), L.first_error[0] ? "; first: " : "", L.first_error);
    cr_assert(was_promoted, "the replica was not promoted");
    cr_expect(atomic_load(&L.grants) > before, "no grant after the failover");
    /* expected within a command timeout and a map read of the promotion; generous bounds:
     * the machine may be loaded */
    cr_expect(first - promoted <= 3000, "first grant %lld ms after the promotion",
              (long long)(first - promoted));
    cr_expect(longest <= promoted - at + 5000, "an acquire took %lld ms (failover %lld ms)",
              longest, (long long)(promoted - at));
    cr_expect_eq(atomic_load(&L.errors), 0, "acquire errors: first %s", L.first_error);
    cr_expect_eq(atomic_load(&L.over), 0, "holders over the limit");
    ts_cluster_stop(&c);
}

/* A primary with no replica stops answering (SIGSTOP): nothing can take its slots over. A
 * call on one of its names (command timeout 300 ms, retry window 1 s) times out, re-reads the
 * map, polls it while the node is silent, sends again, and ends within its bounds
 * (REDSEM_EUNKNOWN: the acquire may have reached the stopped server), not in a loop or a
 * hang; after SIGCONT the same client's next acquire there is granted (the requests the
 * stopped server ran late granted nothing: their not-after time had passed). */
Test(cluster, a_silent_primary_without_a_replica_fails_calls_in_bounded_time, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, c.url), REDSEM_OK);
    cr_assert_eq(redsem_options_set_command_timeout_ms(o, 300), REDSEM_OK);
    cr_assert_eq(redsem_options_set_retry_ms(o, 1000), REDSEM_OK);
    redsem_client *cl = NULL;
    cr_assert_eq(redsem_client_new(o, &cl), REDSEM_OK);
    redsem_options_free(o);
    char name[32];
    int k = 0;
    do
        snprintf(name, sizeof name, "stopped-%d", k++);
    while (ts_cluster_owner(&c, 0, slot_of(&c, name)) != 2);
    redsem_sem *s = NULL;
    redsem_permit *p = NULL;
    OK(cl, redsem_sem_open(cl, name, REDSEM_STRATEGY_FAIR, 1, 5000, &s));
    OK(cl, redsem_sem_acquire(s, 1000, &p));
    OK(cl, redsem_permit_release(p));
    redsem_permit_free(p);
    p = NULL;
    kill(c.node[2].pid, SIGSTOP);
    int64_t t0 = tf_now_ms();
    int rc = redsem_sem_acquire(s, 200, &p);
    int64_t took = tf_now_ms() - t0;
    fprintf(stderr, "an acquire on a silent primary without a replica: %s after %lld ms (%s)\n",
            redsem_err_name(rc), (long long)took, redsem_client_errmsg(cl));
    kill(c.node[2].pid, SIGCONT);
    cr_expect_eq(rc, REDSEM_EUNKNOWN, "%s: %s", redsem_err_name(rc), redsem_client_errmsg(cl));
    /* the first timeout (300 ms), the window (1 s) and the last try's timeout; generous */
    cr_expect(took <= 6000, "took %lld ms", (long long)took);
    cr_assert_eq(ts_cluster_wait_ok(&c, slot_of(&c, name), 20000), 0);
    OK(cl, redsem_sem_acquire(s, 5000, &p));
    OK(cl, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* ================================================================ bad topologies */

Test(cluster, every_seed_down_is_econn_within_the_connect_timeout, TO)
{
    char url[128], err[512];
    snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d,127.0.0.1:%d", ts_free_port(),
             ts_free_port());
    int rc;
    int64_t t0 = tf_now_ms();
    redsem_client *cl = tf_client_try(url, -1, &rc, err, sizeof err);
    int64_t took = tf_now_ms() - t0;
    cr_expect_eq(rc, REDSEM_ECONN, "%s: %s", redsem_err_name(rc), err);
    cr_expect_null(cl);
    cr_expect(strstr(err, "slot map") != NULL, "%s", err);
    /* refused at once: this only checks that nothing waits past the timeouts (a hang) */
    cr_expect(took < 5000, "took %lld ms (connect timeout 1000 ms)", (long long)took);
}


/* A listening socket that never accepts nor answers (the kernel completes connections into
 * its backlog): a seed on a host that hangs. Its port; close *fd after. */
static int silent_port(int *fd)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(*fd >= 0);
    cr_assert_eq(bind(*fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(*fd, 64), 0);
    cr_assert_eq(fcntl(*fd, F_SETFL, O_NONBLOCK), 0); /* for accepted(): listen() ignores it */
    cr_assert_eq(getsockname(*fd, (struct sockaddr *)&a, &len), 0);
    return ntohs(a.sin_port);
}

/* How many connections the silent socket fd holds in its queue, taken (and closed) now. */
static int accepted(int fd)
{
    int n = 0, one;
    while ((one = accept4(fd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
        close(one);
        n++;
    }
    return n;
}

Test(cluster, a_standalone_server_behind_a_cluster_url_is_refused, TO)
{
    char url[128], err[512];
    ts_server own;
    cr_assert_eq(ts_server_start(&own, NULL, true), 0);
    snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", own.port);
    int rc;
    redsem_client *cl = tf_client_try(url, -1, &rc, err, sizeof err);
    cr_expect_eq(rc, REDSEM_EINVAL, "%s: %s", redsem_err_name(rc), err);
    cr_expect_null(cl);
    cr_expect(strstr(err, "not a cluster node") != NULL, "%s", err);
    ts_server_stop(&own);
}

Test(cluster, a_cluster_node_behind_a_plain_url_says_use_redis_cluster, TO)
{
    ts_cluster c;
    start(&c, 0);
    /* a name whose slot is not on node 0 */
    char name[32];
    int k = 0;
    do
        snprintf(name, sizeof name, "plain-%d", k++);
    while (ts_cluster_owner(&c, 0, slot_of(&c, name)) == 0);
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", c.node[0].port);
    redsem_client *cl = tf_client_for(url, -1, -1);
    redsem_sem *s = NULL;
    EXPECT(cl, REDSEM_ESERVER, redsem_sem_open(cl, name, REDSEM_STRATEGY_BASIC, 1, 5000, &s));
    cr_expect(strstr(redsem_client_errmsg(cl), "MOVED") != NULL &&
                  strstr(redsem_client_errmsg(cl), "redis+cluster://") != NULL,
              "%s", redsem_client_errmsg(cl));
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* The slot map changes behind the client (a slot moved by another tool): the next call gets
 * MOVED, follows it and updates the map; a later call goes straight to the new owner. */
Test(cluster, a_map_changed_behind_the_client_is_followed, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_client *cl = client(&c, -1);
    redsem_sem *s = NULL;
    redsem_permit *p = NULL;
    OK(cl, redsem_sem_open(cl, "moving", REDSEM_STRATEGY_FAIR, 1, 5000, &s));
    OK(cl, redsem_sem_acquire(s, 1000, &p));
    int slot = slot_of(&c, "moving");
    int from = ts_cluster_owner(&c, 0, slot), to = (from + 2) % 3;
    cr_assert_eq(ts_cluster_move_slot(&c, slot, from, to, NULL, NULL), 0);
    cr_assert_eq(ts_cluster_wait_ok(&c, slot, 20000), 0);
    /* the permit moved with its keys: it is still held and refreshes there */
    OK(cl, redsem_permit_refresh(p));
    redsem_permit *p2 = NULL;
    EXPECT(cl, REDSEM_EBUSY, redsem_sem_try_acquire(s, &p2));
    /* the retry of an acquire whose reply was lost (same holder id) finds the same permit on
     * the slot's new owner: the same fencing token, no second permit */
    OK(cl, redsem_sem_acquire_as(s, redsem_permit_id(p), 1000, &p2));
    cr_expect_eq(redsem_permit_token(p2), redsem_permit_token(p));
    redsem_permit_free(p2);
    p2 = NULL;
    OK(cl, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_client_stats st;
    OK(cl, redsem_client_get_stats(cl, &st));
    cr_expect(st.redirects >= 1, "redirects %llu", (unsigned long long)st.redirects);
    uint64_t before = st.redirects;
    OK(cl, redsem_sem_acquire(s, 1000, &p));
    OK(cl, redsem_permit_release(p));
    redsem_permit_free(p);
    OK(cl, redsem_client_get_stats(cl, &st));
    cr_expect_eq(st.redirects, before, "the map was updated: no more redirections");
    redsem_sem_free(s);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* Which node serves a name: redsem_status_server() and `redsem status` name the primary that
 * owns the slot, for names on each of the three primaries. */
Test(cluster, status_names_the_serving_node, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_client *cl = client(&c, -1);
    const char *bin = getenv("REDSEM_BIN");
    int found = 0;
    for (int k = 0; found != 7 && k < 64; k++) {
        char name[32];
        snprintf(name, sizeof name, "where-%d", k);
        int owner = ts_cluster_owner(&c, 0, slot_of(&c, name));
        if (owner < 0 || (found & (1 << owner)))
            continue;
        found |= 1 << owner;
        redsem_sem *s = NULL;
        redsem_status *st = NULL;
        OK(cl, redsem_sem_open(cl, name, REDSEM_STRATEGY_BASIC, 3, 5000, &s));
        OK(cl, redsem_sem_status(s, 10, &st));
        char want[64];
        snprintf(want, sizeof want, "127.0.0.1:%d", c.node[owner].port);
        cr_expect_str_eq(redsem_status_server(st), want, "%s", name);
        redsem_status_free(st);
        redsem_sem_free(s);
        if (bin != NULL) {
            char cmd[1024], out[4096] = "";
            snprintf(cmd, sizeof cmd, "%s status --url '%s' %s", bin, c.url, name);
            FILE *f = popen(cmd, "r");
            cr_assert_not_null(f);
            size_t got = fread(out, 1, sizeof out - 1, f);
            out[got] = '\0';
            cr_expect_eq(pclose(f), 0, "%s", out);
            char line[96];
            snprintf(line, sizeof line, "server: %s\n", want);
            cr_expect(strstr(out, line) != NULL, "%s: %s", cmd, out);
        }
    }
    cr_expect_eq(found, 7, "names on all three primaries");
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* ASK: a slot being migrated whose keys are not on the old owner any more (here: a fresh
 * name, no keys yet) is answered ASK; the call goes to the importing node with ASKING in the
 * same write, once, and the map is not changed (the next call is asked again). When the move
 * ends, MOVED. */
Test(cluster, ask_during_a_migration_goes_to_the_importing_node, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_client *cl = client(&c, -1);
    const char *name = "asked";
    int slot = slot_of(&c, name);
    int from = ts_cluster_owner(&c, 0, slot), to = (from + 1) % 3;
    char s[16], out[32];
    snprintf(s, sizeof s, "%d", slot);
    cr_assert_eq(ts_command(&c.node[to], NULL, 0, "CLUSTER", "SETSLOT", s, "IMPORTING",
                            c.id[from], NULL), 0);
    cr_assert_eq(ts_command(&c.node[from], NULL, 0, "CLUSTER", "SETSLOT", s, "MIGRATING",
                            c.id[to], NULL), 0);
    redsem_sem *sem = NULL;
    OK(cl, redsem_sem_open(cl, name, REDSEM_STRATEGY_BASIC, 1, 5000, &sem));
    /* (a plain EXISTS on the importing node would be MOVED: count the slot's keys) */
    cr_assert_eq(ts_command(&c.node[to], out, sizeof out, "CLUSTER", "COUNTKEYSINSLOT", s, NULL),
                 0);
    cr_expect_str_eq(out, "1", "the semaphore was created on the importing node");
    cr_assert_eq(ts_command(&c.node[from], out, sizeof out, "CLUSTER", "COUNTKEYSINSLOT", s,
                            NULL), 0);
    cr_expect_str_eq(out, "0");
    redsem_client_stats st;
    OK(cl, redsem_client_get_stats(cl, &st));
    cr_expect_eq(st.redirects, 1, "one ASK: %llu", (unsigned long long)st.redirects);
    /* a second handle's open is asked again: ASK does not change the map (a call on several
     * keys of which some are absent gets TRYAGAIN there until the move ends: see
     * docs/design.md) */
    redsem_sem *again = NULL;
    OK(cl, redsem_sem_open(cl, name, REDSEM_STRATEGY_BASIC, 1, 5000, &again));
    redsem_sem_free(again);
    OK(cl, redsem_client_get_stats(cl, &st));
    cr_expect_eq(st.redirects, 2, "a second ASK: %llu", (unsigned long long)st.redirects);
    /* the move ends: the slot is the importing node's, a call is MOVED there and works */
    for (int i = 0; i < 3; i++)
        (void)ts_command(&c.node[i], NULL, 0, "CLUSTER", "SETSLOT", s, "NODE", c.id[to], NULL);
    cr_assert_eq(ts_cluster_wait_ok(&c, slot, 20000), 0);
    redsem_permit *p = NULL;
    OK(cl, redsem_sem_acquire(sem, 1000, &p));
    OK(cl, redsem_permit_release(p));
    redsem_permit_free(p);
    OK(cl, redsem_client_get_stats(cl, &st));
    cr_expect_eq(st.redirects, 3, "then one MOVED: %llu", (unsigned long long)st.redirects);
    redsem_sem_free(sem);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* rediss+cluster://: every node over TLS (verified against the test CA), the same options as
 * rediss://; every strategy and the lock on names spread over the three primaries, each
 * served by the TLS port of its slot's primary. */
Test(cluster, every_strategy_over_tls, TO)
{
    const char *gen = getenv("REDSEM_GEN_CERTS");
    cr_assert_not_null(gen, "REDSEM_GEN_CERTS is not set (run through meson test)");
    char dir[64] = "/tmp/redsem-ctls-XXXXXX", cmd[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "%s %s", gen, dir);
    cr_assert_eq(system(cmd), 0, "%s failed (is the openssl command installed?)", cmd);
    ts_cluster c;
    int rc = ts_cluster_start_tls(&c, 3, 0, dir);
    if (rc == 77)
        cr_skip_test("redis-server is not installed");
    cr_assert_eq(rc, 0, "could not start the TLS cluster");
    redsem_options *o = NULL;
    char ca[128], err[512];
    snprintf(ca, sizeof ca, "%s/ca.crt", dir);
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, c.url), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_ca(o, ca, NULL), REDSEM_OK);
    redsem_client *cl = NULL;
    rc = redsem_client_new_verbose(o, &cl, err, sizeof err);
    redsem_options_free(o);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    int seen = 0;
    for (int k = 0; k < 16; k++) {
        char name[32], want[64];
        snprintf(name, sizeof name, "tls-%d", k);
        int owner = ts_cluster_owner(&c, 0, slot_of(&c, name));
        cr_assert(owner >= 0);
        seen |= 1 << owner;
        snprintf(want, sizeof want, "127.0.0.1:%d", c.tls_port[owner]);
        redsem_sem *s = NULL;
        redsem_lock *l = NULL;
        redsem_permit *p = NULL;
        redsem_status *st = NULL;
        if (k % 4 < 3) {
            OK(cl, redsem_sem_open(cl, name, (redsem_strategy)(k % 4 + 1), 1, 5000, &s));
            OK(cl, redsem_sem_acquire(s, 1000, &p));
            OK(cl, redsem_sem_status(s, 1, &st));
        } else {
            OK(cl, redsem_lock_open(cl, name, 5000, &l));
            OK(cl, redsem_lock_acquire(l, 1000, &p));
            OK(cl, redsem_lock_status(l, 1, &st));
        }
        cr_expect_str_eq(redsem_status_server(st), want, "%s", name);
        cr_expect_eq(redsem_status_holder_count(st), 1);
        redsem_status_free(st);
        OK(cl, redsem_permit_refresh(p));
        OK(cl, redsem_permit_release(p));
        redsem_permit_free(p);
        redsem_sem_free(s);
        redsem_lock_free(l);
    }
    cr_expect_eq(seen, 7, "names on all three primaries");
    redsem_client_stats stats;
    OK(cl, redsem_client_get_stats(cl, &stats));
    cr_expect_eq(stats.redirects, 0);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    (void)system(cmd);
}

/* Automatic renewal follows the slot: the renewer (on the client's cluster lanes) keeps
 * renewing a permit whose slot moved to another primary, past several leases. */
Test(cluster, renewal_follows_a_moved_slot, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_client *cl = client(&c, -1);
    redsem_sem *s = NULL;
    redsem_permit *p = NULL, *p2 = NULL;
    OK(cl, redsem_sem_open(cl, "renewed", REDSEM_STRATEGY_FAIR, 1, 600, &s));
    OK(cl, redsem_sem_acquire(s, 1000, &p));
    OK(cl, redsem_permit_auto_renew(p, 0, NULL, NULL));
    int slot = slot_of(&c, "renewed");
    int from = ts_cluster_owner(&c, 0, slot), to = (from + 1) % 3;
    cr_assert_eq(ts_cluster_move_slot(&c, slot, from, to, NULL, NULL), 0);
    cr_assert_eq(ts_cluster_wait_ok(&c, slot, 20000), 0);
    tf_sleep_ms(2000); /* more than three leases */
    cr_expect(redsem_permit_held(p), "the permit was lost after its slot moved");
    EXPECT(cl, REDSEM_EBUSY, redsem_sem_try_acquire(s, &p2));
    OK(cl, redsem_permit_stop_renewal(p));
    OK(cl, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* ================================================================ the node table */

/* A GET on the engine l (white-box: the internal API, as test_loop does), driven here until it
 * ends (10 s at most): its code. */
typedef struct eng_get {
    bool done;
    int rc;
} eng_get;

static int eng_get_reply(void *arg, int rc, redisReply **r, const redsem__req_info *info)
{
    (void)arg, (void)r, (void)info;
    return rc;
}

static void eng_get_done(void *arg, int rc, redsem_permit *p)
{
    (void)p;
    eng_get *g = arg;
    g->rc = rc;
    g->done = true;
}

static int engine_get(redsem__loop *l, const char *key)
{
    redsem__call call;
    redsem__call_init(&call, REDSEM__SCRIPT_NONE, REDSEM__REQ_RETRY, NULL);
    redsem__args_str(&call.ka, "GET");
    redsem__args_str(&call.ka, key);
    call.nkeys = 1;
    eng_get g = {0};
    cr_assert_eq(redsem__loop_run(l, &call, eng_get_reply, eng_get_done, &g), REDSEM_OK);
    int64_t end = tf_now_ms() + 10000;
    while (!g.done && tf_now_ms() < end) {
        redsem__loop_watch w[REDSEM__LOOP_WATCH_MAX];
        struct pollfd p[REDSEM__LOOP_WATCH_MAX];
        int64_t dl;
        int n = redsem__loop_wants(l, w, &dl);
        for (int i = 0; i < n; i++)
            p[i] = (struct pollfd){.fd = w[i].fd, .events = w[i].events};
        int64_t ms = dl == REDSEM__FOREVER ? 100 : (dl - redsem__now_ns()) / 1000000 + 1;
        int k = poll(p, (nfds_t)n, ms < 0 ? 0 : ms > 100 ? 100 : (int)ms);
        redsem__loop_step(l, p, k > 0 ? n : 0);
    }
    cr_assert(g.done, "the GET did not end within 10 s");
    return g.rc;
}

/* A primary whose address changes 1,000 times in an engine's life (a pod that moves):
 * white-box on an engine of a real client. Each change is the cluster's real CLUSTER SLOTS
 * reply with that primary's host replaced by a new loopback address where nothing listens
 * (127.0.x.y: the nodes listen on 127.0.0.1 only), read into the engine's map; every 100
 * changes a real call on the key meets the dead address (refused), re-reads the map from the
 * other nodes and is served by the real primary. The table drops the addresses that left the
 * map: every change is taken (before, the 256th new address failed with "more than 256
 * nodes" and the client stayed on a dead address for good: checked), and at the end, the
 * real map read and a second gone by, the engine holds just the three primaries (the seeds
 * are two of them). */
Test(cluster, a_thousand_address_changes_keep_the_node_table_small, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_client *cl = client(&c, 5000);
    /* a key on the primary that is not a seed (the URL names nodes 0 and 1) */
    char key[64];
    int k0 = 0;
    do
        snprintf(key, sizeof key, "{moving-%d}", k0++);
    while (ts_cluster_owner(&c, 0, keyslot(&c, key)) != 2);
    int slot = keyslot(&c, key);
    redsem__loop *l = NULL;
    cr_assert_eq(redsem__loop_new(cl, &l), REDSEM_OK);
    redsem__topo *t = redsem__loop_topo(l);
    cr_assert_eq(engine_get(l, key), REDSEM_OK, "%s", redsem_client_errmsg(cl));
    /* a node that gave the map: node 0 or 1, a seed */
    redsem__node *asked = NULL;
    for (size_t i = 0; i < t->nnodes && asked == NULL; i++)
        if (t->nodes[i] != NULL && t->nodes[i]->ep.port == c.node[0].port)
            asked = t->nodes[i];
    cr_assert_not_null(asked);
    struct timeval tv = {5, 0};
    redisContext *rc0 = redisConnectUnixWithTimeout(c.node[0].sock, tv);
    cr_assert(rc0 != NULL && rc0->err == 0);
    redisReply *map = redisCommand(rc0, "CLUSTER SLOTS");
    cr_assert(map != NULL && map->type == REDIS_REPLY_ARRAY);
    redisReply *host = NULL;
    for (size_t i = 0; i < map->elements; i++) {
        redisReply *e = map->element[i];
        if (e->element[0]->integer <= slot && slot <= e->element[1]->integer)
            host = e->element[2]->element[0];
    }
    cr_assert_not_null(host);
    char *real_host = host->str;
    size_t real_len = host->len, most = 0;
    char fake[32];
    for (int k = 0; k < 1000; k++) {
        snprintf(fake, sizeof fake, "127.0.%d.%d", 1 + k / 250, 2 + k % 250);
        host->str = fake;
        host->len = strlen(fake);
        char err[256] = "";
        cr_assert_eq(redsem__cluster_read_map(t, asked, map, err, sizeof err), REDSEM_OK,
                     "address change %d: %s", k + 1, err);
        redsem__node *n = redsem__topo_node(t, key, strlen(key));
        cr_assert(n != NULL && strcmp(n->ep.host, fake) == 0 && n->ep.port == c.node[2].port,
                  "change %d: the map names %s", k + 1, n ? n->ep.host : "nothing");
        size_t live = redsem__cluster_live_nodes(t);
        most = live > most ? live : most;
        if (k % 100 == 99) {
            /* a call meets the dead address, and finds the primary again */
            t->refreshed_ns = 0; /* (the map read just now was the test's) */
            cr_assert_eq(engine_get(l, key), REDSEM_OK, "after change %d: %s", k + 1,
                         redsem_client_errmsg(cl));
            n = redsem__topo_node(t, key, strlen(key));
            cr_assert(n != NULL && strcmp(n->ep.host, "127.0.0.1") == 0 &&
                      n->ep.port == c.node[2].port);
        }
    }
    host->str = real_host;
    host->len = real_len;
    char err[256] = "";
    cr_assert_eq(redsem__cluster_read_map(t, asked, map, err, sizeof err), REDSEM_OK, "%s", err);
    freeReplyObject(map);
    redisFree(rc0);
    /* once the dead addresses have been idle for REDSEM__CLUSTER_DROP_MS, a call drops them */
    tf_sleep_ms(REDSEM__CLUSTER_DROP_MS + 100);
    cr_assert_eq(engine_get(l, key), REDSEM_OK, "%s", redsem_client_errmsg(cl));
    fprintf(stderr, "1,000 address changes: at most %zu nodes held at once, %zu at the end\n",
            most, redsem__cluster_live_nodes(t));
    cr_expect_eq(redsem__cluster_live_nodes(t), 3, "%zu nodes held",
                 redsem__cluster_live_nodes(t));
    cr_expect(most <= REDSEM__CLUSTER_NODES_MAX);
    redsem__loop_free(l);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* ---------------------------------------------------------------- the event-loop API */

/* How many threads run now that were not among before (nb ids). */
static int fresh_threads(const long *before, int nb)
{
    long now[256];
    int n = tf_thread_ids(now, 256), fresh = 0;
    for (int i = 0; i < n; i++) {
        bool old = false;
        for (int j = 0; j < nb && !old; j++)
            old = now[i] == before[j];
        fresh += !old;
    }
    return fresh;
}

/* A poll() loop that gives the redsem_async its descriptor and its one timer (so that the loop
 * engine, when built, runs its operations). */
typedef struct cl_loop {
    redsem_async *a;
    int fd;
    int64_t timer_at; /* ms, -1: none */
} cl_loop;

static void cl_socket(redsem_async *a, int fd, int what, void *data)
{
    (void)a;
    ((cl_loop *)data)->fd = what & REDSEM_WATCH_REMOVE ? -1 : fd;
}

static void cl_timer(redsem_async *a, int64_t ms, void *data)
{
    (void)a;
    ((cl_loop *)data)->timer_at = ms < 0 ? -1 : tf_now_ms() + ms;
}

typedef struct cl_op {
    int done, rc;
    redsem_permit *permit;
} cl_op;

static void cl_done(redsem_async *a, const redsem_result *r, void *user)
{
    (void)a;
    cl_op *o = user;
    o->rc = r->rc;
    o->permit = r->permit;
    o->done = 1;
}

/* Run the loop until op is done (or ms pass); whether it is. */
static bool cl_run(cl_loop *x, const cl_op *op, int64_t ms)
{
    int64_t end = tf_now_ms() + ms;
    while (!op->done && tf_now_ms() < end) {
        tf_poll_turn(x->a, &x->fd, &x->timer_at);
    }
    return op->done;
}

/* One acquire of n on the loop, waiting up to timeout_ms: its code (*ret_permit on OK). */
static int cl_acquire(cl_loop *x, redsem_sem *s, int64_t timeout_ms, redsem_permit **ret_permit)
{
    cl_op op = {0};
    cr_assert_eq(redsem_sem_acquire_async(x->a, s, 1, timeout_ms, cl_done, &op, NULL), REDSEM_OK);
    cr_assert(cl_run(x, &op, timeout_ms + 30000), "the acquire was not called back");
    *ret_permit = op.permit;
    return op.rc;
}

static int cl_release(cl_loop *x, redsem_permit *p)
{
    cl_op op = {0};
    cr_assert_eq(redsem_permit_release_async(x->a, p, cl_done, &op, NULL), REDSEM_OK);
    cr_assert(cl_run(x, &op, 30000), "the release was not called back");
    redsem_permit_free(p);
    return op.rc;
}

/* The holders of s now, as the server counts them (a blocking status). */
static size_t cl_holders(redsem_sem *s)
{
    redsem_status *st = NULL;
    cr_assert_eq(redsem_sem_status(s, 0, &st), REDSEM_OK);
    size_t n = redsem_status_holder_count(st);
    redsem_status_free(st);
    return n;
}

/* A name (base-N) whose slot primary `node` owns. */
static void name_on(const ts_cluster *c, int node, const char *base, char *name, size_t len)
{
    for (int i = 0; i < 1000; i++) {
        snprintf(name, len, "%s-%d", base, i);
        if (ts_cluster_owner(c, 0, slot_of(c, name)) == node)
            return;
    }
    cr_assert_fail("no name on node %d", node);
}

/* The first seed hangs (connects, never answers), the second is a healthy node: the client is
 * made (each seed gets a share of the connect timeout) and works; before, the first seed used
 * the whole connect timeout and the client failed with a healthy seed in its URL. Then the
 * same with two silent seeds before the healthy one. A second engine of the client (its
 * event-loop API's) asks the seed that answered first, and no silent one: a seed that hangs
 * costs the client's first map only. */
Test(cluster, a_seed_that_hangs_does_not_keep_the_others_from_being_asked, TO)
{
    ts_cluster c;
    start(&c, 0);
    int fd, fd2;
    int silent = silent_port(&fd), silent2 = silent_port(&fd2);
    char urls[2][256];
    snprintf(urls[0], sizeof urls[0], "redis+cluster://127.0.0.1:%d,127.0.0.1:%d", silent,
             c.node[1].port);
    snprintf(urls[1], sizeof urls[1], "redis+cluster://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d",
             silent, silent2, c.node[2].port);
    for (int u = 0; u < 2; u++) {
        char err[512] = "";
        int rc;
        int64_t t0 = tf_now_ms();
        redsem_client *cl = tf_client_try(urls[u], -1, &rc, err, sizeof err);
        int64_t took = tf_now_ms() - t0;
        cr_assert_eq(rc, REDSEM_OK, "%s: %s: %s", urls[u], redsem_err_name(rc), err);
        fprintf(stderr, "%d silent seed(s) first: the client made in %lld ms\n", u + 1,
                (long long)took);
        /* the silent seeds' shares of the 1 s connect timeout, and no more */
        cr_expect(took < 5000, "took %lld ms", (long long)took);
        /* a second engine of the client (its event-loop API's) asks the seed that answered
         * first: no new connection to the silent ones */
        int before = accepted(fd) + accepted(fd2);
        cr_expect(before >= u + 1, "%d connections to the silent seeds", before);
        redsem_sem *s = NULL;
        redsem_permit *p = NULL;
        OK(cl, redsem_sem_open(cl, "past-a-silent-seed", REDSEM_STRATEGY_FAIR, 1, 5000, &s));
        cl_loop x = {.fd = -1, .timer_at = -1};
        OK(cl, redsem_async_new(cl, &x.a));
        OK(cl, redsem_async_set_loop(x.a, cl_socket, cl_timer, &x));
        int64_t t1 = tf_now_ms();
        cr_assert_eq(cl_acquire(&x, s, 1000, &p), REDSEM_OK);
        fprintf(stderr, "a second engine's first call: %lld ms\n", (long long)(tf_now_ms() - t1));
        cr_expect_eq(accepted(fd) + accepted(fd2), 0, "a second engine asked a silent seed again");
        cr_expect_eq(cl_release(&x, p), REDSEM_OK);
        redsem_async_free(x.a);
        OK(cl, redsem_sem_acquire(s, 1000, &p));
        OK(cl, redsem_permit_release(p));
        redsem_permit_free(p);
        redsem_sem_free(s);
        redsem_client_free(cl);
    }
    close(fd);
    close(fd2);
    ts_cluster_stop(&c);
}

/* The event-loop API on a Cluster client, on a loop that gives a timer: acquires on
 * semaphores served by each of the three primaries are granted, up to each limit (a try
 * beyond is EBUSY), a waiter is granted after a release (a Cluster client's waiters poll on
 * the engine), releases go to the right node; and on the loop engine's build no thread is
 * started for any of it (each node's connection is the engine's, on the loop). */
Test(cluster, the_event_loop_api_on_every_primary_starts_no_thread, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_client *cl = client(&c, -1);
    long before[256];
    int nb = tf_thread_ids(before, 256);
    cl_loop x = {.fd = -1, .timer_at = -1};
    OK(cl, redsem_async_new(cl, &x.a));
    OK(cl, redsem_async_set_loop(x.a, cl_socket, cl_timer, &x));
    for (int node = 0; node < 3; node++) {
        char name[64];
        name_on(&c, node, "looped", name, sizeof name);
        redsem_sem *s = NULL;
        OK(cl, redsem_sem_open(cl, name, node == 1 ? REDSEM_STRATEGY_FAIR : REDSEM_STRATEGY_BASIC,
                               2, 10000, &s));
        redsem_permit *p[3] = {NULL};
        for (int i = 0; i < 2; i++)
            cr_expect_eq(cl_acquire(&x, s, 1000, &p[i]), REDSEM_OK, "node %d, acquire %d", node, i);
        cr_expect_eq(cl_acquire(&x, s, 0, &p[2]), REDSEM_EBUSY, "node %d: over the limit", node);
        cr_expect_eq(cl_holders(s), 2);
        /* a waiter, granted once a holder releases */
        cl_op w = {0};
        cr_assert_eq(redsem_sem_acquire_async(x.a, s, 1, 20000, cl_done, &w, NULL), REDSEM_OK);
        cl_op none = {0};
        (void)cl_run(&x, &none, 100);
        cr_expect_eq(w.done, 0, "node %d: the waiter was not kept waiting", node);
        cr_expect_eq(cl_release(&x, p[0]), REDSEM_OK);
        cr_assert(cl_run(&x, &w, 30000));
        cr_expect_eq(w.rc, REDSEM_OK, "node %d: the waiter: %s", node, redsem_err_name(w.rc));
        cr_expect_eq(cl_holders(s), 2);
        if (w.permit != NULL)
            cr_expect_eq(cl_release(&x, w.permit), REDSEM_OK);
        cr_expect_eq(cl_release(&x, p[1]), REDSEM_OK);
        cr_expect_eq(cl_holders(s), 0);
        redsem_sem_free(s);
    }
    int fresh = fresh_threads(before, nb);
    cr_expect_eq(fresh, 0, "the loop engine started %d thread(s)", fresh);
    redsem_async_free(x.a);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* A slot moved while the event-loop API holds a permit there: the next acquire on the loop
 * is answered MOVED, follows it to the new owner and is granted; the permit moved with the
 * keys, so the holders never exceed the limit (a try beyond is EBUSY); no thread started. */
Test(cluster, the_event_loop_api_follows_a_moved_slot, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_client *cl = client(&c, -1);
    long before[256];
    int nb = tf_thread_ids(before, 256);
    cl_loop x = {.fd = -1, .timer_at = -1};
    OK(cl, redsem_async_new(cl, &x.a));
    OK(cl, redsem_async_set_loop(x.a, cl_socket, cl_timer, &x));
    redsem_sem *s = NULL;
    OK(cl, redsem_sem_open(cl, "loopmoving", REDSEM_STRATEGY_BASIC, 2, 10000, &s));
    redsem_permit *p = NULL, *p2 = NULL, *p3 = NULL;
    cr_assert_eq(cl_acquire(&x, s, 1000, &p), REDSEM_OK);
    int slot = slot_of(&c, "loopmoving");
    int from = ts_cluster_owner(&c, 0, slot), to = (from + 1) % 3;
    cr_assert_eq(ts_cluster_move_slot(&c, slot, from, to, NULL, NULL), 0);
    cr_assert_eq(ts_cluster_wait_ok(&c, slot, 20000), 0);
    redsem_client_stats st;
    OK(cl, redsem_client_get_stats(cl, &st));
    uint64_t redirects = st.redirects;
    cr_expect_eq(cl_acquire(&x, s, 1000, &p2), REDSEM_OK, "after the move");
    cr_expect_eq(cl_acquire(&x, s, 0, &p3), REDSEM_EBUSY, "the limit holds after the move");
    OK(cl, redsem_client_get_stats(cl, &st)); /* (before a blocking call's own MOVED) */
    cr_expect(st.redirects > redirects, "no redirection followed: %llu",
              (unsigned long long)st.redirects);
    cr_expect_eq(cl_holders(s), 2);
    cr_expect_eq(cl_release(&x, p), REDSEM_OK);
    if (p2 != NULL)
        cr_expect_eq(cl_release(&x, p2), REDSEM_OK);
    cr_expect_eq(cl_holders(s), 0);
    int fresh = fresh_threads(before, nb);
    cr_expect_eq(fresh, 0, "the loop engine started %d thread(s)", fresh);
    redsem_sem_free(s);
    redsem_async_free(x.a);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* A slot half-moved (IMPORTING / MIGRATING, the semaphore's keys on the importing node)
 * while an acquire runs on the loop: the old owner answers ASK, the importing node (ASKING and
 * the call in one write) TRYAGAIN while not every key of the call is there; the op pauses on
 * its timer and sends again within its retry window, the loop keeps running; once the move
 * ends the call is MOVED to the new owner and granted. */
Test(cluster, the_event_loop_api_waits_out_a_migration, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_client *cl = client(&c, 20000);
    cl_loop x = {.fd = -1, .timer_at = -1};
    OK(cl, redsem_async_new(cl, &x.a));
    OK(cl, redsem_async_set_loop(x.a, cl_socket, cl_timer, &x));
    const char *name = "loopasked";
    int slot = slot_of(&c, name);
    int from = ts_cluster_owner(&c, 0, slot), to = (from + 1) % 3;
    char s[16];
    snprintf(s, sizeof s, "%d", slot);
    cr_assert_eq(ts_command(&c.node[to], NULL, 0, "CLUSTER", "SETSLOT", s, "IMPORTING",
                            c.id[from], NULL), 0);
    cr_assert_eq(ts_command(&c.node[from], NULL, 0, "CLUSTER", "SETSLOT", s, "MIGRATING",
                            c.id[to], NULL), 0);
    redsem_sem *sem = NULL;
    OK(cl, redsem_sem_open(cl, name, REDSEM_STRATEGY_BASIC, 1, 5000, &sem));
    redsem_client_stats st;
    OK(cl, redsem_client_get_stats(cl, &st));
    uint64_t redirects = st.redirects, retries = st.retries;
    cl_op op = {0};
    cr_assert_eq(redsem_sem_acquire_async(x.a, sem, 1, 15000, cl_done, &op, NULL), REDSEM_OK);
    cl_op none = {0};
    (void)cl_run(&x, &none, 300);
    OK(cl, redsem_client_get_stats(cl, &st));
    cr_expect(st.redirects > redirects, "no ASK followed on the loop");
    cr_expect(st.retries > retries, "no TRYAGAIN waited out on the loop");
    cr_expect_eq(op.done, 0, "granted before the move ended");
    for (int i = 0; i < 3; i++)
        (void)ts_command(&c.node[i], NULL, 0, "CLUSTER", "SETSLOT", s, "NODE", c.id[to], NULL);
    cr_assert(cl_run(&x, &op, 30000), "the acquire was not called back");
    cr_expect_eq(op.rc, REDSEM_OK, "%s", redsem_err_name(op.rc));
    if (op.permit != NULL)
        cr_expect_eq(cl_release(&x, op.permit), REDSEM_OK);
    redsem_sem_free(sem);
    redsem_async_free(x.a);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* The engine's connection to a node is killed between two acquires on the loop: the next
 * one's request is lost with it, the map is asked for again and the request sent again on a
 * new connection within the retry window: granted, one permit. */
Test(cluster, the_event_loop_api_resends_after_a_lost_node_connection, TO)
{
    ts_cluster c;
    start(&c, 0);
    redsem_client *cl = client(&c, 5000);
    cl_loop x = {.fd = -1, .timer_at = -1};
    OK(cl, redsem_async_new(cl, &x.a));
    OK(cl, redsem_async_set_loop(x.a, cl_socket, cl_timer, &x));
    redsem_sem *s = NULL;
    OK(cl, redsem_sem_open(cl, "loopkilled", REDSEM_STRATEGY_BASIC, 2, 10000, &s));
    redsem_permit *p = NULL, *p2 = NULL;
    cr_assert_eq(cl_acquire(&x, s, 1000, &p), REDSEM_OK);
    int owner = ts_cluster_owner(&c, 0, slot_of(&c, "loopkilled"));
    cr_assert_eq(ts_command(&c.node[owner], NULL, 0, "CLIENT", "KILL", "TYPE", "normal", NULL), 0);
    redsem_client_stats st;
    OK(cl, redsem_client_get_stats(cl, &st));
    uint64_t connects = st.connects;
    cr_expect_eq(cl_acquire(&x, s, 1000, &p2), REDSEM_OK);
    OK(cl, redsem_client_get_stats(cl, &st));
    cr_expect(st.connects > connects, "no new connection");
    cr_expect_eq(cl_holders(s), 2);
    cr_expect_eq(cl_release(&x, p), REDSEM_OK);
    if (p2 != NULL)
        cr_expect_eq(cl_release(&x, p2), REDSEM_OK);
    cr_expect_eq(cl_holders(s), 0);
    redsem_sem_free(s);
    redsem_async_free(x.a);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}

/* The primary serving a semaphore is killed (SIGKILL) while the event-loop API uses it: the
 * next acquire on the loop finds its node gone (refused), asks the other nodes for the map
 * and sends again within its retry window until the map names the promoted replica: granted
 * there, the loop never blocked. */
Test(cluster_failover, the_event_loop_api_follows_a_failover, TO)
{
    ts_cluster c;
    start(&c, 1);
    redsem_client *cl = client(&c, 30000);
    cl_loop x = {.fd = -1, .timer_at = -1};
    OK(cl, redsem_async_new(cl, &x.a));
    OK(cl, redsem_async_set_loop(x.a, cl_socket, cl_timer, &x));
    redsem_sem *s = NULL;
    OK(cl, redsem_sem_open(cl, "loopfailed", REDSEM_STRATEGY_BASIC, 2, 60000, &s));
    redsem_permit *p = NULL, *p2 = NULL;
    cr_assert_eq(cl_acquire(&x, s, 1000, &p), REDSEM_OK);
    int slot = slot_of(&c, "loopfailed");
    int primary = ts_cluster_owner(&c, 0, slot), replica = primary + 3;
    kill(c.node[primary].pid, SIGKILL);
    waitpid(c.node[primary].pid, NULL, 0);
    c.node[primary].pid = 0;
    cr_expect_eq(cl_acquire(&x, s, 25000, &p2), REDSEM_OK, "after the failover");
    cr_expect_eq(ts_cluster_owner(&c, replica, slot), replica, "the replica was not promoted");
    if (p2 != NULL)
        cr_expect_eq(cl_release(&x, p2), REDSEM_OK);
    redsem_permit_free(p); /* held on the killed primary: its lease lapses */
    redsem_sem_free(s);
    redsem_async_free(x.a);
    redsem_client_free(cl);
    ts_cluster_stop(&c);
}
