/* redsem-bench - the weighted workload (issue 12): threads asking for different numbers of
 * permits of one semaphore at once (redsem_sem_acquire_n), for each semaphore strategy.
 *
 * WEIGHTED_THREADS threads, each with its own client and a fixed weight: 6 ask for 1 permit,
 * 3 for 2, 2 for 4 and 1 for 8, of a limit of 8 (so the request for 8 needs the semaphore to
 * itself). Each loops: acquire_n (blocking), hold 1-3 ms (uniform), release, for the run's
 * duration; a thread waiting when the run ends is still granted and counted in the waits.
 *
 *   permits in use  a counter of the weights held (under a mutex: +w right after the acquire
 *                   returned, -w right before the release is sent); above the limit is a
 *                   safety violation (exit status 2).
 *   throughput      grants/s and permits/s (weights summed) during the run.
 *   wait            per weight class: p50, p99 and the longest wait of an acquire call.
 *   out of order    a grant to c (wait began at w_c, token t_c) is out of arrival order
 *                   (c overtook d) if some d began
 *                   waiting more than 1 ms before c and was granted later (t_d > t_c): c
 *                   overtook d. Tokens increase in grant order (every grant draws a larger
 *                   one). basic has no queue: its large requests are overtaken; fair and
 *                   locked grant in arrival order, weights included, so what remains are
 *                   near-ties (a thread preempted between its timestamp and its request,
 *                   two entitled waiters claiming in the other order). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define WEIGHTED_THREADS 12
#define WEIGHTED_LIMIT 8
#define WEIGHTED_LEASE_MS 10000
#define WEIGHTED_CAP 200000
#define WEIGHTED_MARGIN_NS 1000000
#define NCLASSES 4

static const uint32_t class_weight[NCLASSES] = {1, 2, 4, 8};

static uint32_t weight_of_thread(int i)
{
    return i < 6 ? 1 : i < 9 ? 2 : i < 11 ? 4 : 8;
}

static int class_of(uint32_t w)
{
    return w == 1 ? 0 : w == 2 ? 1 : w == 4 ? 2 : 3;
}

typedef struct grant {
    int64_t wait_start, wait_ns;
    uint64_t token;
    uint32_t weight;
} grant;

typedef struct wshared {
    pthread_mutex_t mu;
    _Atomic int stop;
    bench_ctx *ctx;
    char name[64];
    int64_t t_start, t_stop; /* ns */
    int in_use, max_in_use;  /* under mu */
    grant *grants;
    atomic_size_t ngrants;
    _Atomic uint64_t in_window_grants, in_window_permits;
    _Atomic int errors;
} wshared;

typedef struct wargs {
    wshared *sh;
    redsem_strategy strategy;
    uint32_t weight;
    uint64_t seed;
} wargs;

static void *run_thread(void *arg)
{
    wargs *a = arg;
    wshared *sh = a->sh;
    redsem_client *c = bench_client(sh->ctx);
    redsem_sem *s = NULL;
    if (redsem_sem_open(c, sh->name, a->strategy, WEIGHTED_LIMIT, WEIGHTED_LEASE_MS, &s) !=
        REDSEM_OK) {
        atomic_fetch_add(&sh->errors, 1);
        redsem_client_free(c);
        return NULL;
    }
    while (!atomic_load(&sh->stop)) {
        int64_t t0 = bench_now_ns();
        redsem_permit *p = NULL;
        int rc = redsem_sem_acquire_n(s, a->weight, 60000, &p);
        int64_t t1 = bench_now_ns();
        if (rc != REDSEM_OK) {
            atomic_fetch_add(&sh->errors, 1);
            break;
        }
        pthread_mutex_lock(&sh->mu);
        sh->in_use += (int)a->weight;
        if (sh->in_use > sh->max_in_use)
            sh->max_in_use = sh->in_use;
        pthread_mutex_unlock(&sh->mu);
        size_t k = atomic_fetch_add(&sh->ngrants, 1);
        if (k < WEIGHTED_CAP)
            sh->grants[k] = (grant){t0, t1 - t0, redsem_permit_token(p), a->weight};
        if (!atomic_load(&sh->stop)) {
            atomic_fetch_add(&sh->in_window_grants, 1);
            atomic_fetch_add(&sh->in_window_permits, a->weight);
        }
        int64_t hold = 1000000 + (int64_t)(bench_rand(&a->seed) % 2000000);
        bench_sleep_ns(hold);
        pthread_mutex_lock(&sh->mu);
        sh->in_use -= (int)a->weight;
        pthread_mutex_unlock(&sh->mu);
        (void)redsem_permit_release(p);
        redsem_permit_free(p);
    }
    redsem_sem_free(s);
    redsem_client_free(c);
    return NULL;
}

static int by_wait_start(const void *x, const void *y)
{
    const grant *a = x, *b = y;
    return (a->wait_start > b->wait_start) - (a->wait_start < b->wait_start);
}

/* Grants c for which some d began waiting more than the margin before c and got a larger
 * token: sorted by wait start, a sweep keeps the largest token among those far enough ahead. */
static size_t out_of_order(grant *g, size_t n)
{
    qsort(g, n, sizeof *g, by_wait_start);
    size_t count = 0, j = 0;
    uint64_t max_tok = 0;
    for (size_t i = 0; i < n; i++) {
        while (j < i && g[j].wait_start < g[i].wait_start - WEIGHTED_MARGIN_NS) {
            if (g[j].token > max_tok)
                max_tok = g[j].token;
            j++;
        }
        if (max_tok > g[i].token)
            count++;
    }
    return count;
}

