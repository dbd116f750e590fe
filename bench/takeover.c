/* redsem-bench - the expiry takeover workload (issue 14): a holder that never releases (it
 * crashed), a waiter blocked on the same semaphore or lock; how long after the holder's lease
 * ends on the server is the waiter granted?
 *
 * Both instants are on the server's clock: a fresh name's first fencing token is the server's
 * clock (us) at the grant, and the holder's lease ends at its grant's millisecond + the lease;
 * the waiter's token is the server's clock at its own grant. late = waiter token - lease end.
 * The lock's lease is its key's PX, which Redis expires only once its clock passes the expiry
 * millisecond: its end is counted 1 ms later.
 * Trials run one at a time, so the server is idle while the waiter waits: the case where a
 * BLPOP timeout fires only on the server's next tick (hz 10: up to 100 ms late), which the
 * library's own cut at the lease's end avoids. A negative lateness would be a safety
 * violation (granted while the lease still ran) and is counted. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

#define TAKEOVER_TRIALS 50
#define TAKEOVER_LEASE_MS 30

void bench_run_takeover(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    printf("\n== takeover: a waiter granted after an unreleased lease (%d ms) ends, %d trials "
           "one at a time; ms after the end, on the server's clock\n",
           TAKEOVER_LEASE_MS, TAKEOVER_TRIALS);
    printf("  %-8s %6s %8s %8s %8s %8s %6s\n", "strategy", "trials", "p50", "p90", "p99", "max",
           "early");
    bench_rule(62);
    json_t *rows = json_array();
    redsem_client *hc = bench_client(ctx), *wc = bench_client(ctx);
    for (int kind = 0; kind < BENCH_NKINDS; kind++) {
        if (!o->kinds[kind])
            continue;
        bench_progress(ctx, "takeover %s", bench_kind_name(kind));
        int64_t late[TAKEOVER_TRIALS];
        size_t n = 0;
        int early = 0, errors = 0;
        for (int t = 0; t < TAKEOVER_TRIALS; t++) {
            char name[64];
            bench_name(ctx, "takeover", name, sizeof name);
            bench_handle h, w;
            if (bench_handle_open(hc, kind, name, 1, TAKEOVER_LEASE_MS, &h) != REDSEM_OK ||
                bench_handle_open(wc, kind, name, 1, TAKEOVER_LEASE_MS, &w) != REDSEM_OK)
                bench_die("takeover: open: %s %s", redsem_client_errmsg(hc),
                          redsem_client_errmsg(wc));
            redsem_permit *hp = NULL, *wp = NULL;
            int rc = bench_acquire(&h, 0, &hp);
            if (rc == REDSEM_OK)
                rc = bench_acquire(&w, 5000, &wp);
            if (rc == REDSEM_OK) {
                int64_t end_us = ((int64_t)redsem_permit_token(hp) / 1000 + TAKEOVER_LEASE_MS +
                                  (kind == BENCH_LOCK ? 1 : 0)) *
                                 1000;
                int64_t l = (int64_t)redsem_permit_token(wp) - end_us;
                if (l < 0)
                    early++;
                late[n++] = l * 1000; /* ns, for bench_percentiles */
                (void)redsem_permit_release(wp);
            } else {
                errors++;
            }
            redsem_permit_free(wp);
            redsem_permit_free(hp); /* never released: it expires */
            bench_handle_close(&w);
            bench_handle_close(&h);
            bench_cleanup(ctx, name);
        }
        bench_pct p = bench_percentiles(late, n);
        printf("  %-8s %6zu %8.2f %8.2f %8.2f %8.2f %6d%s\n", bench_kind_name(kind), n,
               p.p50 / 1e3, p.p90 / 1e3, p.p99 / 1e3, p.max / 1e3, early,
               errors ? "  (errors)" : "");
        if (early > 0) {
            printf("SAFETY VIOLATION: %s granted a waiter before the holder's lease ended\n",
                   bench_kind_name(kind));
            ctx->exit_code = 2;
        }
        json_t *r = json_object();
        json_object_set_new(r, "strategy", json_string(bench_kind_name(kind)));
        json_object_set_new(r, "lease_ms", json_integer(TAKEOVER_LEASE_MS));
        json_object_set_new(r, "trials", json_integer((json_int_t)n));
        json_object_set_new(r, "early", json_integer(early));
        json_object_set_new(r, "errors", json_integer(errors));
        json_object_set_new(r, "late", bench_pct_json(&p));
        json_array_append_new(rows, r);
    }
    redsem_client_free(hc);
    redsem_client_free(wc);
    json_object_set_new(ctx->json, "takeover", rows);
}
