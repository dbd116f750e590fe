/* redsem-bench - workload 1 (uncontended: one client, and T threads) and workload 4 (floor).
 *
 * One client: for each kind, acquire+release pairs, timed one by one, interleaved in rounds
 * with the floor of the same kind (floor batch, library batch, alternating which goes first),
 * so both see the same noise; the ratio is the median of the per-round ratios.
 *
 * T threads: each thread has its own client (--shared: all use one client, made once) and its
 * own floor connection and never waits for a permit (by default each thread has its own
 * semaphore or lock; --threads-shared puts them all on one semaphore of limit T). Batches of
 * --thread-secs seconds, floor and library alternating, pairs/s summed over the threads. The
 * connections the library opened are counted on the server: INFO clients connected_clients,
 * sampled during each library batch (the largest sample), minus its value once the floor
 * connections were open and before any library client was made. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "bench.h"

#define WARMUP_PAIRS 200
#define LEASE_MS 10000

static void check(int rc, redsem_client *c, const char *what)
{
    if (rc != REDSEM_OK)
        bench_die("%s: %s (%s)", what, redsem_err_name(rc), redsem_client_errmsg(c));
}


static void floor_pair(bench_floor *f, int64_t *acq, int64_t *rel)
{
    int64_t t0 = bench_now_ns();
    if (bench_floor_acquire(f) != 0)
        bench_die("floor acquire failed");
    int64_t t1 = bench_now_ns();
    if (bench_floor_release(f) != 0)
        bench_die("floor release failed");
    int64_t t2 = bench_now_ns();
    *acq = t1 - t0;
    *rel = t2 - t1;
}

typedef struct uresult {
    int kind;
    long pairs;
    double lib_secs, floor_secs;
    double ratios[64];
    int nratios;
    bench_pct lib_acq, lib_rel, floor_acq, floor_rel, lib_pair, floor_pair;
    /* where the time goes, summed over the batches (us): [0] floor, [1] library */
    double client_cpu[2], server_cpu[2], server_cmd[2];
    bench_cmdstats per_cmd; /* library batches: calls and usec per command, summed */
} uresult;

/* acc += after - before, per command name (INFO excluded). */
static void cmdstats_accumulate(bench_cmdstats *acc, const bench_cmdstats *before,
                                const bench_cmdstats *after)
{
    for (int i = 0; i < after->n; i++) {
        if (strcmp(after->name[i], "info") == 0)
            continue;
        uint64_t calls = after->calls[i] - bench_cmdstats_calls(before, after->name[i]);
        uint64_t usec = after->usec[i];
        for (int k = 0; k < before->n; k++)
            if (strcmp(before->name[k], after->name[i]) == 0)
                usec -= before->usec[k];
        if (calls == 0)
            continue;
        int j = 0;
        while (j < acc->n && strcmp(acc->name[j], after->name[i]) != 0)
            j++;
        if (j == acc->n) {
            if (acc->n == BENCH_MAX_CMDS)
                continue;
            memcpy(acc->name[j], after->name[i], sizeof acc->name[j]);
            acc->calls[j] = acc->usec[j] = 0;
            acc->n++;
        }
        acc->calls[j] += calls;
        acc->usec[j] += usec;
    }
}

