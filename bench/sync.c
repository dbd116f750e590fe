/* redsem-bench - the sync workload (issue 9): what redsem_options_set_sync_replicas() costs,
 * as a ratio to the same workload without it, in the same run.
 *
 * A private primary (on the server's CPU, like the default private server) and two private
 * replicas of it (--replicaof over loopback; not pinned, or with --pin on the same CPU as
 * everything else), all fully synced (state=online) before anything is measured.
 *
 * For each strategy, three clients, each with its own semaphore (or lock): no WAIT,
 * sync_replicas 1 and sync_replicas 2 (timeout SYNC_TIMEOUT_MS). --sync-pairs
 * acquire+release pairs per setting, timed one by one, in rounds of a BATCH-pair batch of
 * every setting (the order rotates from round to round). "x none" is the median of the
 * per-round ratios of pairs/s to the no-WAIT batch of the same round; latency percentiles are
 * over all pairs, divided by the no-WAIT ones. With the option, each acquire's script is
 * followed in the same write by WAIT n timeout (one round trip, two replies); the release is
 * not (it is not synced).
 *
 * "raw" rows: the same three settings on a raw hiredis connection, per pair EVALSHA of a
 * script that SETs one key (so that there is something to replicate) followed in the same
 * write by WAIT n timeout when n > 0, then EVALSHA of "return 1": what WAIT itself costs on
 * this machine, without the library.
 *
 * "shared" rows: 8 and 32 threads on one client (one for no WAIT, one for sync_replicas 1),
 * basic try-acquire + release pairs on a semaphore of limit T, SHARED_ROUNDS rounds of a
 * SHARED_SECS batch of each setting, alternating: pairs/s, its ratio to no WAIT (the median
 * of the per-round ratios) and the WAITs the primary ran per synced grant (INFO
 * commandstats): the calls written on a connection while a WAIT is due share it (the
 * engine's group commit), so under many threads far fewer than one. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "bench.h"
#include "server.h"

#define WARMUP_PAIRS 200
#define LEASE_MS 10000
#define TIMEOUT_MS 5000
#define SYNC_REPLICAS 2
#define SYNC_TIMEOUT_MS 2000
#define NSET (SYNC_REPLICAS + 1) /* settings: WAIT for 0 (none), 1, 2 replicas */
#define BATCH 250 /* pairs per batch: short batches, so every setting sees the same noise */
#define RAW (BENCH_NKINDS) /* the raw rows, after the kinds */

typedef struct setting {
    /* library */
    redsem_client *c;
    bench_handle h;
    /* raw */
    redisContext *raw;
    int64_t *acq, *rel, *pair;
    long n;         /* timed pairs that succeeded */
    long failed;    /* acquires refused for lack of acknowledgements (REDSEM_EREPLICA; raw:
                       WAIT answered fewer than n) */
    double secs;    /* summed over the batches */
    bench_pct pa, pr, pp;
} setting;

