/* redsem-bench - workload 3: the cost of acquire+release with H holders already in.
 *
 * For each semaphore strategy, one semaphore of limit max(H) + headroom is filled level by
 * level (H = 10, 1,000, 10,000, 100,000 by default) by filler threads, each with its own
 * client, through the public API (one acquire per holder, lease long enough to outlive the
 * run; the permits are freed locally, never released). At each level a fresh client
 * measures acquire+release pairs of a new holder, in batches alternating with the floor of
 * the same kind; the cost is the median over the batches of the mean us per pair. The lock
 * has one holder by definition and is not part of this workload. Then a few more pairs run
 * with every command in the server's SLOWLOG (the "server phase", kept apart so that logging
 * does not slow the timed pairs): the server's time per acquire, and the longest single
 * command of an acquire, i.e. the longest the server did nothing else for it.
 *
 * Redis in Action's fair and locked semaphores (book-fair, book-locked: reference.c) are
 * measured the same way after the library's, with two differences: their holders are written
 * directly in the state the book's acquires leave (filling through their O(holders) acquire
 * would take hours), and at each level they measure only as many pairs as fit in about
 * REF_LEVEL_SECS. */
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
/* The book's references: their acquire is O(holders), about 10^4 times the library's at
 * 100,000 holders, so at each level they measure as many pairs as fit in about this many
 * seconds (at least one per batch, at most --scale-pairs), then a few more for the server
 * figures. Their timeout (the book's lease) outlives the run. */
#define REF_LEVEL_SECS 1.0
#define SERVER_PHASE_SECS 0.3
#define SERVER_PHASE_MAX 100
#define REF_TIMEOUT_S 1800.0

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

/* One strategy or reference under measurement, and its floor. */
typedef struct subject {
    int kind;
    redsem_client *c;
    bench_handle h;
    bench_floor *f;
    bench_ref *ref, *ref_floor;
} subject;

/* One acquire+release pair; *acq_ns the acquire's duration. Exits on a failure. */
static void pair(subject *sj, int64_t *acq_ns)
{
    int64_t t0 = bench_now_ns();
    if (sj->ref != NULL) {
        long long t = bench_ref_acquire(sj->ref, 5000);
        *acq_ns = bench_now_ns() - t0;
        if (t <= 0 || bench_ref_release(sj->ref) != 0)
            bench_die("scale: %s: acquire %s", bench_kind_name(sj->kind),
                      t == 0 ? "not granted in 5 s" : "failed");
        return;
    }
    redsem_permit *p = NULL;
    int rc = bench_acquire(&sj->h, 5000, &p);
    *acq_ns = bench_now_ns() - t0;
    if (rc == REDSEM_OK)
        rc = redsem_permit_release(p);
    redsem_permit_free(p);
    if (rc != REDSEM_OK)
        bench_die("scale: %s (%s)", redsem_err_name(rc), redsem_client_errmsg(sj->c));
}

static void floor_pair(subject *sj)
{
    if (sj->ref_floor != NULL) {
        if (bench_ref_acquire(sj->ref_floor, 5000) <= 0 || bench_ref_release(sj->ref_floor) != 0)
            bench_die("scale: floor failed");
    } else if (bench_floor_acquire(sj->f) != 0 || bench_floor_release(sj->f) != 0) {
        bench_die("scale: floor failed");
    }
}

static long long entries_now(const bench_ctx *ctx, int kind, const char *name)
{
    if (kind < BENCH_NKINDS)
        return holders_now(ctx, kind, name);
    char key[4][640];
    bench_ref_keys(ctx, name, key);
    redisContext *c = bench_raw_connect(ctx);
    redisReply *r = redisCommand(c, "ZCARD %s", key[1]);
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return n;
}

