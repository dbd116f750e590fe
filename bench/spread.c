/* redsem-bench - the spread workload (issue 11): M semaphores spread over the shards of a
 * Redis Cluster, T threads (each its own client) taking and giving back permits of randomly
 * chosen semaphores; aggregate grants per second with 1 primary and with 3, each a private
 * cluster started here (no replicas), in alternating rounds; the median of the rounds.
 *
 * Then the cost of routing: one client and one semaphore (uncontended), and T threads over T
 * semaphores, against three targets in rotating batches: a standalone private server, the
 * 1-primary cluster's node by redis:// (no routing), and the same node by redis+cluster://
 * (slot routing). Same machine, same moment: the batches interleave so that the noise of a
 * shared machine falls on all three alike.
 *
 * The limit is T, so no acquire ever waits: this measures routing and the servers, not
 * contention. On a machine with fewer cores than primaries + bench threads the three
 * primaries share the cores the single one had: expect about the same aggregate, not 3x. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench.h"
#include "cluster.h"

#define SPREAD_ROUNDS 3

typedef struct spread_run {
    const char *url;
    int nsem, threads;
    double secs;
    atomic_bool go, stop;
    atomic_long grants, errors;
    atomic_int ready;
} spread_run;

static void *spread_thread(void *arg)
{
    spread_run *r = arg;
    redsem_options *o = NULL;
    redsem_client *c = NULL;
    if (redsem_options_new(&o) != REDSEM_OK || redsem_options_set_url(o, r->url) != REDSEM_OK ||
        redsem_client_new(o, &c) != REDSEM_OK)
        bench_die("spread: cannot connect to %s", r->url);
    redsem_options_free(o);
    redsem_sem **s = calloc((size_t)r->nsem, sizeof *s);
    if (s == NULL)
        bench_die("out of memory");
    for (int i = 0; i < r->nsem; i++) {
        char name[32];
        snprintf(name, sizeof name, "spread-%d", i);
        if (redsem_sem_open(c, name, REDSEM_STRATEGY_BASIC, (uint32_t)r->threads, 10000, &s[i]) !=
            REDSEM_OK)
            bench_die("spread: open: %s", redsem_client_errmsg(c));
    }
    uint64_t seed = bench_seed();
    atomic_fetch_add(&r->ready, 1);
    while (!atomic_load(&r->go))
        bench_sleep_ns(1000000);
    long grants = 0, errors = 0;
    while (!atomic_load(&r->stop)) {
        redsem_permit *p = NULL;
        redsem_sem *sem = s[bench_rand(&seed) % (uint64_t)r->nsem];
        if (redsem_sem_acquire(sem, 1000, &p) == REDSEM_OK) {
            grants++;
            if (redsem_permit_release(p) != REDSEM_OK)
                errors++;
            redsem_permit_free(p);
        } else {
            errors++;
        }
    }
    atomic_fetch_add(&r->grants, grants);
    atomic_fetch_add(&r->errors, errors);
    for (int i = 0; i < r->nsem; i++)
        redsem_sem_free(s[i]);
    free(s);
    redsem_client_free(c);
    return NULL;
}

/* One timed run: grants per second over secs, after every thread has opened its handles. */
static double spread_once(const char *url, int nsem, int threads, double secs, long *errors)
{
    spread_run r = {.url = url, .nsem = nsem, .threads = threads, .secs = secs};
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    if (tid == NULL)
        bench_die("out of memory");
    for (int t = 0; t < threads; t++)
        if (pthread_create(&tid[t], NULL, spread_thread, &r) != 0)
            bench_die("spread: pthread_create failed");
    while (atomic_load(&r.ready) < threads)
        bench_sleep_ns(1000000);
    int64_t t0 = bench_now_ns();
    atomic_store(&r.go, true);
    bench_sleep_ns((int64_t)(secs * 1e9));
    atomic_store(&r.stop, true);
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    double took = (double)(bench_now_ns() - t0) / 1e9;
    free(tid);
    *errors += atomic_load(&r.errors);
    return (double)atomic_load(&r.grants) / took;
}

#define ROUTE_BATCH 250

enum { R_STANDALONE = 0, R_PLAIN = 1, R_CLUSTER = 2, R_N = 3 };
static const char *const route_names[R_N] = {"standalone", "node_redis", "node_redis_cluster"};

