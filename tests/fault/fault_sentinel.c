/* Scenario 15 (issue 9): a Sentinel-managed primary SIGKILLed during contended load, every
 * strategy and the lock. One primary, two replicas, three Sentinels (down-after 500 ms,
 * failover-timeout 2 s); limit + 3 worker processes acquire through redis+sentinel:// with
 * renewal and a retry window longer than a failover, hold 20-60 ms, release. Measured: the
 * time from the kill to the first grant (on the promoted replica), the holders over the limit
 * (the checker's sweep over every worker's grants: asynchronous replication can lose a grant
 * the promoted replica had not received, docs/guarantees.md; counted, not asserted), and the
 * errors callers saw. Asserted: grants resume after the failover, and no call hangs. */
#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "sentinel.h"

#define LEASE_MS 2000

static void failover(fw_kind kind)
{
    fh_run r;
    uint32_t limit = kind == FW_LOCK ? 1 : 2;
    char label[64];
    snprintf(label, sizeof label, "sentinel-failover-%s", fw_kind_name(kind));
    fh_setup(&r, label, kind, limit, LEASE_MS, (const char *const *)-1, false);
    ts_sentinels sc;
    cr_assert_eq(ts_sentinels_start(&sc), 0, "could not start the Sentinel setup");
    snprintf(r.url, sizeof r.url, "%s", sc.url);
    const char *args[] = {"--hold-min-us", "20000", "--hold-max-us", "60000", "--timeout-ms",
                          "3000", "--retry-ms", "15000", "--renew", NULL};
    for (unsigned i = 0; i < limit + 3; i++)
        fh_spawn(&r, NULL, args);
    fw_sleep_ns(1500 * 1000000LL); /* contended load on the first primary */
    int old_port = sc.primary.port;
    fh_fault(&r, "primary SIGKILL", true);
    int64_t t_kill = fw_now_ns();
    ts_server_kill(&sc.primary);
    /* the failover: Sentinel promotes a replica within down-after + election time */
    int64_t until = fw_now_ns() + 20000 * 1000000LL;
    int port = old_port;
    while (fw_now_ns() < until && ((port = ts_sentinels_primary_port(&sc)) == old_port || port < 0))
        fw_sleep_ns(50 * 1000000LL);
    cr_assert(port > 0 && port != old_port, "no failover within 20 s of the kill");
    fh_fault(&r, "primary SIGKILL", false);
    fw_sleep_ns(3000 * 1000000LL); /* load on the new primary */
    int killed = fh_finish(&r, 20000);
    fw_check_result res;
    fh_check(&r, &res);
    /* the first grant after the kill, from the workers' logs */
    fw_event *ev = NULL;
    ssize_t n = fw_logs_read(r.dir, &ev);
    cr_assert_geq(n, 0);
    int64_t first = -1;
    size_t after = 0;
    for (ssize_t i = 0; i < n; i++) {
        if (ev[i].ev == EV_ACQ && ev[i].t_ns > t_kill) {
            if (first < 0 || ev[i].t_ns < first)
                first = ev[i].t_ns;
            after++;
        }
    }
    free(ev);
    char errs[256] = "";
    for (int c = 0; c < 32; c++)
        if (res.errors_by_code[c])
            snprintf(errs + strlen(errs), sizeof errs - strlen(errs), " %s=%zu",
                     redsem_err_name(-c), res.errors_by_code[c]);
    fprintf(stderr,
            "SCENARIO 15 sentinel failover %s (limit %u): first grant %lld ms after the "
            "primary was killed; %zu grants after it; holders over the limit: %zu instants "
            "(%lld ms in all, max %d definite holders); unknown outcomes %zu; errors %zu%s; "
            "lost %zu; workers still running at the end %d\n",
            fw_kind_name(kind), limit, first < 0 ? -1LL : (long long)((first - t_kill) / 1000000),
            after, res.violations, (long long)(res.violation_ns / 1000000), res.max_definite,
            res.unknown, res.errors, errs, res.lost, killed);
    cr_expect_geq(first, 0, "no grant after the failover");
    cr_expect_gt(after, 0);
    cr_expect_eq(killed, 0, "%d workers had to be killed: a call hung", killed);
    ts_sentinels_stop(&sc);
    fh_teardown(&r);
}

Test(sentinel, primary_killed_under_load_basic, .timeout = 120) { failover(FW_BASIC); }
Test(sentinel, primary_killed_under_load_fair, .timeout = 120) { failover(FW_FAIR); }
Test(sentinel, primary_killed_under_load_locked, .timeout = 120) { failover(FW_LOCKED); }
Test(sentinel, primary_killed_under_load_lock, .timeout = 120) { failover(FW_LOCK); }

/* ---------------------------------------------------------------- planned failover */

/* The announcements, as the Sentinels publish them: a subscription to +promoted-slave and
 * +switch-master on each Sentinel (hiredis over its unix socket, read with poll), the first
 * time each was seen. And a MONITOR of the old primary: the last script (EVAL, EVALSHA) a
 * client ran there, by the server's clock (Sentinel sends none). */
