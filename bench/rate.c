/* redsem-bench - the rate workload (issue 12): more clients than a rate of N per W allows
 * wait in redsem_rate_acquire() for a few seconds; every grant's time comes from the server
 * (redsem_rate_grant.granted_us), and the figures are sweeps over those times:
 *  - window violations: grants i and i + N (time order) less than W apart, that is a window
 *    of W holding more than N grants; must be 0 (SAFETY VIOLATION and exit 2 otherwise);
 *  - achieved / ideal: the grants in the first K whole windows from the first grant, over
 *    K x N (at most 1 by the limit itself); lower means slots lapsed without being re-granted
 *    at once;
 *  - wake-up latency: grant i (i >= N) takes the slot that grant i - N frees at
 *    t[i - N] + W; latency = t[i] - that lapse, on the server's clock. While demand exceeds
 *    the rate, a waiter is entitled exactly then, so this is how late waiters are woken. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define RATE_N 10
#define RATE_WINDOW_MS 250
#define RATE_CLIENTS 16
#define RATE_WINDOWS 11 /* K: whole windows measured; the run lasts K + 1 windows */
#define RATE_MAX_GRANTS 8192

typedef struct rate_shared {
    const bench_ctx *ctx;
    const char *name;
    int64_t stop_ns;
    atomic_int n;
    atomic_int errors;
    int64_t us[RATE_MAX_GRANTS];
} rate_shared;

static void *rate_worker(void *arg)
{
    rate_shared *sh = arg;
    redsem_client *c = NULL;
    redsem_rate *r = NULL;
    char err[256];
    int rc = bench_client_try(sh->ctx, &c, err, sizeof err);
    if (rc == REDSEM_OK)
        rc = redsem_rate_open(c, sh->name, RATE_N, RATE_WINDOW_MS, &r);
    while (rc == REDSEM_OK) {
        int64_t left_ms = (sh->stop_ns - bench_now_ns()) / 1000000;
        if (left_ms <= 0)
            break;
        redsem_rate_grant g;
        rc = redsem_rate_acquire(r, left_ms, &g);
        if (rc == REDSEM_OK) {
            int i = atomic_fetch_add(&sh->n, 1);
            if (i < RATE_MAX_GRANTS)
                sh->us[i] = g.granted_us;
        } else if (rc == REDSEM_EBUSY) {
            rc = REDSEM_OK; /* the stop came first */
        }
    }
    if (rc != REDSEM_OK) {
        atomic_fetch_add(&sh->errors, 1);
        fprintf(stderr, "rate worker: %s: %s\n", redsem_err_name(rc),
                c ? redsem_client_errmsg(c) : err);
    }
    redsem_rate_free(r);
    redsem_client_free(c);
    return NULL;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void bench_run_rate(bench_ctx *ctx)
{
    printf("\n== rate: %d clients waiting for a rate of %d per %d ms, %d windows; grant times "
           "on the server's clock\n",
           RATE_CLIENTS, RATE_N, RATE_WINDOW_MS, RATE_WINDOWS + 1);
    printf("  %6s %14s %10s %9s %9s %9s %9s\n", "grants", "achieved/ideal", "violations",
           "wake p50", "wake p90", "wake p99", "wake max");
    bench_rule(74);
    char name[64];
    bench_name(ctx, "rate", name, sizeof name);
    bench_progress(ctx, "rate");
    rate_shared *sh = calloc(1, sizeof *sh);
    if (sh == NULL)
        bench_die("rate: out of memory");
    sh->ctx = ctx;
    sh->name = name;
    sh->stop_ns = bench_now_ns() + (int64_t)(RATE_WINDOWS + 1) * RATE_WINDOW_MS * 1000000;
    pthread_t t[RATE_CLIENTS];
    for (int i = 0; i < RATE_CLIENTS; i++)
        if (pthread_create(&t[i], NULL, rate_worker, sh) != 0)
            bench_die("rate: pthread_create failed");
    for (int i = 0; i < RATE_CLIENTS; i++)
        pthread_join(t[i], NULL);
    bench_cleanup(ctx, name);

    int n = atomic_load(&sh->n);
    if (n > RATE_MAX_GRANTS)
        n = RATE_MAX_GRANTS;
    int64_t *g = sh->us;
    qsort(g, (size_t)n, sizeof *g, cmp_i64);
    const int64_t w_us = (int64_t)RATE_WINDOW_MS * 1000;
    int violations = 0, in_k = 0;
    int64_t *late = malloc(sizeof *late * (size_t)(n ? n : 1));
    size_t nlate = 0;
    for (int i = 0; i < n; i++) {
        in_k += g[i] < g[0] + RATE_WINDOWS * w_us;
        if (i < RATE_N)
            continue;
        int64_t l = g[i] - (g[i - RATE_N] + w_us);
        if (l < 0)
            violations++;
        else if (late != NULL)
            late[nlate++] = l * 1000; /* ns, for bench_percentiles */
    }
    double achieved = (double)in_k / (RATE_WINDOWS * RATE_N);
    bench_pct p = bench_percentiles(late, nlate);
    int errors = atomic_load(&sh->errors);
    printf("  %6d %14.3f %10d %9.2f %9.2f %9.2f %9.2f  ms%s\n", n, achieved, violations,
           p.p50 / 1e3, p.p90 / 1e3, p.p99 / 1e3, p.max / 1e3, errors ? "  (errors)" : "");
    if (violations > 0) {
        printf("SAFETY VIOLATION: %d windows of %d ms held more than %d grants\n", violations,
               RATE_WINDOW_MS, RATE_N);
        ctx->exit_code = 2;
    }
    json_t *r = json_object();
    json_object_set_new(r, "n", json_integer(RATE_N));
    json_object_set_new(r, "window_ms", json_integer(RATE_WINDOW_MS));
    json_object_set_new(r, "clients", json_integer(RATE_CLIENTS));
    json_object_set_new(r, "windows", json_integer(RATE_WINDOWS));
    json_object_set_new(r, "grants", json_integer(n));
    json_object_set_new(r, "achieved_ratio", json_real(achieved));
    json_object_set_new(r, "window_violations", json_integer(violations));
    json_object_set_new(r, "errors", json_integer(errors));
    json_object_set_new(r, "wake", bench_pct_json(&p));
    json_object_set_new(ctx->json, "rate", r);
    free(late);
    free(sh);
}