/* Pairs per second of one kind on each target: `pairs` per target in batches of ROUTE_BATCH,
 * the targets in rotating order. */
static void route_uncontended(bench_ctx *ctx, char urls[R_N][512], int kind, long pairs,
                              double *rate)
{
    redsem_client *c[R_N];
    bench_handle h[R_N];
    int64_t spent[R_N] = {0};
    long batches = (pairs + ROUTE_BATCH - 1) / ROUTE_BATCH;
    for (int t = 0; t < R_N; t++) {
        bench_ctx tc = *ctx;
        snprintf(tc.url, sizeof tc.url, "%.511s", urls[t]);
        c[t] = bench_client(&tc);
        char name[64];
        bench_name(ctx, "route", name, sizeof name);
        if (bench_handle_open(c[t], kind, name, 1, 10000, &h[t]) != REDSEM_OK)
            bench_die("spread: open: %s", redsem_client_errmsg(c[t]));
        int64_t a, r;
        bench_lib_pair(&h[t], c[t], &a, &r); /* warm: the script cache, the connection */
    }
    for (long b = 0; b < batches; b++)
        for (int k = 0; k < R_N; k++) {
            int t = (int)((b + k) % R_N);
            int64_t t0 = bench_now_ns(), a, r;
            for (int i = 0; i < ROUTE_BATCH; i++)
                bench_lib_pair(&h[t], c[t], &a, &r);
            spent[t] += bench_now_ns() - t0;
        }
    for (int t = 0; t < R_N; t++) {
        rate[t] = (double)(batches * ROUTE_BATCH) / ((double)spent[t] / 1e9);
        bench_handle_close(&h[t]);
        redsem_client_free(c[t]);
    }
}

static void routing_cost(bench_ctx *ctx, const ts_cluster *one)
{
    const bench_opts *o = ctx->o;
    ts_server solo;
    if (ts_server_start(&solo, NULL, true) != 0)
        bench_die("spread: could not start a standalone server");
    char urls[R_N][512];
    snprintf(urls[R_STANDALONE], sizeof urls[0], "redis://127.0.0.1:%d", solo.port);
    snprintf(urls[R_PLAIN], sizeof urls[0], "redis://127.0.0.1:%d", one->node[0].port);
    snprintf(urls[R_CLUSTER], sizeof urls[0], "%.500s", one->url);
    long pairs = o->pairs / o->rounds > ROUTE_BATCH ? o->pairs / o->rounds : ROUTE_BATCH;
    printf("\n== routing cost: pairs/s on a standalone server (solo), on a cluster node by "
           "redis:// (node) and by redis+cluster:// (cluster); uncontended: %ld pairs per "
           "target per round in rotating batches of %d; threads: %d threads over %d "
           "semaphores, %.1f s per target per round; %d rounds; ratios: median of the "
           "per-round ratios\n",
           pairs, ROUTE_BATCH, o->spread_threads, o->spread_threads, o->spread_secs / 2,
           SPREAD_ROUNDS);
    printf("  %-10s %10s %10s %10s | %18s %12s\n", "workload", "solo", "node", "cluster",
           "cluster/node", "cluster/solo");
    bench_rule(80);
    json_t *rows = json_array();
    for (int kind = 0; kind <= BENCH_NKINDS; kind++) {
        if (kind < BENCH_NKINDS && !o->kinds[kind])
            continue;
        const char *what = kind < BENCH_NKINDS ? bench_kind_name(kind) : "threads";
        double rate[SPREAD_ROUNDS][R_N], rn[SPREAD_ROUNDS], rs[SPREAD_ROUNDS];
        for (int round = 0; round < SPREAD_ROUNDS; round++) {
            bench_progress(ctx, "routing: %s, round %d", what, round + 1);
            if (kind < BENCH_NKINDS) {
                route_uncontended(ctx, urls, kind, pairs, rate[round]);
            } else {
                long errors = 0;
                for (int k = 0; k < R_N; k++) {
                    int t = (round + k) % R_N;
                    rate[round][t] = spread_once(urls[t], o->spread_threads, o->spread_threads,
                                                 o->spread_secs / 2, &errors);
                }
            }
            rn[round] = rate[round][R_CLUSTER] / rate[round][R_PLAIN];
            rs[round] = rate[round][R_CLUSTER] / rate[round][R_STANDALONE];
        }
        double med[R_N];
        for (int t = 0; t < R_N; t++) {
            double v[SPREAD_ROUNDS];
            for (int r = 0; r < SPREAD_ROUNDS; r++)
                v[r] = rate[r][t];
            med[t] = bench_median(v, SPREAD_ROUNDS);
        }
        double mn = bench_median(rn, SPREAD_ROUNDS), ms = bench_median(rs, SPREAD_ROUNDS);
        printf("  %-10s %10.0f %10.0f %10.0f | %9.3f %-8s %12.3f\n", what, med[R_STANDALONE],
               med[R_PLAIN], med[R_CLUSTER], mn, mn >= 0.95 ? "(met)" : "(MISSED)", ms);
        json_t *row = json_object();
        json_object_set_new(row, "workload", json_string(what));
        for (int t = 0; t < R_N; t++)
            json_object_set_new(row, route_names[t], json_real(med[t]));
        json_object_set_new(row, "cluster_over_node", json_real(mn));
        json_object_set_new(row, "cluster_over_standalone", json_real(ms));
        json_array_append_new(rows, row);
    }
    printf("  cluster/node: the cost of routing (same server; target >= 0.95); cluster/solo adds "
           "the server's cluster mode\n");
    json_object_set_new(json_object_get(ctx->json, "spread"), "routing", rows);
    ts_server_stop(&solo);
}