static void print_trips(int kind, char *buf, size_t len)
{
    snprintf(buf, len, "%d+1", bench_kind_acquire_trips(kind));
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

void bench_run_uncontended(bench_ctx *ctx, bool floor_only)
{
    const bench_opts *o = ctx->o;
    int rounds = o->rounds;
    long batch = o->pairs / rounds;
    if (batch < 1)
        batch = 1;
    long pairs = batch * rounds;
    uresult res[BENCH_NKINDS];
    int nres = 0;
    json_t *arr = json_array();

    for (int kind = 0; kind < BENCH_NKINDS; kind++) {
        if (!o->kinds[kind])
            continue;
        char name[64];
        bench_name(ctx, kind == BENCH_LOCK ? "u-lock" : "u-sem", name, sizeof name);
        redsem_client *c = NULL;
        bench_handle h = {0};
        if (!floor_only) {
            c = bench_client(ctx);
            check(bench_handle_open(c, kind, name, 1, LEASE_MS, &h), c, "open");
        }
        bench_floor *f = bench_floor_new(ctx, kind, name);
        redisContext *raw = bench_raw_connect(ctx);
        bench_progress(ctx, "%s %s: %ld pairs in %d rounds", floor_only ? "floor" : "uncontended",
                       bench_kind_name(kind), pairs, rounds);

        int64_t *la = malloc((size_t)pairs * sizeof *la), *lr = malloc((size_t)pairs * sizeof *lr);
        int64_t *fa = malloc((size_t)pairs * sizeof *fa), *fr = malloc((size_t)pairs * sizeof *fr);
        int64_t *lp = malloc((size_t)pairs * sizeof *lp), *fp = malloc((size_t)pairs * sizeof *fp);
        if (!la || !lr || !fa || !fr || !lp || !fp)
            bench_die("out of memory");
        int64_t dummy_a, dummy_r;
        for (int i = 0; i < WARMUP_PAIRS; i++) {
            if (!floor_only)
                bench_lib_pair(&h, c, &dummy_a, &dummy_r);
            floor_pair(f, &dummy_a, &dummy_r);
        }
        uresult *u = &res[nres++];
        memset(u, 0, sizeof *u);
        u->kind = kind;
        u->pairs = pairs;
        for (int r = 0; r < rounds; r++) {
            double secs[2] = {0, 0}; /* floor, library */
            for (int step = 0; step < 2; step++) {
                bool lib = (step == 0) == (r % 2 == 1);
                if (lib && floor_only)
                    continue;
                bench_cmdstats cs0, cs1;
                double scpu0 = bench_server_cpu_us(raw);
                if (bench_cmdstats_get(raw, &cs0) != 0)
                    bench_die("INFO commandstats failed");
                double ccpu0 = bench_thread_cpu_us();
                int64_t t0 = bench_now_ns();
                for (long i = r * batch; i < (r + 1) * batch; i++) {
                    if (lib) {
                        bench_lib_pair(&h, c, &la[i], &lr[i]);
                        lp[i] = la[i] + lr[i];
                    } else {
                        floor_pair(f, &fa[i], &fr[i]);
                        fp[i] = fa[i] + fr[i];
                    }
                }
                secs[lib] = (double)(bench_now_ns() - t0) / 1e9;
                u->client_cpu[lib] += bench_thread_cpu_us() - ccpu0;
                if (bench_cmdstats_get(raw, &cs1) != 0)
                    bench_die("INFO commandstats failed");
                u->server_cmd[lib] +=
                    (double)(bench_cmdstats_request_usec(&cs1, kind) -
                             bench_cmdstats_request_usec(&cs0, kind));
                u->server_cpu[lib] += bench_server_cpu_us(raw) - scpu0;
                if (lib)
                    cmdstats_accumulate(&u->per_cmd, &cs0, &cs1);
            }
            u->floor_secs += secs[0];
            u->lib_secs += secs[1];
            if (!floor_only && r < 64)
                u->ratios[u->nratios++] = ratio(secs[0], secs[1]);
        }
        if (!floor_only) {
            u->lib_acq = bench_percentiles(la, (size_t)pairs);
            u->lib_rel = bench_percentiles(lr, (size_t)pairs);
            u->lib_pair = bench_percentiles(lp, (size_t)pairs);
        }
        u->floor_acq = bench_percentiles(fa, (size_t)pairs);
        u->floor_rel = bench_percentiles(fr, (size_t)pairs);
        u->floor_pair = bench_percentiles(fp, (size_t)pairs);
        free(la);
        free(lr);
        free(fa);
        free(fr);
        free(lp);
        free(fp);
        bench_floor_free(f);
        redisFree(raw);
        bench_handle_close(&h);
        redsem_client_free(c);
        bench_cleanup(ctx, name);
    }

    /* ------------------------------------------------------------ tables */
    printf("\n== %s: one client, %ld acquire+release pairs per strategy in %d interleaved "
           "rounds (latencies in us)\n",
           floor_only ? "floor" : "uncontended", pairs, rounds);
    printf("%-10s %5s %9s %7s | %8s %8s %8s %8s | %8s %8s %8s %8s\n", "strategy", "trips",
           "pairs/s", "x floor", "acq p50", "p99", "p99.9", "max", "rel p50", "p99", "p99.9",
           "max");
    bench_rule(112);
    for (int i = 0; i < nres; i++) {
        uresult *u = &res[i];
        char trips[16];
        print_trips(u->kind, trips, sizeof trips);
        double med = 0;
        if (!floor_only) {
            double tmp[64];
            memcpy(tmp, u->ratios, sizeof tmp);
            med = bench_median(tmp, (size_t)u->nratios);
            printf("%-10s %5s %9.0f %7.3f | %8.1f %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f %8.1f\n",
                   bench_kind_name(u->kind), trips, (double)u->pairs / u->lib_secs, med,
                   u->lib_acq.p50, u->lib_acq.p99, u->lib_acq.p999, u->lib_acq.max,
                   u->lib_rel.p50, u->lib_rel.p99, u->lib_rel.p999, u->lib_rel.max);
        }
        char fname[32];
        snprintf(fname, sizeof fname, "%s%s", floor_only ? "" : "  floor ",
                 floor_only ? bench_kind_name(u->kind) : "");
        printf("%-10s %5s %9.0f %7.3f | %8.1f %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f %8.1f\n",
               fname, trips, (double)u->pairs / u->floor_secs, 1.0, u->floor_acq.p50,
               u->floor_acq.p99, u->floor_acq.p999, u->floor_acq.max, u->floor_rel.p50,
               u->floor_rel.p99, u->floor_rel.p999, u->floor_rel.max);

        json_t *row = json_pack(
            "{s:s, s:I, s:i, s:f, s:o, s:o, s:o}", "strategy", bench_kind_name(u->kind),
            "pairs", (json_int_t)u->pairs, "acquire_round_trips", bench_kind_acquire_trips(u->kind),
            "floor_pairs_per_s", (double)u->pairs / u->floor_secs, "floor_acquire",
            bench_pct_json(&u->floor_acq), "floor_release", bench_pct_json(&u->floor_rel),
            "floor_pair", bench_pct_json(&u->floor_pair));
        if (!floor_only) {
            json_t *rr = json_array();
            for (int k = 0; k < u->nratios; k++)
                json_array_append_new(rr, json_real(u->ratios[k]));
            json_object_set_new(row, "pairs_per_s", json_real((double)u->pairs / u->lib_secs));
            json_object_set_new(row, "ratio_pairs_per_s", json_real(med));
            json_object_set_new(row, "round_ratios", rr);
            json_object_set_new(row, "acquire", bench_pct_json(&u->lib_acq));
            json_object_set_new(row, "release", bench_pct_json(&u->lib_rel));
            json_object_set_new(row, "pair", bench_pct_json(&u->lib_pair));
            json_object_set_new(
                row, "ratio_latency",
                json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "acquire_p50",
                          ratio(u->lib_acq.p50, u->floor_acq.p50), "acquire_p99",
                          ratio(u->lib_acq.p99, u->floor_acq.p99), "acquire_p999",
                          ratio(u->lib_acq.p999, u->floor_acq.p999), "release_p50",
                          ratio(u->lib_rel.p50, u->floor_rel.p50), "release_p99",
                          ratio(u->lib_rel.p99, u->floor_rel.p99), "release_p999",
                          ratio(u->lib_rel.p999, u->floor_rel.p999)));
        }
        json_t *cost = json_object();
        for (int side = floor_only ? 0 : 1; side >= 0; side--) {
            double np = (double)u->pairs;
            json_object_set_new(
                cost, side ? "library" : "floor",
                json_pack("{s:f, s:f, s:f, s:f}", "wall_us_per_pair",
                          (side ? u->lib_secs : u->floor_secs) * 1e6 / np,
                          "client_cpu_us_per_pair", u->client_cpu[side] / np,
                          "server_cpu_us_per_pair", u->server_cpu[side] / np,
                          "server_command_us_per_pair", u->server_cmd[side] / np));
        }
        if (!floor_only) {
            json_t *pc = json_object();
            for (int k = 0; k < u->per_cmd.n; k++)
                json_object_set_new(pc, u->per_cmd.name[k],
                                    json_pack("{s:f, s:f}", "calls_per_pair",
                                              (double)u->per_cmd.calls[k] / (double)u->pairs,
                                              "usec_per_pair",
                                              (double)u->per_cmd.usec[k] / (double)u->pairs));
            json_object_set_new(cost, "library_server_commands", pc);
        }
        json_object_set_new(row, "cost_breakdown", cost);
        json_array_append_new(arr, row);
    }
    printf("\nwhere the time goes, us per pair: wall clock; CPU of the bench thread (user+sys); "
           "CPU of the server's main thread (INFO cpu); of which executing the requests (INFO "
           "commandstats usec of EVALSHA, scripts' commands included)\n");
    printf("%-10s | %8s %8s %8s %8s | %8s %8s %8s %8s\n", "strategy", "wall", "client",
           "server", "requests", "floor", "client", "server", "requests");
    bench_rule(92);
    for (int i = 0; i < nres; i++) {
        uresult *u = &res[i];
        double np = (double)u->pairs;
        if (floor_only)
            printf("%-10s | %8s %8s %8s %8s | %8.1f %8.1f %8.1f %8.1f\n",
                   bench_kind_name(u->kind), "-", "-", "-", "-", u->floor_secs * 1e6 / np,
                   u->client_cpu[0] / np, u->server_cpu[0] / np, u->server_cmd[0] / np);
        else
            printf("%-10s | %8.1f %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f %8.1f\n",
                   bench_kind_name(u->kind), u->lib_secs * 1e6 / np, u->client_cpu[1] / np,
                   u->server_cpu[1] / np, u->server_cmd[1] / np, u->floor_secs * 1e6 / np,
                   u->client_cpu[0] / np, u->server_cpu[0] / np, u->server_cmd[0] / np);
    }
    if (!floor_only) {
        printf("\nratios to the floor of the same kind (pairs/s: library/floor, median of "
               "rounds; latency: library/floor)\n");
        printf("%-10s %8s | %8s %8s %8s | %8s %8s %8s\n", "strategy", "pairs/s", "acq p50",
               "p99", "p99.9", "rel p50", "p99", "p99.9");
        bench_rule(72);
        for (int i = 0; i < nres; i++) {
            uresult *u = &res[i];
            double tmp[64];
            memcpy(tmp, u->ratios, sizeof tmp);
            printf("%-10s %8.3f | %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f\n",
                   bench_kind_name(u->kind), bench_median(tmp, (size_t)u->nratios),
                   ratio(u->lib_acq.p50, u->floor_acq.p50), ratio(u->lib_acq.p99, u->floor_acq.p99),
                   ratio(u->lib_acq.p999, u->floor_acq.p999),
                   ratio(u->lib_rel.p50, u->floor_rel.p50), ratio(u->lib_rel.p99, u->floor_rel.p99),
                   ratio(u->lib_rel.p999, u->floor_rel.p999));
        }
    }
    fflush(stdout);
    json_object_set_new(ctx->json, floor_only ? "floor" : "uncontended", arr);
    if (!floor_only)
        bench_run_metrics_cost(ctx);
}