static void check(int rc, redsem_client *c, const char *what)
{
    if (rc != REDSEM_OK)
        bench_die("sync: %s: %s (%s)", what, redsem_err_name(rc), redsem_client_errmsg(c));
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

#define SHARED_ROUNDS 6
#define SHARED_SECS 0.4

typedef struct shared_run {
    redsem_sem *s;
    atomic_bool go, stop;
    atomic_long pairs, failed;
} shared_run;

static void *shared_thread(void *arg)
{
    shared_run *r = arg;
    while (!atomic_load(&r->go))
        bench_sleep_ns(100000);
    long n = 0, f = 0;
    while (!atomic_load(&r->stop)) {
        redsem_permit *p = NULL;
        if (redsem_sem_try_acquire(r->s, &p) == REDSEM_OK) {
            n++;
            (void)redsem_permit_release(p);
            redsem_permit_free(p);
        } else {
            f++;
        }
    }
    atomic_fetch_add(&r->pairs, n);
    atomic_fetch_add(&r->failed, f);
    return NULL;
}

/* One batch: threads pairs on s for SHARED_SECS; pairs/s (*pairs: how many, *failed added). */
static double shared_batch(redsem_sem *s, int threads, long *pairs, long *failed)
{
    shared_run r = {.s = s};
    pthread_t tid[32];
    for (int t = 0; t < threads; t++)
        if (pthread_create(&tid[t], NULL, shared_thread, &r) != 0)
            bench_die("sync: pthread_create failed");
    int64_t t0 = bench_now_ns();
    atomic_store(&r.go, true);
    bench_sleep_ns((int64_t)(SHARED_SECS * 1e9));
    atomic_store(&r.stop, true);
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    *pairs = atomic_load(&r.pairs);
    *failed += atomic_load(&r.failed);
    return (double)*pairs / ((double)(bench_now_ns() - t0) / 1e9);
}

/* The WAITs the server behind c has run. */
static long long wait_calls(redisContext *c)
{
    redisReply *r = redisCommand(c, "INFO commandstats");
    const char *w = r != NULL && r->type == REDIS_REPLY_STRING ? strstr(r->str, "cmdstat_wait:calls=")
                                                               : NULL;
    long long n = w != NULL ? atoll(w + strlen("cmdstat_wait:calls=")) : 0;
    freeReplyObject(r);
    return n;
}

static void shared_rows(bench_ctx *ctx, const bench_ctx *px, json_t *rows)
{
    static const int counts[] = {8, 32};
    redisContext *info = bench_raw_connect(px);
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        int T = counts[k];
        bench_progress(ctx, "sync shared: %d threads", T);
        redsem_client *c[2];
        redsem_sem *s[2];
        for (int n = 0; n < 2; n++) {
            bench_ctx cx = *px;
            cx.sync_replicas = n;
            cx.sync_timeout_ms = SYNC_TIMEOUT_MS;
            char name[64];
            bench_name(ctx, "sync-shared", name, sizeof name);
            c[n] = bench_client(&cx);
            check(redsem_sem_open(c[n], name, REDSEM_STRATEGY_BASIC, (uint32_t)T, LEASE_MS,
                                  &s[n]), c[n], "open");
        }
        double rate[2][SHARED_ROUNDS], ratios[SHARED_ROUNDS];
        long failed[2] = {0, 0}, synced = 0;
        long long waits = 0;
        for (int rd = 0; rd < SHARED_ROUNDS; rd++) {
            for (int step = 0; step < 2; step++) {
                int n = (rd + step) % 2;
                long long w0 = wait_calls(info);
                long got = 0;
                rate[n][rd] = shared_batch(s[n], T, &got, &failed[n]);
                if (n == 1) {
                    waits += wait_calls(info) - w0;
                    synced += got;
                }
            }
            ratios[rd] = ratio(rate[1][rd], rate[0][rd]);
        }
        double none = bench_median(rate[0], SHARED_ROUNDS), one = bench_median(rate[1], SHARED_ROUNDS);
        double med = bench_median(ratios, SHARED_ROUNDS);
        double per = synced > 0 ? (double)waits / (double)synced : 0;
        printf("shared   %2d threads on one client, basic: %9.0f pairs/s without WAIT, %9.0f with "
               "WAIT 1 (x none %5.3f), %.3f WAITs per synced grant, failed %ld\n",
               T, none, one, med, per, failed[0] + failed[1]);
        json_array_append_new(rows, json_pack("{s:s, s:i, s:f, s:f, s:f, s:f, s:i}", "strategy",
                                              "shared-basic", "threads", T, "pairs_per_s_none",
                                              none, "pairs_per_s_wait1", one, "ratio_pairs_per_s",
                                              med, "waits_per_grant", per, "failed",
                                              (json_int_t)(failed[0] + failed[1])));
        for (int n = 0; n < 2; n++) {
            redsem_sem_free(s[n]);
            redsem_client_free(c[n]);
        }
    }
    redisFree(info);
    bench_cleanup(px, NULL);
    fflush(stdout);
}

static char raw_sha_set[41], raw_sha_one[41], raw_key[256];

static void raw_load(redisContext *c)
{
    static const char *const bodies[2] = {"redis.call('SET', KEYS[1], ARGV[1]) return 1",
                                          "return 1"};
    char *out[2] = {raw_sha_set, raw_sha_one};
    for (int i = 0; i < 2; i++) {
        redisReply *r = redisCommand(c, "SCRIPT LOAD %s", bodies[i]);
        if (r == NULL || r->type != REDIS_REPLY_STRING || r->len != 40)
            bench_die("sync: SCRIPT LOAD failed: %s", r && r->str ? r->str : c->errstr);
        memcpy(out[i], r->str, 40);
        out[i][40] = '\0';
        freeReplyObject(r);
    }
}

