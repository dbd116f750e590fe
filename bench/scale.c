/* redsem-bench - workload 3: the cost of acquire+release with H holders already in.
 *
 * For each semaphore strategy, one semaphore of limit max(H) + headroom is filled level by
 * level (H = 10, 1,000, 10,000, 100,000 by default) by filler threads, each with its own
 * client, through the public API (one acquire per holder, lease long enough to outlive the
 * run; the permits are freed locally, never released). At each level a fresh client
 * measures acquire+release pairs of a new holder, in batches alternating with the floor of
 * the same kind; the cost is the median over the batches of the mean us per pair. The lock
 * has one holder by definition and is not part of this workload. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "bench.h"

#define FILL_LEASE_MS (30LL * 60 * 1000)
#define MEASURE_LEASE_MS 10000
#define BATCHES 10

typedef struct filler {
    pthread_t th;
    bench_ctx *ctx;
    int kind;
    const char *name;
    uint32_t limit;
    long count;
    int rc;
    char err[256];
} filler;

static void *filler_main(void *arg)
{
    filler *f = arg;
    redsem_client *c = NULL;
    bench_handle h = {0};
    f->rc = bench_client_try(f->ctx, &c, f->err, sizeof f->err);
    if (f->rc == REDSEM_OK)
        f->rc = bench_handle_open(c, f->kind, f->name, f->limit, FILL_LEASE_MS, &h);
    for (long i = 0; i < f->count && f->rc == REDSEM_OK; i++) {
        redsem_permit *p = NULL;
        /* blocking, so that the locked strategy's busy guard is retried, not reported */
        f->rc = bench_acquire(&h, 30000, &p);
        redsem_permit_free(p);
    }
    if (f->rc != REDSEM_OK && c != NULL)
        snprintf(f->err, sizeof f->err, "%s (%s)", redsem_err_name(f->rc),
                 redsem_client_errmsg(c));
    bench_handle_close(&h);
    redsem_client_free(c);
    return NULL;
}

static void fill(bench_ctx *ctx, int kind, const char *name, uint32_t limit, long count)
{
    int nf = ctx->o->scale_fillers;
    if (count < nf * 100)
        nf = 1;
    filler *fs = calloc((size_t)nf, sizeof *fs);
    if (fs == NULL)
        bench_die("out of memory");
    for (int i = 0; i < nf; i++) {
        fs[i] = (filler){.ctx = ctx, .kind = kind, .name = name, .limit = limit,
                         .count = count / nf + (i < count % nf)};
        if (pthread_create(&fs[i].th, NULL, filler_main, &fs[i]) != 0)
            bench_die("pthread_create failed");
    }
    for (int i = 0; i < nf; i++)
        pthread_join(fs[i].th, NULL);
    for (int i = 0; i < nf; i++)
        if (fs[i].rc != REDSEM_OK)
            bench_die("scale: filling %s failed: %s", name, fs[i].err);
    free(fs);
}

/* Members of the holders (basic) or owners (fair, locked) sorted set, by ZCARD on a raw
 * connection (key layout of docs/design.md). Not redsem_sem_status(): on a fair semaphore it
 * reads every holder (HGETALL of the meta hash), and the Lua garbage it leaves behind slows
 * every later script on the server while Lua's incremental collector works through it,
 * which would distort the measurement that follows (see docs/benchmarks.md). */
static long long holders_now(const bench_ctx *ctx, int kind, const char *name)
{
    redisContext *c = bench_raw_connect(ctx);
    char key[512];
    /* fair and locked: the deadline set holds the holders (and the waiters: none here); since
     * 0.3 the owners set is the queue of waiters only */
    snprintf(key, sizeof key, "%s{%s}:%s", ctx->prefix, name,
             kind == BENCH_BASIC ? "holders" : "timeouts");
    redisReply *r = redisCommand(c, "ZCARD %s", key);
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return n;
}