void bench_run_spread(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    int nsem = (int)o->spread_sems, threads = o->spread_threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("\n== spread: %d semaphores over the primaries of a private cluster, %d threads, "
           "%.1f s per run, %d rounds; this machine has %ld cores\n",
           nsem, threads, o->spread_secs, SPREAD_ROUNDS, cores);
    printf("  %-10s %12s %12s %12s %8s\n", "primaries", "grants/s", "min", "max", "errors");
    bench_rule(60);
    static const int sizes[2] = {1, 3};
    ts_cluster cl[2];
    for (int k = 0; k < 2; k++) {
        bench_progress(ctx, "spread: starting a cluster of %d primar%s", sizes[k],
                       sizes[k] == 1 ? "y" : "ies");
        if (ts_cluster_start(&cl[k], sizes[k], 0) != 0)
            bench_die("spread: could not start a cluster of %d primaries", sizes[k]);
    }
    double rate[2][SPREAD_ROUNDS];
    long errors[2] = {0, 0};
    for (int round = 0; round < SPREAD_ROUNDS; round++)
        for (int k = 0; k < 2; k++) {
            bench_progress(ctx, "spread: %d primaries, round %d", sizes[k], round + 1);
            rate[k][round] = spread_once(cl[k].url, nsem, threads, o->spread_secs, &errors[k]);
        }
    json_t *rows = json_array();
    double med[2];
    for (int k = 0; k < 2; k++) {
        double v[SPREAD_ROUNDS], lo = rate[k][0], hi = rate[k][0];
        for (int i = 0; i < SPREAD_ROUNDS; i++) {
            v[i] = rate[k][i];
            lo = v[i] < lo ? v[i] : lo;
            hi = v[i] > hi ? v[i] : hi;
        }
        med[k] = bench_median(v, SPREAD_ROUNDS);
        printf("  %-10d %12.0f %12.0f %12.0f %8ld\n", sizes[k], med[k], lo, hi, errors[k]);
        json_t *row = json_object();
        json_object_set_new(row, "primaries", json_integer(sizes[k]));
        json_object_set_new(row, "grants_per_s_median", json_real(med[k]));
        json_object_set_new(row, "grants_per_s_min", json_real(lo));
        json_object_set_new(row, "grants_per_s_max", json_real(hi));
        json_object_set_new(row, "errors", json_integer(errors[k]));
        json_array_append_new(rows, row);
    }
    ts_cluster_stop(&cl[1]);
    printf("  3 primaries / 1: %.2fx with %ld cores (more cores than primaries + bench threads "
           "let the shards run in parallel)\n", med[1] / med[0], cores);
    json_t *out = json_object();
    json_object_set_new(out, "semaphores", json_integer(nsem));
    json_object_set_new(out, "threads", json_integer(threads));
    json_object_set_new(out, "cores", json_integer(cores));
    json_object_set_new(out, "runs", rows);
    json_object_set_new(ctx->json, "spread", out);
    routing_cost(ctx, &cl[0]);
    ts_cluster_stop(&cl[0]);
}