/* One pair; false if it was not granted (library: REDSEM_EREPLICA; raw: too few acks). */
static bool one_pair(setting *s, int kind, int replicas, int64_t *acq, int64_t *rel)
{
    int64_t t0 = bench_now_ns(), t1;
    if (kind == RAW) {
        redisContext *c = s->raw;
        redisAppendCommand(c, "EVALSHA %s 1 %s %lld", raw_sha_set, raw_key,
                           (long long)bench_now_ns());
        if (replicas > 0)
            redisAppendCommand(c, "WAIT %d %d", replicas, SYNC_TIMEOUT_MS);
        redisReply *r = NULL, *w = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK || r->type == REDIS_REPLY_ERROR ||
            (replicas > 0 && (redisGetReply(c, (void **)&w) != REDIS_OK ||
                              w->type != REDIS_REPLY_INTEGER)))
            bench_die("sync: raw EVALSHA/WAIT failed: %s", c->errstr[0] ? c->errstr : "error");
        bool ok = replicas == 0 || w->integer >= replicas;
        freeReplyObject(r);
        if (w)
            freeReplyObject(w);
        t1 = bench_now_ns();
        r = redisCommand(c, "EVALSHA %s 0", raw_sha_one);
        if (r == NULL || r->type == REDIS_REPLY_ERROR)
            bench_die("sync: raw EVALSHA failed: %s", c->errstr[0] ? c->errstr : "error");
        freeReplyObject(r);
        *acq = t1 - t0;
        *rel = bench_now_ns() - t1;
        return ok;
    }
    redsem_permit *p = NULL;
    int rc = bench_acquire(&s->h, TIMEOUT_MS, &p);
    t1 = bench_now_ns();
    if (rc == REDSEM_EREPLICA)
        return false;
    check(rc, s->c, "acquire");
    rc = redsem_permit_release(p);
    check(rc, s->c, "release");
    redsem_permit_free(p);
    *acq = t1 - t0;
    *rel = bench_now_ns() - t1;
    return true;
}

/* Count the replicas the primary sees online (INFO replication: slaveN:...,state=online,...). */
static int replicas_online(redisContext *c)
{
    int n = 0;
    for (int i = 0; i < SYNC_REPLICAS; i++) {
        char f[16], v[256];
        snprintf(f, sizeof f, "slave%d", i);
        bench_info_field(c, "replication", f, v, sizeof v);
        if (strstr(v, "state=online") != NULL)
            n++;
    }
    return n;
}