/* ================================================================ T threads */

enum { TM_FLOOR = 0, TM_LIB = 1, TM_EXIT = 2 };

typedef struct tgroup {
    bench_ctx *ctx;
    int kind;
    int nthreads;
    bool shared;
    char shared_name[64];
    /* --shared: the one client of every thread (made by the main thread between the first
     * and the second wait on setup); NULL: each thread makes its own */
    redsem_client *client;
    pthread_barrier_t setup, start, end;
    _Atomic int stop;
    int mode;
} tgroup;

typedef struct tworker {
    tgroup *g;
    pthread_t th;
    int idx;
    char name[64];
    uint64_t count;
} tworker;

/* A library pair with --renew: the permit goes under automatic renewal (the renewer starts
 * with the first) before its release, which takes it off again. */
static void lib_pair_renewed(bench_handle *h, redsem_client *c)
{
    redsem_permit *p = NULL;
    int rc = bench_acquire(h, 5000, &p);
    if (rc == REDSEM_OK && (rc = redsem_permit_auto_renew(p, 0, NULL, NULL)) == REDSEM_OK)
        rc = redsem_permit_release(p);
    if (rc != REDSEM_OK)
        bench_die("acquire, auto_renew, release: %s (%s)", redsem_err_name(rc),
                  redsem_client_errmsg(c));
    redsem_permit_free(p);
}