void bench_run_scale(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    json_t *arr = json_array();
    long hmax = 0;
    for (int i = 0; i < o->nholders; i++)
        if (o->holders[i] > hmax)
            hmax = o->holders[i];
    long limit = hmax + 1000;
    if (limit > (long)REDSEM_LIMIT_MAX)
        limit = REDSEM_LIMIT_MAX;
    long batch = o->scale_pairs / BATCHES;
    if (batch < 1)
        batch = 1;

    printf("\n== scale: acquire+release of one more holder with H holders in the semaphore "
           "(limit %ld); us per pair, median of %d batches of %ld; x first: cost / cost at the "
           "first level; x first/floor: the same, each divided by the floor measured with it\n",
           limit, BATCHES, batch);
    printf("%-8s %8s | %8s %8s %8s | %8s %8s | %8s %8s %9s\n", "strategy", "H", "us/pair",
           "p50", "p99", "floor us", "x floor", "x first", "x first/", "fill/s");
    printf("%-8s %8s | %8s %8s %8s | %8s %8s | %8s %8s %9s\n", "", "", "", "", "", "", "", "",
           "floor", "");
    bench_rule(101);
    fflush(stdout);
    for (int kind = 0; kind < BENCH_LOCK; kind++) {
        if (!o->kinds[kind])
            continue;
        char name[64];
        bench_name(ctx, "s", name, sizeof name);
        redsem_client *c = bench_client(ctx);
        bench_handle h;
        int rc = bench_handle_open(c, kind, name, (uint32_t)limit, MEASURE_LEASE_MS, &h);
        if (rc != REDSEM_OK)
            bench_die("scale: open: %s (%s)", redsem_err_name(rc), redsem_client_errmsg(c));
        bench_floor *f = bench_floor_new(ctx, kind, name);
        long have = 0;
        double first_cost = 0, first_xfloor = 0;
        for (int li = 0; li < o->nholders; li++) {
            long H = o->holders[li];
            double fill_rate = 0;
            if (H > have) {
                bench_progress(ctx, "scale %s: filling to %ld holders", bench_kind_name(kind), H);
                int64_t t0 = bench_now_ns();
                fill(ctx, kind, name, (uint32_t)limit, H - have);
                fill_rate = (double)(H - have) / ((double)(bench_now_ns() - t0) / 1e9);
                have = H;
            }
            long long seen = holders_now(ctx, kind, name);
            if (seen != H)
                fprintf(stderr, "redsem-bench: scale %s: %lld entries on the server, %ld expected\n",
                        bench_kind_name(kind), seen, H);
            bench_progress(ctx, "scale %s: %lld holders, measuring %ld pairs",
                           bench_kind_name(kind), seen, batch * BATCHES);
            double lib_batch[BATCHES], floor_batch[BATCHES];
            bench_samples pairs;
            samples_init(&pairs);
            for (int b = 0; b < BATCHES; b++) {
                for (int step = 0; step < 2; step++) {
                    bool lib = (step == 0) == (b % 2 == 1);
                    int64_t t0 = bench_now_ns();
                    for (long i = 0; i < batch; i++) {
                        int64_t p0 = bench_now_ns();
                        if (lib) {
                            redsem_permit *p = NULL;
                            rc = bench_acquire(&h, 5000, &p);
                            if (rc == REDSEM_OK)
                                rc = redsem_permit_release(p);
                            redsem_permit_free(p);
                            if (rc != REDSEM_OK)
                                bench_die("scale: %s (%s)", redsem_err_name(rc),
                                          redsem_client_errmsg(c));
                            samples_add(&pairs, bench_now_ns() - p0);
                        } else if (bench_floor_acquire(f) != 0 || bench_floor_release(f) != 0) {
                            bench_die("scale: floor failed");
                        }
                    }
                    double us = (double)(bench_now_ns() - t0) / 1e3 / (double)batch;
                    if (lib)
                        lib_batch[b] = us;
                    else
                        floor_batch[b] = us;
                }
            }
            double cost = bench_median(lib_batch, BATCHES);
            double fcost = bench_median(floor_batch, BATCHES);
            bench_pct pp = bench_percentiles(pairs.v, pairs.n);
            samples_free(&pairs);
            if (li == 0) {
                first_cost = cost;
                first_xfloor = cost / fcost;
            }
            double norm = cost / fcost / first_xfloor;
            printf("%-8s %8ld | %8.1f %8.1f %8.1f | %8.1f %8.2f | %8.2f %8.2f %9.0f\n",
                   bench_kind_name(kind), H, cost, pp.p50, pp.p99, fcost, cost / fcost,
                   cost / first_cost, norm, fill_rate);
            fflush(stdout);
            json_t *row = json_pack(
                "{s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:o}", "strategy",
                bench_kind_name(kind), "holders", (json_int_t)H, "holders_seen",
                (json_int_t)seen, "limit", (json_int_t)limit, "pair_us", cost,
                "floor_pair_us", fcost, "ratio_to_floor", cost / fcost, "ratio_to_first_level",
                cost / first_cost, "fill_per_s", fill_rate, "pair", bench_pct_json(&pp));
            json_object_set_new(row, "pairs", json_integer((json_int_t)(batch * BATCHES)));
            json_object_set_new(row, "ratio_to_first_level_floor_normalized", json_real(norm));
            json_array_append_new(arr, row);
        }
        bench_floor_free(f);
        bench_handle_close(&h);
        redsem_client_free(c);
        bench_cleanup(ctx, name);
    }
    json_object_set_new(ctx->json, "scale", arr);
}