void bench_run_sync(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    /* ------------------------------------------------------------ servers */
    static char pport[16];
    static const char *const pextra[] = {"--maxmemory-policy", "noeviction", "--repl-diskless-sync",
                                         "yes", "--repl-diskless-sync-delay", "0", NULL};
    static const char *const rextra[] = {"--replicaof", "127.0.0.1", pport,
                                         "--repl-diskless-load", "on-empty-db", NULL};
    ts_server primary, replica[SYNC_REPLICAS];
    bench_progress(ctx, "sync: a primary and %d replicas", SYNC_REPLICAS);
    int rc = bench_server_start(pextra, true, ctx->server_cpu, &primary);
    if (rc == 77)
        bench_die("sync: redis-server not found");
    if (rc != 0)
        bench_die("sync: could not start the primary");
    snprintf(pport, sizeof pport, "%d", primary.port);
    for (int i = 0; i < SYNC_REPLICAS; i++)
        if (bench_server_start(rextra, false, ctx->replica_cpu, &replica[i]) != 0)
            bench_die("sync: could not start replica %d", i + 1);
    bench_ctx px = *ctx;
    px.tls_ca = NULL;
    px.sync_replicas = 0;
    if (o->unix_socket)
        snprintf(px.url, sizeof px.url, "%s", primary.url);
    else
        snprintf(px.url, sizeof px.url, "redis://127.0.0.1:%d", primary.port);
    redisContext *info = bench_raw_connect(&px);
    int64_t until = bench_now_ns() + 30 * 1000000000LL;
    while (replicas_online(info) < SYNC_REPLICAS) {
        if (bench_now_ns() > until)
            bench_die("sync: the replicas were not online on the primary after 30 s");
        bench_sleep_ns(20 * 1000000LL);
    }
    redisFree(info);

    char scpu[16] = "any", rcpu[16] = "any";
    if (ctx->server_cpu >= 0)
        snprintf(scpu, sizeof scpu, "%d", ctx->server_cpu);
    if (ctx->replica_cpu >= 0)
        snprintf(rcpu, sizeof rcpu, "%d", ctx->replica_cpu);
    long batch = o->sync_pairs < BATCH ? o->sync_pairs : BATCH;
    int rounds = (int)((o->sync_pairs + batch - 1) / batch);
    long pairs = batch * rounds;
    printf("\n== sync: WAIT after every acquire (sync_replicas 0 = none, 1, 2; timeout %d ms), "
           "one client per setting; private primary (CPU %s) and %d replicas (CPU %s) over %s; "
           "%ld pairs per strategy and setting, %d rounds of a %ld-pair batch each; ratios to no "
           "WAIT within this run (latencies in us)\n",
           SYNC_TIMEOUT_MS, scpu, SYNC_REPLICAS, rcpu,
           o->unix_socket ? "the unix socket" : "TCP loopback", pairs, rounds, batch);
    printf("%-8s %4s %9s %7s | %8s %8s %8s | %8s %8s | %8s %8s | %8s %8s %8s | %6s\n",
           "strategy", "WAIT", "pairs/s", "x none", "acq p50", "p99", "p99.9", "rel p50", "p99",
           "pair p50", "p99", "acq p50", "p99", "+us p50", "failed");
    printf("%-8s %4s %9s %7s | %8s %8s %8s | %8s %8s | %8s %8s | %26s |\n", "", "", "", "", "",
           "", "", "", "", "", "", "x none   x none  vs none");
    bench_rule(135);

    json_t *rows = json_array();
    snprintf(raw_key, sizeof raw_key, "%s{sync-raw}:k", ctx->prefix);
    for (int kind = 0; kind <= RAW; kind++) {
        if (kind < RAW && !o->kinds[kind])
            continue;
        const char *kname = kind == RAW ? "raw" : bench_kind_name(kind);
        bench_progress(ctx, "sync %s: %ld pairs per setting in %d rounds", kname, pairs, rounds);
        setting st[NSET];
        memset(st, 0, sizeof st);
        for (int n = 0; n < NSET; n++) {
            if (kind == RAW) {
                st[n].raw = bench_raw_connect(&px);
                raw_load(st[n].raw);
            } else {
                bench_ctx cx = px;
                cx.sync_replicas = n;
                cx.sync_timeout_ms = SYNC_TIMEOUT_MS;
                char name[64];
                bench_name(ctx, kind == BENCH_LOCK ? "sync-lock" : "sync-sem", name, sizeof name);
                st[n].c = bench_client(&cx);
                check(bench_handle_open(st[n].c, kind, name, 1, LEASE_MS, &st[n].h), st[n].c,
                      "open");
            }
            st[n].acq = malloc((size_t)pairs * sizeof(int64_t));
            st[n].rel = malloc((size_t)pairs * sizeof(int64_t));
            st[n].pair = malloc((size_t)pairs * sizeof(int64_t));
            if (!st[n].acq || !st[n].rel || !st[n].pair)
                bench_die("out of memory");
        }
        int64_t a, r;
        for (int i = 0; i < WARMUP_PAIRS; i++)
            for (int n = 0; n < NSET; n++)
                (void)one_pair(&st[n], kind, n, &a, &r);
        double *ratios[NSET];
        for (int n = 0; n < NSET; n++)
            if ((ratios[n] = malloc((size_t)rounds * sizeof(double))) == NULL)
                bench_die("out of memory");
        for (int rd = 0; rd < rounds; rd++) {
            double secs[NSET];
            for (int step = 0; step < NSET; step++) {
                int n = (rd + step) % NSET;
                setting *s = &st[n];
                int64_t t0 = bench_now_ns();
                for (long i = 0; i < batch; i++) {
                    if (one_pair(s, kind, n, &s->acq[s->n], &s->rel[s->n])) {
                        s->pair[s->n] = s->acq[s->n] + s->rel[s->n];
                        s->n++;
                    } else {
                        s->failed++;
                    }
                }
                secs[n] = (double)(bench_now_ns() - t0) / 1e9;
                s->secs += secs[n];
            }
            for (int n = 0; n < NSET; n++)
                ratios[n][rd] = ratio(secs[0], secs[n]); /* pairs/s of n / pairs/s of none */
        }
        for (int n = 0; n < NSET; n++) {
            st[n].pa = bench_percentiles(st[n].acq, (size_t)st[n].n);
            st[n].pr = bench_percentiles(st[n].rel, (size_t)st[n].n);
            st[n].pp = bench_percentiles(st[n].pair, (size_t)st[n].n);
        }
        json_t *row = json_object(), *settings = json_array();
        json_object_set_new(row, "strategy", json_string(kname));
        json_object_set_new(row, "pairs", json_integer(pairs));
        const setting *z = &st[0];
        for (int n = 0; n < NSET; n++) {
            const setting *s = &st[n];
            json_t *rr = json_array();
            for (int i = 0; i < rounds; i++)
                json_array_append_new(rr, json_real(ratios[n][i]));
            double med = bench_median(ratios[n], (size_t)rounds);
            double pps = (double)pairs / s->secs;
            printf("%-8s %4d %9.0f %7.3f | %8.1f %8.1f %8.1f | %8.1f %8.1f | %8.1f %8.1f | "
                   "%8.2f %8.2f %8.1f | %6ld\n",
                   n == 0 ? kname : "", n, pps, med, s->pa.p50, s->pa.p99, s->pa.p999, s->pr.p50,
                   s->pr.p99, s->pp.p50, s->pp.p99, ratio(s->pa.p50, z->pa.p50),
                   ratio(s->pa.p99, z->pa.p99), s->pa.p50 - z->pa.p50, s->failed);
            json_t *j = json_object();
            json_object_set_new(j, "replicas", json_integer(n));
            json_object_set_new(j, "pairs_per_s", json_real(pps));
            json_object_set_new(j, "ratio_pairs_per_s", json_real(med));
            json_object_set_new(j, "round_ratios", rr);
            json_object_set_new(j, "failed", json_integer(s->failed));
            json_object_set_new(j, "acquire", bench_pct_json(&s->pa));
            json_object_set_new(j, "release", bench_pct_json(&s->pr));
            json_object_set_new(j, "pair", bench_pct_json(&s->pp));
            json_object_set_new(
                j, "ratio_latency",
                json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "acquire_p50",
                          ratio(s->pa.p50, z->pa.p50), "acquire_p99", ratio(s->pa.p99, z->pa.p99),
                          "acquire_p999", ratio(s->pa.p999, z->pa.p999), "release_p50",
                          ratio(s->pr.p50, z->pr.p50), "pair_p50", ratio(s->pp.p50, z->pp.p50),
                          "pair_p99", ratio(s->pp.p99, z->pp.p99)));
            json_object_set_new(j, "added_us_acquire_p50", json_real(s->pa.p50 - z->pa.p50));
            json_array_append_new(settings, j);
            free(ratios[n]);
        }
        json_object_set_new(row, "settings", settings);
        json_array_append_new(rows, row);
        for (int n = 0; n < NSET; n++) {
            free(st[n].acq);
            free(st[n].rel);
            free(st[n].pair);
            if (st[n].raw)
                redisFree(st[n].raw);
            bench_handle_close(&st[n].h);
            redsem_client_free(st[n].c);
        }
        bench_cleanup(&px, NULL);
        fflush(stdout);
    }

    shared_rows(ctx, &px, rows);

    json_t *out = json_object();
    json_object_set_new(out, "replicas", json_integer(SYNC_REPLICAS));
    json_object_set_new(out, "timeout_ms", json_integer(SYNC_TIMEOUT_MS));
    json_object_set_new(out, "server_cpu",
                        ctx->server_cpu >= 0 ? json_integer(ctx->server_cpu) : json_null());
    json_object_set_new(out, "replica_cpu",
                        ctx->replica_cpu >= 0 ? json_integer(ctx->replica_cpu) : json_null());
    json_object_set_new(out, "rows", rows);
    json_object_set_new(ctx->json, "sync", out);

    for (int i = 0; i < SYNC_REPLICAS; i++)
        bench_server_stop(&replica[i]);
    bench_server_stop(&primary);
}