static void *tworker_main(void *arg)
{
    tworker *w = arg;
    tgroup *g = w->g;
    const char *name = g->shared ? g->shared_name : w->name;
    uint32_t limit = g->shared ? (uint32_t)g->nthreads : 1;
    /* the floor first: the main thread counts the server's connections between the two
     * waits, when every floor connection and no library connection is open */
    bench_floor *f = bench_floor_new(g->ctx, g->kind, name);
    pthread_barrier_wait(&g->setup);
    pthread_barrier_wait(&g->setup);
    redsem_client *c = g->client != NULL ? g->client : bench_client(g->ctx);
    bench_handle h;
    check(bench_handle_open(c, g->kind, name, limit, LEASE_MS, &h), c, "open");
    int64_t a, r;
    for (int i = 0; i < WARMUP_PAIRS / 4; i++) {
        bench_lib_pair(&h, c, &a, &r);
        floor_pair(f, &a, &r);
    }
    pthread_barrier_wait(&g->setup); /* warmed up: the main thread reads the counters */
    for (;;) {
        pthread_barrier_wait(&g->start);
        if (g->mode == TM_EXIT)
            break;
        uint64_t n = 0;
        while (!atomic_load_explicit(&g->stop, memory_order_relaxed)) {
            if (g->mode == TM_LIB && g->ctx->o->renew)
                lib_pair_renewed(&h, c);
            else if (g->mode == TM_LIB)
                bench_lib_pair(&h, c, &a, &r);
            else
                floor_pair(f, &a, &r);
            n++;
        }
        w->count = n;
        pthread_barrier_wait(&g->end);
    }
    bench_floor_free(f);
    bench_handle_close(&h);
    if (c != g->client)
        redsem_client_free(c);
    return NULL;
}