typedef struct announce_watch {
    const ts_sentinels *sc;
    const ts_server *old;
    _Atomic int stop;
    _Atomic int64_t promoted_ns, switched_ns; /* CLOCK_MONOTONIC; 0: not seen */
    _Atomic int64_t last_script_ns;           /* on the old primary, CLOCK_MONOTONIC */
    _Atomic int monitoring;
    pthread_t th;
} announce_watch;

static int64_t realtime_minus_monotonic_us(void)
{
    struct timespec r, m;
    clock_gettime(CLOCK_REALTIME, &r);
    clock_gettime(CLOCK_MONOTONIC, &m);
    return ((int64_t)r.tv_sec - m.tv_sec) * 1000000 + (r.tv_nsec - m.tv_nsec) / 1000;
}

static void *watch_announcements(void *arg)
{
    announce_watch *a = arg;
    redisContext *ctx[4] = {NULL, NULL, NULL, NULL};
    struct timeval tv = {2, 0};
    for (int i = 0; i < 3; i++) {
        ctx[i] = redisConnectUnixWithTimeout(a->sc->sentinel[i].sock, tv);
        if (ctx[i] == NULL || ctx[i]->err ||
            redisAppendCommand(ctx[i], "SUBSCRIBE +promoted-slave +switch-master") != REDIS_OK)
            return NULL;
    }
    ctx[3] = redisConnectUnixWithTimeout(a->old->sock, tv);
    if (ctx[3] == NULL || ctx[3]->err || redisAppendCommand(ctx[3], "MONITOR") != REDIS_OK)
        return NULL;
    for (int i = 0; i < 4; i++) {
        int done = 0;
        while (!done)
            if (redisBufferWrite(ctx[i], &done) != REDIS_OK)
                return NULL;
    }
    int64_t off_us = realtime_minus_monotonic_us();
    atomic_store(&a->monitoring, 1);
    while (!atomic_load(&a->stop)) {
        struct pollfd p[4];
        for (int i = 0; i < 4; i++)
            p[i] = (struct pollfd){.fd = ctx[i]->fd, .events = POLLIN};
        if (poll(p, 4, 50) <= 0)
            continue;
        int64_t now = fw_now_ns();
        for (int i = 0; i < 4; i++) {
            if (!(p[i].revents & POLLIN) || redisBufferRead(ctx[i]) != REDIS_OK)
                continue;
            void *v = NULL;
            while (redisGetReplyFromReader(ctx[i], &v) == REDIS_OK && v != NULL) {
                redisReply *r = v;
                if (i < 3 && r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                    r->element[0]->type == REDIS_REPLY_STRING &&
                    strcmp(r->element[0]->str, "message") == 0) {
                    _Atomic int64_t *at = strcmp(r->element[1]->str, "+promoted-slave") == 0
                                              ? &a->promoted_ns
                                              : &a->switched_ns;
                    int64_t zero = 0;
                    atomic_compare_exchange_strong(at, &zero, now);
                } else if (i == 3 && r->type == REDIS_REPLY_STATUS && r->str != NULL &&
                           (strstr(r->str, "] \"EVALSHA\"") || strstr(r->str, "] \"EVAL\"") ||
                            strstr(r->str, "] \"evalsha\""))) {
                    /* "1690000000.123456 [0 127.0.0.1:54321] "EVALSHA" ..." */
                    double t = strtod(r->str, NULL);
                    atomic_store(&a->last_script_ns,
                                 ((int64_t)(t * 1e6) - off_us) * 1000);
                }
                freeReplyObject(r);
            }
        }
    }
    for (int i = 0; i < 4; i++)
        redisFree(ctx[i]);
    return NULL;
}

/* One trial (issue 24): a limit-1 semaphore, 3 long-lived worker processes acquiring through
 * redis+sentinel:// (renewal, hold 20-60 ms), SENTINEL FAILOVER, and 3 new workers started as
 * soon as the Sentinels name the new primary (new clients go there at once); 12 s of load
 * after it, past the old primary's demotion (about 10 s after the failover). Measured:
 * overlapping grants (holder intervals that overlap another: limit 1), the last of them and
 * the last script the old primary ran for a client, each relative to the first
 * +promoted-slave and the first +switch-master any Sentinel published. With wait_replicas
 * the workers WAIT for 1 replica after each grant and refresh. Counted, not asserted, but for
 * the target: no grant on the old primary later than 1 s after +switch-master (the last
 * overlap's start). */