void bench_run_weighted(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    double secs = o->duration > 0 ? o->duration : 3.0;
    printf("\n== weighted: %d threads asking for 1 (6), 2 (3), 4 (2) or 8 (1) of %d permits at "
           "once, hold 1-3 ms, %.1f s per strategy\n",
           WEIGHTED_THREADS, WEIGHTED_LIMIT, secs);
    printf("  %-8s %8s %9s %5s %6s  %-31s %s\n", "strategy", "grants/s", "permits/s", "max",
           "ooo", "max wait ms by weight 1/2/4/8", "p99 wait ms 1/2/4/8");
    bench_rule(108);
    json_t *rows = json_array();
    for (int kind = BENCH_BASIC; kind <= BENCH_LOCKED; kind++) {
        if (!o->kinds[kind])
            continue;
        bench_progress(ctx, "weighted %s", bench_kind_name(kind));
        wshared *sh = calloc(1, sizeof *sh);
        if (sh == NULL || (sh->grants = calloc(WEIGHTED_CAP, sizeof *sh->grants)) == NULL)
            bench_die("weighted: out of memory");
        pthread_mutex_init(&sh->mu, NULL);
        sh->ctx = ctx;
        bench_name(ctx, "weighted", sh->name, sizeof sh->name);
        redsem_strategy st = kind == BENCH_BASIC  ? REDSEM_STRATEGY_BASIC
                             : kind == BENCH_FAIR ? REDSEM_STRATEGY_FAIR
                                                  : REDSEM_STRATEGY_LOCKED;
        wargs args[WEIGHTED_THREADS];
        pthread_t th[WEIGHTED_THREADS];
        sh->t_start = bench_now_ns();
        for (int i = 0; i < WEIGHTED_THREADS; i++) {
            args[i] = (wargs){sh, st, weight_of_thread(i), bench_seed()};
            if (pthread_create(&th[i], NULL, run_thread, &args[i]) != 0)
                bench_die("weighted: pthread_create");
        }
        bench_sleep_ns((int64_t)(secs * 1e9));
        atomic_store(&sh->stop, 1);
        sh->t_stop = bench_now_ns();
        for (int i = 0; i < WEIGHTED_THREADS; i++)
            pthread_join(th[i], NULL);
        size_t n = atomic_load(&sh->ngrants);
        if (n > WEIGHTED_CAP)
            n = WEIGHTED_CAP;
        double elapsed = (double)(sh->t_stop - sh->t_start) / 1e9;
        double gps = (double)atomic_load(&sh->in_window_grants) / elapsed;
        double pps = (double)atomic_load(&sh->in_window_permits) / elapsed;
        bench_pct pc[NCLASSES];
        for (int k = 0; k < NCLASSES; k++) {
            int64_t *w = malloc((n ? n : 1) * sizeof *w);
            if (w == NULL)
                bench_die("weighted: out of memory");
            size_t m = 0;
            for (size_t i = 0; i < n; i++)
                if (class_of(sh->grants[i].weight) == k)
                    w[m++] = sh->grants[i].wait_ns;
            pc[k] = bench_percentiles(w, m);
            free(w);
        }
        size_t ooo = out_of_order(sh->grants, n);
        printf("  %-8s %8.0f %9.0f %5d %6zu  %7.1f %7.1f %7.1f %7.1f  %7.1f %7.1f %7.1f %7.1f%s\n",
               bench_kind_name(kind), gps, pps, sh->max_in_use, ooo, pc[0].max / 1e3,
               pc[1].max / 1e3, pc[2].max / 1e3, pc[3].max / 1e3, pc[0].p99 / 1e3,
               pc[1].p99 / 1e3, pc[2].p99 / 1e3, pc[3].p99 / 1e3,
               atomic_load(&sh->errors) ? "  (errors)" : "");
        if (sh->max_in_use > WEIGHTED_LIMIT) {
            printf("SAFETY VIOLATION: %s: %d permits held at once (limit %d)\n",
                   bench_kind_name(kind), sh->max_in_use, WEIGHTED_LIMIT);
            ctx->exit_code = 2;
        }
        json_t *r = json_object();
        json_object_set_new(r, "strategy", json_string(bench_kind_name(kind)));
        json_object_set_new(r, "threads", json_integer(WEIGHTED_THREADS));
        json_object_set_new(r, "limit", json_integer(WEIGHTED_LIMIT));
        json_object_set_new(r, "seconds", json_real(elapsed));
        json_object_set_new(r, "grants", json_integer((json_int_t)n));
        json_object_set_new(r, "grants_per_s", json_real(gps));
        json_object_set_new(r, "permits_per_s", json_real(pps));
        json_object_set_new(r, "max_permits_in_use", json_integer(sh->max_in_use));
        json_object_set_new(r, "out_of_order", json_integer((json_int_t)ooo));
        json_object_set_new(r, "errors", json_integer(atomic_load(&sh->errors)));
        json_t *cl = json_array();
        for (int k = 0; k < NCLASSES; k++) {
            json_t *c = json_object();
            json_object_set_new(c, "weight", json_integer(class_weight[k]));
            json_object_set_new(c, "grants", json_integer((json_int_t)pc[k].n));
            json_object_set_new(c, "wait", bench_pct_json(&pc[k]));
            json_array_append_new(cl, c);
        }
        json_object_set_new(r, "classes", cl);
        json_array_append_new(rows, r);
        bench_cleanup(ctx, sh->name);
        pthread_mutex_destroy(&sh->mu);
        free(sh->grants);
        free(sh);
    }
    json_object_set_new(ctx->json, "weighted", rows);
}