#define CONN_SAMPLES 3 /* connected_clients samples per library batch */

/* One batch; returns pairs/s over all threads. A library batch samples the server's
 * connected_clients on raw CONN_SAMPLES times, evenly spaced, and raises *max_conns to the
 * largest. */
static double tbatch(tgroup *g, tworker *w, int mode, double secs, redisContext *raw,
                     long *max_conns)
{
    g->mode = mode;
    atomic_store(&g->stop, 0);
    pthread_barrier_wait(&g->start);
    int64_t t0 = bench_now_ns();
    int nsamples = mode == TM_LIB ? CONN_SAMPLES : 0;
    for (int i = 1; i <= nsamples; i++) {
        bench_sleep_ns(t0 + (int64_t)(secs * 1e9 * i / (nsamples + 1)) - bench_now_ns());
        long n = bench_connected_clients(raw);
        if (n > *max_conns)
            *max_conns = n;
    }
    bench_sleep_ns(t0 + (int64_t)(secs * 1e9) - bench_now_ns());
    atomic_store(&g->stop, 1);
    pthread_barrier_wait(&g->end);
    int64_t t1 = bench_now_ns();
    uint64_t total = 0;
    for (int i = 0; i < g->nthreads; i++)
        total += w[i].count;
    return (double)total / ((double)(t1 - t0) / 1e9);
}

