/* Scenario 1, cap under contention: 16 workers, limit 3 (1 for the lock), random hold
 * 0-3 ms, at least 20,000 acquisitions per strategy: no violation by any witness or by the
 * checker, the mutex register exact, maximum occupancy reaches the limit (no under-grant),
 * quiescence clean. */
#include <criterion/criterion.h>

#include "harness.h"

#define WORKERS 16
#define PER_WORKER 1300 /* 16 x 1300 = 20,800 */

static void cap(fw_kind kind)
{
    fh_run r;
    uint32_t limit = kind == FW_LOCK ? 1 : 3;
    char label[64];
    snprintf(label, sizeof label, "cap-%s", fw_kind_name(kind));
    fh_setup(&r, label, kind, limit, 2000, NULL, false);
    fh_monitor_start(&r, 20, false);
    char count[16];
    snprintf(count, sizeof count, "%d", PER_WORKER);
    const char *args[] = {"--hold-min-us", "0", "--hold-max-us", "3000", "--count", count,
                          "--timeout-ms", "10000", limit == 1 ? "--register" : NULL, NULL};
    int64_t t0 = fw_now_ns();
    for (int i = 0; i < WORKERS; i++)
        fh_spawn(&r, NULL, args);
    int left = fh_wait(&r, 240000);
    double secs = (double)(fw_now_ns() - t0) / 1e9;
    fh_finish(&r, 5000);
    fh_monitor_stop(&r);
    fw_check_result res;
    fh_check(&r, &res);
    fw_shared *sh = r.sh;
    uint64_t acq = atomic_load(&sh->acquisitions);
    fprintf(stderr, "SCENARIO 1 %s: %llu acquisitions in %.1f s (%.0f/s)\n", label,
            (unsigned long long)acq, secs, (double)acq / secs);
    cr_expect_eq(left, 0, "%d workers did not finish in time", left);
    cr_expect_geq(acq, 20000, "only %llu acquisitions", (unsigned long long)acq);
    cr_expect_eq(res.violations, 0, "checker: %zu violations", res.violations);
    cr_expect_eq(atomic_load(&sh->nviol), 0, "witness: %d violations", atomic_load(&sh->nviol));
    cr_expect_eq(atomic_load(&sh->nstale), 0);
    cr_expect_leq(atomic_load(&r.mon_max_holders), (int)limit, "the server showed %d holders",
                  atomic_load(&r.mon_max_holders));
    cr_expect_eq(atomic_load(&sh->max_occupancy), (int)limit, "under-grant: max occupancy %d",
                 atomic_load(&sh->max_occupancy));
    cr_expect_eq(res.max_definite, (int)limit);
    cr_expect_eq(res.unknown, 0);
    cr_expect_eq(res.errors, 0);
    cr_expect_eq(res.lost, 0);
    cr_expect_eq(res.rel_lost + res.rel_err, 0);
    cr_expect_eq(atomic_load(&sh->fence_stale_accepted), 0);
    if (limit == 1) {
        cr_expect_eq(sh->reg, atomic_load(&sh->reg_sections),
                     "register %llu after %llu sections", (unsigned long long)sh->reg,
                     (unsigned long long)atomic_load(&sh->reg_sections));
        cr_expect_eq(atomic_load(&sh->fence_rejected), 0);
    }
    fh_quiescence(&r);
    fh_teardown(&r);
}

Test(cap, basic, .timeout = 300) { cap(FW_BASIC); }
Test(cap, fair, .timeout = 300) { cap(FW_FAIR); }
Test(cap, locked, .timeout = 300) { cap(FW_LOCKED); }
Test(cap, lock, .timeout = 300) { cap(FW_LOCK); }