/* sorts b->acq */
static void fmt_busy(char *out, size_t len, bench_busy *b, long n)
{
    if (b->valid && n > 0) {
        bench_pct p = bench_percentiles(b->acq.v, b->acq.n);
        snprintf(out, len, "%9.1f %8.0f %8lld", b->acquire_us / (double)n, p.p99,
                 b->acquire_max_us);
    } else {
        snprintf(out, len, "%9s %8s %8s", "-", "-", "-");
    }
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
    long batch_max = o->scale_pairs / BATCHES;
    if (batch_max < 1)
        batch_max = 1;

    printf("\n== scale: acquire+release of one more holder with H holders in the semaphore "
           "(limit %ld); us per pair, median of %d batches of %ld (book-*: as many as fit in "
           "%.0f s per level); x first: cost / cost at the first level; x first/floor: the "
           "same, each divided by the floor measured with it; srv us/acq: the server's time "
           "per acquire; cmd p99, max busy: its commands' p99 and longest, the longest the "
           "server did nothing else (SLOWLOG, us, of 5-100 more pairs)\n",
           limit, BATCHES, batch_max, REF_LEVEL_SECS);
    printf("%-11s %6s | %9s %8s %8s | %8s %7s | %7s %7s | %9s %8s %8s | %8s\n", "strategy", "H",
           "us/pair", "pair p99", "acq p99", "floor us", "x floor", "x first", "x first/",
           "srv us/", "cmd p99", "max busy", "fill/s");
    printf("%-11s %6s | %9s %8s %8s | %8s %7s | %7s %7s | %9s %8s %8s | %8s\n", "", "", "", "",
           "", "", "", "", "floor", "acq", "us", "us", "");
    bench_rule(127);
    fflush(stdout);
    for (int kind = 0; kind < BENCH_NALL; kind++) {
        if (kind == BENCH_LOCK || !o->kinds[kind])
            continue;
        bool ref = kind >= BENCH_NKINDS;
        char name[64];
        bench_name(ctx, "s", name, sizeof name);
        subject sj = {.kind = kind};
        if (ref) {
            sj.ref = bench_ref_new(ctx, kind, name, (uint32_t)limit, REF_TIMEOUT_S, false);
            sj.ref_floor = bench_ref_new(ctx, kind, name, (uint32_t)limit, REF_TIMEOUT_S, true);
        } else {
            sj.c = bench_client(ctx);
            int rc = bench_handle_open(sj.c, kind, name, (uint32_t)limit, MEASURE_LEASE_MS, &sj.h);
            if (rc != REDSEM_OK)
                bench_die("scale: open: %s (%s)", redsem_err_name(rc), redsem_client_errmsg(sj.c));
            sj.f = bench_floor_new(ctx, kind, name);
        }
        long have = 0;
        double first_cost = 0, first_xfloor = 0;
        for (int li = 0; li < o->nholders; li++) {
            long H = o->holders[li];
            double fill_rate = 0;
            if (H > have) {
                bench_progress(ctx, "scale %s: filling to %ld holders", bench_kind_name(kind), H);
                int64_t t0 = bench_now_ns();
                if (ref)
                    bench_ref_fill(ctx, name, have, H);
                else
                    fill(ctx, kind, name, (uint32_t)limit, H - have);
                fill_rate = (double)(H - have) / ((double)(bench_now_ns() - t0) / 1e9);
                have = H;
            }
            long long seen = entries_now(ctx, kind, name);
            if (seen != H)
                fprintf(stderr, "redsem-bench: scale %s: %lld entries on the server, %ld expected\n",
                        bench_kind_name(kind), seen, H);
            /* one pair first: it estimates a reference's cost (and warms up either) */
            int64_t a0, w0 = bench_now_ns();
            pair(&sj, &a0);
            double est_s = (double)(bench_now_ns() - w0) / 1e9;
            long batch = batch_max;
            if (ref) {
                double fit = REF_LEVEL_SECS / BATCHES / (est_s > 1e-6 ? est_s : 1e-6);
                batch = fit < 1 ? 1 : fit > (double)batch_max ? batch_max : (long)fit;
            }
            bench_progress(ctx, "scale %s: %lld holders, measuring %ld pairs",
                           bench_kind_name(kind), seen, batch * BATCHES);
            double lib_batch[BATCHES], floor_batch[BATCHES];
            bench_samples pairs, acqs;
            samples_init(&pairs);
            samples_init(&acqs);
            for (int b = 0; b < BATCHES; b++) {
                for (int step = 0; step < 2; step++) {
                    bool lib = (step == 0) == (b % 2 == 1);
                    int64_t t0 = bench_now_ns();
                    for (long i = 0; i < batch; i++) {
                        int64_t p0 = bench_now_ns(), an;
                        if (lib) {
                            pair(&sj, &an);
                            samples_add(&pairs, bench_now_ns() - p0);
                            samples_add(&acqs, an);
                        } else {
                            floor_pair(&sj);
                        }
                    }
                    double us = (double)(bench_now_ns() - t0) / 1e3 / (double)batch;
                    if (lib)
                        lib_batch[b] = us;
                    else
                        floor_batch[b] = us;
                }
            }
            /* the server phase: a few more pairs with every command logged */
            long nsrv = (long)(SERVER_PHASE_SECS / (est_s > 1e-6 ? est_s : 1e-6));
            nsrv = nsrv < 5 ? 5 : nsrv > SERVER_PHASE_MAX ? SERVER_PHASE_MAX : nsrv;
            bench_busy busy = {0};
            bench_slowlog *sl =
                o->no_slowlog ? NULL : bench_slowlog_start(ctx, 0, 8 * SERVER_PHASE_MAX);
            if (sl != NULL) {
                bench_busy scratch = {0};
                bench_slowlog_collect(sl, kind, &scratch); /* empties it */
                bench_busy_free(&scratch);
                for (long i = 0; i < nsrv; i++) {
                    int64_t an;
                    pair(&sj, &an);
                }
                busy.valid = bench_slowlog_collect(sl, kind, &busy) == 0;
                bench_slowlog_stop(sl);
            }
            double cost = bench_median(lib_batch, BATCHES);
            double fcost = bench_median(floor_batch, BATCHES);
            bench_pct pp = bench_percentiles(pairs.v, pairs.n);
            bench_pct ap = bench_percentiles(acqs.v, acqs.n);
            samples_free(&pairs);
            samples_free(&acqs);
            if (li == 0) {
                first_cost = cost;
                first_xfloor = cost / fcost;
            }
            double norm = cost / fcost / first_xfloor;
            char fr[16] = "direct", srv[32];
            if (!ref)
                snprintf(fr, sizeof fr, "%8.0f", fill_rate);
            fmt_busy(srv, sizeof srv, &busy, nsrv);
            printf("%-11s %6ld | %9.1f %8.1f %8.1f | %8.1f %7.2f | %7.2f %7.2f | %s | %8s\n",
                   bench_kind_name(kind), H, cost, pp.p99, ap.p99, fcost, cost / fcost,
                   cost / first_cost, norm, srv, fr);
            fflush(stdout);
            json_t *row = json_pack(
                "{s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:o}", "strategy",
                bench_kind_name(kind), "holders", (json_int_t)H, "holders_seen",
                (json_int_t)seen, "limit", (json_int_t)limit, "pair_us", cost,
                "floor_pair_us", fcost, "ratio_to_floor", cost / fcost, "ratio_to_first_level",
                cost / first_cost, "fill_per_s", ref ? 0.0 : fill_rate, "pair",
                bench_pct_json(&pp));
            json_object_set_new(row, "reference", json_boolean(ref));
            if (ref)
                json_object_set_new(row, "fill", json_string("direct (ZADD, the state the book's "
                                                             "acquires leave)"));
            json_object_set_new(row, "pairs", json_integer((json_int_t)(batch * BATCHES)));
            json_object_set_new(row, "pairs_per_s", json_real(cost > 0 ? 1e6 / cost : 0));
            json_object_set_new(row, "acquire", bench_pct_json(&ap));
            json_object_set_new(row, "server", bench_busy_json(&busy, (uint64_t)nsrv));
            json_object_set_new(row, "ratio_to_first_level_floor_normalized", json_real(norm));
            json_array_append_new(arr, row);
            bench_busy_free(&busy);
        }
        if (ref) {
            bench_ref_free(sj.ref);
            bench_ref_free(sj.ref_floor);
        } else {
            bench_floor_free(sj.f);
            bench_handle_close(&sj.h);
            redsem_client_free(sj.c);
        }
        bench_cleanup(ctx, name);
    }
    json_object_set_new(ctx->json, "scale", arr);
}