void bench_run_threads(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    json_t *arr = json_array();
    char maxc[32];
    if (o->max_connections > 0)
        snprintf(maxc, sizeof maxc, "%d", o->max_connections);
    else
        snprintf(maxc, sizeof maxc, "%d (default)", REDSEM_DEFAULT_MAX_CONNECTIONS);
    printf("\n== uncontended, T threads (%s%s%s, max connections %s; each its own floor "
           "connection; never waits); %d x %.2f s batches each, floor and library "
           "alternating\n",
           o->shared_client ? "all on ONE shared client" : "each its own client",
           o->renew ? ", every permit under automatic renewal" : "",
           o->threads_shared   ? ", all on one semaphore of limit T"
           : o->shared_client ? ", each its own semaphore"
                              : " and its own semaphore",
           maxc, o->rounds_threads, o->thread_secs);
    printf("%-10s %5s %7s | %10s %10s %8s | %5s %10s | %s\n", "strategy", "trips", "threads",
           "pairs/s", "floor/s", "x floor", "conns", "pool waits", "per-round ratios");
    bench_rule(108);
    fflush(stdout);
    for (int ti = 0; ti < o->nthreads; ti++) {
        int T = o->threads[ti];
        for (int kind = 0; kind < BENCH_NKINDS; kind++) {
            if (!o->kinds[kind])
                continue;
            if (kind == BENCH_LOCK && o->threads_shared)
                continue; /* one lock shared by T threads is contention, not this workload */
            tgroup g = {.ctx = ctx, .kind = kind, .nthreads = T, .shared = o->threads_shared};
            bench_name(ctx, "t-shared", g.shared_name, sizeof g.shared_name);
            redisContext *raw = bench_raw_connect(ctx); /* counts the connections */
            pthread_barrier_init(&g.setup, NULL, (unsigned)T + 1);
            pthread_barrier_init(&g.start, NULL, (unsigned)T + 1);
            pthread_barrier_init(&g.end, NULL, (unsigned)T + 1);
            tworker *w = calloc((size_t)T, sizeof *w);
            if (w == NULL)
                bench_die("out of memory");
            for (int i = 0; i < T; i++) {
                w[i].g = &g;
                w[i].idx = i;
                bench_name(ctx, "t", w[i].name, sizeof w[i].name);
                if (pthread_create(&w[i].th, NULL, tworker_main, &w[i]) != 0)
                    bench_die("pthread_create failed");
            }
            /* every floor connection open, no library connection yet */
            pthread_barrier_wait(&g.setup);
            long conns0 = bench_connected_clients(raw);
            if (o->shared_client)
                g.client = bench_client(ctx);
            pthread_barrier_wait(&g.setup);
            pthread_barrier_wait(&g.setup); /* every thread warmed up */
            uint64_t waits0 = 0, req0 = 0;
            if (g.client != NULL) {
                waits0 = bench_pool_waits(g.client);
                req0 = bench_requests(g.client);
            }
            bench_progress(ctx, "threads %s: %d threads, %d rounds", bench_kind_name(kind), T,
                           o->rounds_threads);
            double lib_sum = 0, floor_sum = 0, ratios[64];
            int nr = 0;
            long max_conns = -1;
            for (int r = 0; r < o->rounds_threads && r < 64; r++) {
                double fl, lb;
                if (r % 2 == 0) {
                    fl = tbatch(&g, w, TM_FLOOR, o->thread_secs, raw, &max_conns);
                    lb = tbatch(&g, w, TM_LIB, o->thread_secs, raw, &max_conns);
                } else {
                    lb = tbatch(&g, w, TM_LIB, o->thread_secs, raw, &max_conns);
                    fl = tbatch(&g, w, TM_FLOOR, o->thread_secs, raw, &max_conns);
                }
                lib_sum += lb;
                floor_sum += fl;
                ratios[nr++] = ratio(lb, fl);
            }
            /* every thread waits on start: the shared client is idle */
            uint64_t waits = 0, requests = 0;
            if (g.client != NULL) {
                waits = bench_pool_waits(g.client) - waits0;
                requests = bench_requests(g.client) - req0;
            }
            g.mode = TM_EXIT;
            pthread_barrier_wait(&g.start);
            for (int i = 0; i < T; i++)
                pthread_join(w[i].th, NULL);
            redsem_client_free(g.client);
            redisFree(raw);
            pthread_barrier_destroy(&g.setup);
            pthread_barrier_destroy(&g.start);
            pthread_barrier_destroy(&g.end);
            bool known = conns0 >= 0 && max_conns >= 0;
            long lib_conns = known ? max_conns - conns0 : -1;

            char trips[16], rr[256] = "";
            print_trips(kind, trips, sizeof trips);
            json_t *jr = json_array();
            for (int i = 0; i < nr; i++) {
                size_t l = strlen(rr);
                snprintf(rr + l, sizeof rr - l, "%s%.3f", i ? " " : "", ratios[i]);
                json_array_append_new(jr, json_real(ratios[i]));
            }
            double tmp[64];
            memcpy(tmp, ratios, sizeof tmp);
            double med = bench_median(tmp, (size_t)nr);
            char cs[24] = "-", ws[24] = "-";
            if (known)
                snprintf(cs, sizeof cs, "%ld", lib_conns);
            if (o->shared_client)
                snprintf(ws, sizeof ws, "%llu", (unsigned long long)waits);
            printf("%-10s %5s %7d | %10.0f %10.0f %8.3f | %5s %10s | %s\n", bench_kind_name(kind),
                   trips, T, lib_sum / nr, floor_sum / nr, med, cs, ws, rr);
            fflush(stdout);
            json_t *row = json_pack(
                "{s:s, s:i, s:i, s:b, s:b, s:f, s:f, s:f, s:o}", "strategy", bench_kind_name(kind),
                "threads", T, "acquire_round_trips", bench_kind_acquire_trips(kind),
                "shared_semaphore", o->threads_shared, "shared_client", o->shared_client,
                "pairs_per_s", lib_sum / nr, "floor_pairs_per_s", floor_sum / nr,
                "ratio_pairs_per_s", med, "round_ratios", jr);
            json_object_set_new(row, "lib_connections",
                                known ? json_integer(lib_conns) : json_null());
            json_object_set_new(row, "pool_waits",
                                o->shared_client ? json_integer((json_int_t)waits) : json_null());
            json_object_set_new(row, "library_requests",
                                o->shared_client ? json_integer((json_int_t)requests)
                                                 : json_null());
            json_array_append_new(arr, row);
            free(w);
            bench_cleanup(ctx, NULL);
        }
    }
    printf("conns: connections the library had open on the server during the library batches "
           "(INFO clients connected_clients, largest of %d samples per batch, minus its value "
           "with the floor's and the bench's own connections open and no library client made);"
           " pool waits (--shared): the shared client's requests that waited for a free request "
           "connection in the library batches (redsem_client_stats.pool_waits).\n",
           CONN_SAMPLES);
    json_object_set_new(ctx->json, "threads", arr);
}
