/* redsem-bench - the cost of the library's metrics recording (metrics.h) on the uncontended
 * pair, run at the end of the uncontended workload: for each kind, one client that records
 * (the default) and one made with redsem_options_set_metrics(o, false), each with its own
 * semaphore or lock of limit 1, their pairs interleaved one by one (on, off, off, on, ...),
 * so both see the same noise. Reported per round: the ratio on/off of the median pair time,
 * and of the bench thread's CPU time (clock_gettime per pair, which costs both sides the
 * same); the table gives the median over the rounds (at least 3). Target: at most 1.02. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define COST_ROUNDS_MIN 3
#define COST_LEASE_MS 10000
#define COST_WARMUP 200

typedef struct cost_row {
    int kind;
    long pairs;
    double wall[2], cpu[2]; /* seconds, us: [0] off, [1] on */
    double wall_ratio[64], cpu_ratio[64];
    int nratios;
} cost_row;

static void open_or_die(redsem_client *c, int kind, const char *name, bench_handle *h)
{
    int rc = bench_handle_open(c, kind, name, 1, COST_LEASE_MS, h);
    if (rc != REDSEM_OK)
        bench_die("metrics cost: open %s: %s (%s)", name, redsem_err_name(rc),
                  redsem_client_errmsg(c));
}

void bench_run_metrics_cost(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    int rounds = o->rounds < COST_ROUNDS_MIN ? COST_ROUNDS_MIN : o->rounds;
    if (rounds > 64)
        rounds = 64;
    long batch = o->pairs / rounds;
    if (batch < 1)
        batch = 1;
    bench_ctx off_ctx = *ctx;
    off_ctx.metrics_off = true;
    cost_row rows[BENCH_NKINDS];
    int nrows = 0;
    json_t *arr = json_array();
    for (int kind = 0; kind < BENCH_NKINDS; kind++) {
        if (!o->kinds[kind])
            continue;
        redsem_client *c[2] = {bench_client(&off_ctx), bench_client(ctx)};
        bench_handle h[2] = {{0}, {0}};
        char names[2][64];
        for (int side = 0; side < 2; side++) {
            bench_name(ctx, side ? "m-on" : "m-off", names[side], sizeof names[side]);
            open_or_die(c[side], kind, names[side], &h[side]);
        }
        bench_progress(ctx, "metrics cost %s: %ld pairs each, %d rounds",
                       bench_kind_name(kind), batch * rounds, rounds);
        int64_t a, r;
        for (int i = 0; i < COST_WARMUP; i++)
            for (int side = 0; side < 2; side++)
                bench_lib_pair(&h[side], c[side], &a, &r);
        cost_row *row = &rows[nrows++];
        memset(row, 0, sizeof *row);
        row->kind = kind;
        row->pairs = batch * rounds;
        int64_t *v[2] = {malloc((size_t)batch * sizeof(int64_t)),
                         malloc((size_t)batch * sizeof(int64_t))};
        if (v[0] == NULL || v[1] == NULL)
            bench_die("out of memory");
        for (int rd = 0; rd < rounds; rd++) {
            /* pairs alternate on, off, off, on, ... (ABBA): both sides see the same noise;
             * a round's ratio is the ratio of the medians of its pairs' times (robust to the
             * stalls of a shared machine) and of the CPU time summed per side */
            size_t n[2] = {0, 0};
            double cpu[2] = {0, 0};
            for (long i = 0; i < 2 * batch; i++) {
                int side = ((i + 1) / 2) % 2 == 0;
                double cpu0 = bench_thread_cpu_us();
                int64_t t0 = bench_now_ns();
                bench_lib_pair(&h[side], c[side], &a, &r);
                int64_t dt = bench_now_ns() - t0;
                cpu[side] += bench_thread_cpu_us() - cpu0;
                v[side][n[side]++] = dt;
                row->wall[side] += (double)dt / 1e9;
            }
            for (int side = 0; side < 2; side++)
                row->cpu[side] += cpu[side];
            bench_pct on = bench_percentiles(v[1], n[1]), off = bench_percentiles(v[0], n[0]);
            row->wall_ratio[row->nratios] = on.p50 / off.p50;
            row->cpu_ratio[row->nratios] = cpu[0] > 0 ? cpu[1] / cpu[0] : 0;
            row->nratios++;
        }
        free(v[0]);
        free(v[1]);
        for (int side = 0; side < 2; side++) {
            bench_handle_close(&h[side]);
            redsem_client_free(c[side]);
            bench_cleanup(ctx, names[side]);
        }
    }
    printf("\nmetrics recording cost on the uncontended pair: a client recording (on) against "
           "one made with redsem_options_set_metrics(o, false) (off), pairs interleaved; us "
           "per pair (mean) and the median over the rounds of each round's ratio on/off: "
           "of the median pair time, of the client CPU time (target <= 1.02)\n");
    printf("%-10s %8s %6s | %9s %9s %8s | %9s %9s %8s\n", "strategy", "pairs", "rounds",
           "wall on", "wall off", "p50 on/off", "cpu on", "cpu off", "on/off");
    bench_rule(86);
    for (int i = 0; i < nrows; i++) {
        cost_row *row = &rows[i];
        double np = (double)row->pairs;
        double w[64], cp[64];
        memcpy(w, row->wall_ratio, sizeof w);
        memcpy(cp, row->cpu_ratio, sizeof cp);
        double wm = bench_median(w, (size_t)row->nratios);
        double cm = bench_median(cp, (size_t)row->nratios);
        printf("%-10s %8ld %6d | %9.2f %9.2f %8.4f | %9.2f %9.2f %8.4f\n",
               bench_kind_name(row->kind), row->pairs, row->nratios,
               row->wall[1] * 1e6 / np, row->wall[0] * 1e6 / np, wm, row->cpu[1] / np,
               row->cpu[0] / np, cm);
        json_t *wr = json_array(), *cr = json_array();
        for (int k = 0; k < row->nratios; k++) {
            json_array_append_new(wr, json_real(row->wall_ratio[k]));
            json_array_append_new(cr, json_real(row->cpu_ratio[k]));
        }
        json_array_append_new(
            arr, json_pack("{s:s, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:o, s:o}", "strategy",
                           bench_kind_name(row->kind), "pairs", (json_int_t)row->pairs,
                           "wall_us_per_pair_on", row->wall[1] * 1e6 / np,
                           "wall_us_per_pair_off", row->wall[0] * 1e6 / np,
                           "ratio_wall", wm, "client_cpu_us_per_pair_on", row->cpu[1] / np,
                           "client_cpu_us_per_pair_off", row->cpu[0] / np, "ratio_cpu", cm,
                           "round_ratios_wall", wr, "round_ratios_cpu", cr));
    }
    fflush(stdout);
    json_object_set_new(ctx->json, "metrics_cost", arr);
}