static void planned_trial(bool wait_replicas, int trial)
{
    fh_run r;
    char label[64];
    snprintf(label, sizeof label, "sentinel-planned-%s-%d", wait_replicas ? "wait" : "nowait",
             trial);
    fh_setup(&r, label, FW_BASIC, 1, LEASE_MS, (const char *const *)-1, false);
    ts_sentinels sc;
    cr_assert_eq(ts_sentinels_start(&sc), 0, "could not start the Sentinel setup");
    snprintf(r.url, sizeof r.url, "%s", sc.url);
    const char *args[] = {"--hold-min-us", "20000", "--hold-max-us", "60000", "--timeout-ms",
                          "3000", "--retry-ms", "15000", "--renew",
                          wait_replicas ? "--sync-replicas" : NULL, "1", NULL};
    for (int i = 0; i < 3; i++)
        fh_spawn(&r, NULL, args);
    announce_watch aw = {.sc = &sc, .old = &sc.primary};
    cr_assert_eq(pthread_create(&aw.th, NULL, watch_announcements, &aw), 0);
    fw_sleep_ns(1500 * 1000000LL);
    cr_assert(atomic_load(&aw.monitoring), "the announcement watch did not start");
    int old_port = sc.primary.port;
    fh_fault(&r, "SENTINEL FAILOVER", true);
    int64_t t_failover = fw_now_ns();
    cr_assert_eq(ts_command(&sc.sentinel[0], NULL, 0, "SENTINEL", "FAILOVER", "mymaster", NULL),
                 0, "SENTINEL FAILOVER refused");
    int64_t until = fw_now_ns() + 20000 * 1000000LL;
    int port = old_port;
    while (fw_now_ns() < until &&
           ((port = ts_sentinels_primary_port(&sc)) == old_port || port < 0))
        fw_sleep_ns(10 * 1000000LL);
    cr_assert(port > 0 && port != old_port, "no failover within 20 s");
    for (int i = 0; i < 3; i++)
        fh_spawn(&r, NULL, args); /* new clients: they resolve the new primary */
    fw_sleep_ns(12000 * 1000000LL);
    fh_fault(&r, "SENTINEL FAILOVER", false);
    atomic_store(&aw.stop, 1);
    pthread_join(aw.th, NULL);
    int killed = fh_finish(&r, 20000);
    fw_check_result res;
    fh_check(&r, &res);
    fw_event *ev = NULL;
    ssize_t n = fw_logs_read(r.dir, &ev);
    cr_assert_geq(n, 0);
    fw_check_params p = {.limit = 1, .lease_ms = LEASE_MS, .drift_ms = LEASE_MS / 100 + 2};
    fw_interval *iv = NULL;
    ssize_t ni = fw_intervals(ev, (size_t)n, &p, &iv);
    size_t overlapping = 0;
    int64_t first_ov = 0, last_ov = 0;
    for (ssize_t i = 0; i < ni; i++) {
        if (iv[i].maybe)
            continue;
        for (ssize_t j = 0; j < ni; j++)
            if (j != i && !iv[j].maybe && iv[i].start_ns < iv[j].end_ns &&
                iv[j].start_ns < iv[i].end_ns) {
                overlapping++;
                if (first_ov == 0 || iv[i].start_ns < first_ov)
                    first_ov = iv[i].start_ns;
                if (iv[i].start_ns > last_ov)
                    last_ov = iv[i].start_ns;
                break;
            }
    }
    free(iv);
    free(ev);
    int64_t promoted = atomic_load(&aw.promoted_ns), switched = atomic_load(&aw.switched_ns);
    int64_t last_script = atomic_load(&aw.last_script_ns);
    char errs[256] = "";
    for (int c = 0; c < 32; c++)
        if (res.errors_by_code[c])
            snprintf(errs + strlen(errs), sizeof errs - strlen(errs), " %s=%zu",
                     redsem_err_name(-c), res.errors_by_code[c]);
#define REL(t, base) ((t) == 0 || (base) == 0 ? -1LL : (long long)(((t) - (base)) / 1000000))
    fprintf(stderr,
            "PLANNED sentinel failover %s trial %d: +promoted-slave %lld ms and first "
            "+switch-master %lld ms after SENTINEL FAILOVER; overlapping grants %zu (first "
            "%lld ms, last %lld ms after +switch-master); the old primary ran its last client "
            "script %lld ms after +switch-master (%lld ms after +promoted-slave); grants %zu, "
            "errors %zu%s, unknown %zu, lost %zu; workers killed %d\n",
            wait_replicas ? "with WAIT 1" : "without WAIT", trial, REL(promoted, t_failover),
            REL(switched, t_failover), overlapping, REL(first_ov, switched),
            REL(last_ov, switched), REL(last_script, switched), REL(last_script, promoted),
            res.acq, res.errors, errs, res.unknown, res.lost, killed);
#undef REL
    cr_expect_eq(killed, 0, "%d workers had to be killed: a call hung", killed);
    cr_expect(switched > 0, "no +switch-master seen");
    cr_expect(overlapping == 0 || last_ov < switched + 1000 * 1000000LL,
              "a grant overlapping another began %lld ms after +switch-master",
              (long long)((last_ov - switched) / 1000000));
    ts_sentinels_stop(&sc);
    fh_teardown(&r);
}

Test(sentinel, planned_failover_without_wait, .timeout = 300)
{
    for (int t = 0; t < 3; t++)
        planned_trial(false, t);
}
Test(sentinel, planned_failover_with_wait, .timeout = 300)
{
    for (int t = 0; t < 3; t++)
        planned_trial(true, t);
}
