/* redsem-bench - the tls workload (issue 9): what TLS costs, as a ratio to plain TCP in the
 * same run.
 *
 * One private redis-server listens on a plain TCP port and on a TLS port (--tls-port, clients
 * not authenticated), with a CA and a server certificate for 127.0.0.1 made at run time in a
 * temporary directory by the openssl command (the commands of tests/support/gen-certs.sh,
 * CA and server certificate only). The library connects to both over loopback: redis:// and
 * rediss:// verified against that CA, as a production client would.
 *
 * 1. uncontended: for each strategy, one TCP client and one TLS client, each with its own
 *    semaphore (or lock); --tls-pairs acquire+release pairs per transport, timed one by one,
 *    in rounds of a TCP batch and a TLS batch of BATCH pairs (alternating which goes first).
 *    TLS/TCP pairs/s is the median of the per-round ratios; latency percentiles are over all
 *    pairs.
 *    Per pair: CPU of the bench thread and of the server's main thread (INFO cpu; Redis does
 *    its TLS work there).
 * 2. connect: redsem_client_new() over each transport, CONNECTS times, interleaved: the TLS
 *    handshake and certificate check.
 * 3. threads: TLS_THREADS threads, each with a TCP client and a TLS client and a semaphore
 *    for each, never waiting; TLS_THREAD_ROUNDS rounds of a TCP batch and a TLS batch of
 *    TLS_THREAD_SECS each (alternating which goes first), pairs/s summed over the threads;
 *    TLS/TCP is the median of the per-round ratios.
 * 4. client: what one TLS client costs (CPU, heap: its TLS context and its connection):
 *    run_client.
 *
 * There is no floor here: the raw hiredis 0.14 connections have no TLS. The TCP figures of
 * this workload are the library's, against this workload's own server. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "bench.h"
#include "server.h"

#define WARMUP_PAIRS 200
#define LEASE_MS 10000
#define CONNECTS 20
#define BATCH 250 /* pairs per batch: short batches, so both transports see the same noise */
#define TLS_THREADS 8
#define TLS_THREAD_ROUNDS 10
#define TLS_THREAD_SECS 0.1

enum { T_TCP = 0, T_TLS = 1 };
static const char *const tname[2] = {"TCP", "TLS"};

/* ---------------------------------------------------------------- certificates */

static const char *const cert_files[] = {"ca.key",     "ca.crt",     "ca.srl",     "server.key",
                                         "server.csr", "server.ext", "server.crt", NULL};

/* tests/support/gen-certs.sh, the CA and the server certificate only; $1 is the directory */
static const char gen_certs[] =
    "set -eu; cd \"$1\"; "
    "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out \"$1\" "
    "2>/dev/null; }; "
    "key ca.key; "
    "openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj '/CN=redsem-bench CA' "
    "2>/dev/null; "
    "key server.key; "
    "openssl req -new -key server.key -out server.csr -subj '/CN=localhost' 2>/dev/null; "
    "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' "
    "> server.ext; "
    "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt "
    "-days 2 -extfile server.ext 2>/dev/null";

static bool make_certs(const char *dir)
{
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", gen_certs, "sh", dir, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return false;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* ---------------------------------------------------------------- pairs */

static void check(int rc, redsem_client *c, const char *what)
{
    if (rc != REDSEM_OK)
        bench_die("tls: %s: %s (%s)", what, redsem_err_name(rc), redsem_client_errmsg(c));
}


static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

/* ---------------------------------------------------------------- 1. uncontended */

typedef struct side {
    redsem_client *c;
    bench_handle h;
    int64_t *acq, *rel, *pair;
    double secs, client_cpu, server_cpu; /* s, us, us: summed over the batches */
    bench_pct pa, pr, pp;
} side;

static json_t *side_json(const side *s, long pairs)
{
    double np = (double)pairs;
    json_t *j = json_object();
    json_object_set_new(j, "pairs_per_s", json_real(np / s->secs));
    json_object_set_new(j, "acquire", bench_pct_json(&s->pa));
    json_object_set_new(j, "release", bench_pct_json(&s->pr));
    json_object_set_new(j, "pair", bench_pct_json(&s->pp));
    json_object_set_new(j, "wall_us_per_pair", json_real(s->secs * 1e6 / np));
    json_object_set_new(j, "client_cpu_us_per_pair", json_real(s->client_cpu / np));
    json_object_set_new(j, "server_cpu_us_per_pair", json_real(s->server_cpu / np));
    return j;
}

static void run_uncontended(bench_ctx *ctx, bench_ctx *cx, json_t *out)
{
    const bench_opts *o = ctx->o;
    long batch = o->tls_pairs < BATCH ? o->tls_pairs : BATCH;
    int rounds = (int)((o->tls_pairs + batch - 1) / batch);
    long pairs = batch * rounds;
    json_t *arr = json_array();
    printf("\n== tls, uncontended: one client per transport, %ld acquire+release pairs per "
           "strategy and transport, %d rounds of a %ld-pair batch each (latencies in us; CPU "
           "per pair in us)\n",
           pairs, rounds, batch);
    printf("%-8s %-4s %9s %7s | %8s %8s %8s | %8s %8s %8s | %8s %8s\n", "strategy", "over",
           "pairs/s", "x TCP", "acq p50", "p99", "p99.9", "rel p50", "p99", "p99.9",
           "cli cpu", "srv cpu");
    bench_rule(112);
    for (int kind = 0; kind < BENCH_NKINDS; kind++) {
        if (!o->kinds[kind])
            continue;
        bench_progress(ctx, "tls uncontended %s: %ld pairs per transport in %d rounds",
                       bench_kind_name(kind), pairs, rounds);
        side sd[2];
        memset(sd, 0, sizeof sd);
        for (int t = 0; t < 2; t++) {
            char name[64];
            bench_name(ctx, kind == BENCH_LOCK ? "tls-lock" : "tls-sem", name, sizeof name);
            sd[t].c = bench_client(&cx[t]);
            check(bench_handle_open(sd[t].c, kind, name, 1, LEASE_MS, &sd[t].h), sd[t].c,
                  "open");
            sd[t].acq = malloc((size_t)pairs * sizeof(int64_t));
            sd[t].rel = malloc((size_t)pairs * sizeof(int64_t));
            sd[t].pair = malloc((size_t)pairs * sizeof(int64_t));
            if (!sd[t].acq || !sd[t].rel || !sd[t].pair)
                bench_die("out of memory");
        }
        redisContext *raw = bench_raw_connect(&cx[T_TCP]);
        int64_t a, r;
        for (int i = 0; i < WARMUP_PAIRS; i++)
            for (int t = 0; t < 2; t++)
                bench_lib_pair(&sd[t].h, sd[t].c, &a, &r);
        double *ratios = malloc((size_t)rounds * sizeof *ratios);
        if (ratios == NULL)
            bench_die("out of memory");
        for (int rd = 0; rd < rounds; rd++) {
            double secs[2];
            for (int step = 0; step < 2; step++) {
                int t = (step == 0) == (rd % 2 == 0) ? T_TCP : T_TLS;
                side *s = &sd[t];
                double scpu0 = bench_server_cpu_us(raw);
                double ccpu0 = bench_thread_cpu_us();
                int64_t t0 = bench_now_ns();
                for (long i = rd * batch; i < (rd + 1) * batch; i++) {
                    bench_lib_pair(&s->h, s->c, &s->acq[i], &s->rel[i]);
                    s->pair[i] = s->acq[i] + s->rel[i];
                }
                secs[t] = (double)(bench_now_ns() - t0) / 1e9;
                s->client_cpu += bench_thread_cpu_us() - ccpu0;
                s->server_cpu += bench_server_cpu_us(raw) - scpu0;
                s->secs += secs[t];
            }
            ratios[rd] = ratio(secs[T_TCP], secs[T_TLS]); /* = TLS pairs/s / TCP pairs/s */
        }
        redisFree(raw);
        for (int t = 0; t < 2; t++) {
            sd[t].pa = bench_percentiles(sd[t].acq, (size_t)pairs);
            sd[t].pr = bench_percentiles(sd[t].rel, (size_t)pairs);
            sd[t].pp = bench_percentiles(sd[t].pair, (size_t)pairs);
            free(sd[t].acq);
            free(sd[t].rel);
            free(sd[t].pair);
            bench_handle_close(&sd[t].h);
            redsem_client_free(sd[t].c);
        }
        json_t *rr = json_array();
        for (int i = 0; i < rounds; i++)
            json_array_append_new(rr, json_real(ratios[i]));
        double med = bench_median(ratios, (size_t)rounds);
        free(ratios);
        for (int t = 0; t < 2; t++) {
            const side *s = &sd[t];
            printf("%-8s %-4s %9.0f %7.3f | %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f | %8.1f %8.1f\n",
                   t == T_TCP ? bench_kind_name(kind) : "", tname[t], (double)pairs / s->secs,
                   t == T_TCP ? 1.0 : med, s->pa.p50, s->pa.p99, s->pa.p999, s->pr.p50,
                   s->pr.p99, s->pr.p999, s->client_cpu / (double)pairs,
                   s->server_cpu / (double)pairs);
        }
        const side *p = &sd[T_TCP], *q = &sd[T_TLS];
        json_t *row = json_object();
        json_object_set_new(row, "strategy", json_string(bench_kind_name(kind)));
        json_object_set_new(row, "pairs", json_integer(pairs));
        json_object_set_new(row, "tcp", side_json(p, pairs));
        json_object_set_new(row, "tls", side_json(q, pairs));
        json_object_set_new(row, "ratio_pairs_per_s", json_real(med));
        json_object_set_new(row, "round_ratios", rr);
        json_object_set_new(
            row, "ratio_latency",
            json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "acquire_p50",
                      ratio(q->pa.p50, p->pa.p50), "acquire_p99", ratio(q->pa.p99, p->pa.p99),
                      "acquire_p999", ratio(q->pa.p999, p->pa.p999), "release_p50",
                      ratio(q->pr.p50, p->pr.p50), "release_p99", ratio(q->pr.p99, p->pr.p99),
                      "release_p999", ratio(q->pr.p999, p->pr.p999), "pair_p50",
                      ratio(q->pp.p50, p->pp.p50), "pair_p99", ratio(q->pp.p99, p->pp.p99)));
        json_object_set_new(row, "added_us_pair_p50", json_real(q->pp.p50 - p->pp.p50));
        json_array_append_new(arr, row);
        fflush(stdout);
    }

    /* ratios */
    printf("\nTLS / TCP (pairs/s: median of the rounds' ratios; latency: TLS percentile / TCP "
           "percentile; CPU per pair: TLS / TCP)\n");
    printf("%-8s %8s | %8s %8s %8s | %8s %8s %8s | %8s %8s | %s\n", "strategy", "pairs/s",
           "acq p50", "p99", "p99.9", "rel p50", "p99", "p99.9", "cli cpu", "srv cpu",
           "pair p50 +us");
    bench_rule(112);
    size_t i;
    json_t *row;
    json_array_foreach(arr, i, row)
    {
        json_t *rl = json_object_get(row, "ratio_latency");
        json_t *p = json_object_get(row, "tcp"), *q = json_object_get(row, "tls");
#define N(o, k) json_number_value(json_object_get(o, k))
        printf("%-8s %8.3f | %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f | %8.2f %8.2f | %8.1f\n",
               json_string_value(json_object_get(row, "strategy")),
               N(row, "ratio_pairs_per_s"), N(rl, "acquire_p50"), N(rl, "acquire_p99"),
               N(rl, "acquire_p999"), N(rl, "release_p50"), N(rl, "release_p99"),
               N(rl, "release_p999"),
               ratio(N(q, "client_cpu_us_per_pair"), N(p, "client_cpu_us_per_pair")),
               ratio(N(q, "server_cpu_us_per_pair"), N(p, "server_cpu_us_per_pair")),
               N(row, "added_us_pair_p50"));
#undef N
    }
    fflush(stdout);
    json_object_set_new(out, "uncontended", arr);
}

/* ---------------------------------------------------------------- 2. connect */

static void run_connect(bench_ctx *ctx, bench_ctx *cx, json_t *out)
{
    bench_progress(ctx, "tls connect: %d clients per transport", CONNECTS);
    int64_t v[2][CONNECTS];
    for (int i = 0; i < CONNECTS; i++) {
        for (int step = 0; step < 2; step++) {
            int t = (step == 0) == (i % 2 == 0) ? T_TCP : T_TLS;
            redsem_client *c = NULL;
            char err[512] = "";
            int64_t t0 = bench_now_ns();
            int rc = bench_client_try(&cx[t], &c, err, sizeof err);
            v[t][i] = bench_now_ns() - t0;
            if (rc != REDSEM_OK)
                bench_die("tls: connect over %s: %s (%s)", tname[t], redsem_strerror(rc), err);
            redsem_client_free(c);
        }
    }
    bench_pct p[2];
    for (int t = 0; t < 2; t++)
        p[t] = bench_percentiles(v[t], CONNECTS);
    printf("\nconnect (redsem_client_new, %d per transport, interleaved), us: TCP p50 %.0f max "
           "%.0f; TLS p50 %.0f max %.0f; TLS / TCP p50 %.2f\n",
           CONNECTS, p[0].p50, p[0].max, p[1].p50, p[1].max, ratio(p[1].p50, p[0].p50));
    json_t *j = json_object();
    json_object_set_new(j, "tcp", bench_pct_json(&p[0]));
    json_object_set_new(j, "tls", bench_pct_json(&p[1]));
    json_object_set_new(j, "ratio_p50", json_real(ratio(p[1].p50, p[0].p50)));
    json_object_set_new(out, "connect", j);
    fflush(stdout);
}

/* ---------------------------------------------------------------- 3. threads */

enum { TM_TCP = T_TCP, TM_TLS = T_TLS, TM_EXIT = 2 };

typedef struct tgroup {
    bench_ctx *ctx;
    bench_ctx *cx;
    int kind;
    char names[TLS_THREADS][2][64];
    pthread_barrier_t start, end;
    _Atomic int stop;
    int mode;
    uint64_t count[TLS_THREADS];
} tgroup;

typedef struct tworker {
    tgroup *g;
    int idx;
    pthread_t th;
} tworker;

static void *tworker_main(void *arg)
{
    tworker *w = arg;
    tgroup *g = w->g;
    redsem_client *c[2];
    bench_handle h[2];
    for (int t = 0; t < 2; t++) {
        c[t] = bench_client(&g->cx[t]);
        check(bench_handle_open(c[t], g->kind, g->names[w->idx][t], 1, LEASE_MS, &h[t]), c[t],
              "open");
    }
    int64_t a, r;
    for (int i = 0; i < WARMUP_PAIRS / 4; i++)
        for (int t = 0; t < 2; t++)
            bench_lib_pair(&h[t], c[t], &a, &r);
    for (;;) {
        pthread_barrier_wait(&g->start);
        if (g->mode == TM_EXIT)
            break;
        int t = g->mode;
        uint64_t n = 0;
        while (!atomic_load_explicit(&g->stop, memory_order_relaxed)) {
            bench_lib_pair(&h[t], c[t], &a, &r);
            n++;
        }
        g->count[w->idx] = n;
        pthread_barrier_wait(&g->end);
    }
    for (int t = 0; t < 2; t++) {
        bench_handle_close(&h[t]);
        redsem_client_free(c[t]);
    }
    return NULL;
}

static double tbatch(tgroup *g, int mode, double secs)
{
    g->mode = mode;
    atomic_store(&g->stop, 0);
    pthread_barrier_wait(&g->start);
    int64_t t0 = bench_now_ns();
    bench_sleep_ns((int64_t)(secs * 1e9));
    atomic_store(&g->stop, 1);
    pthread_barrier_wait(&g->end);
    int64_t t1 = bench_now_ns();
    uint64_t total = 0;
    for (int i = 0; i < TLS_THREADS; i++)
        total += g->count[i];
    return (double)total / ((double)(t1 - t0) / 1e9);
}

static void run_threads(bench_ctx *ctx, bench_ctx *cx, json_t *out)
{
    const bench_opts *o = ctx->o;
    json_t *arr = json_array();
    printf("\n== tls, %d threads (each a TCP client and a TLS client, a semaphore each; never "
           "waits); %d rounds of a %.2f s batch per transport\n",
           TLS_THREADS, TLS_THREAD_ROUNDS, TLS_THREAD_SECS);
    printf("%-8s %7s | %10s %10s %8s | %s\n", "strategy", "threads", "TCP/s", "TLS/s", "x TCP",
           "per-round ratios");
    bench_rule(112);
    fflush(stdout);
    for (int kind = 0; kind < BENCH_NKINDS; kind++) {
        if (!o->kinds[kind])
            continue;
        bench_progress(ctx, "tls threads %s: %d threads, %d rounds", bench_kind_name(kind),
                       TLS_THREADS, TLS_THREAD_ROUNDS);
        tgroup *g = calloc(1, sizeof *g);
        tworker w[TLS_THREADS];
        if (g == NULL)
            bench_die("out of memory");
        g->ctx = ctx;
        g->cx = cx;
        g->kind = kind;
        pthread_barrier_init(&g->start, NULL, TLS_THREADS + 1);
        pthread_barrier_init(&g->end, NULL, TLS_THREADS + 1);
        for (int i = 0; i < TLS_THREADS; i++) {
            for (int t = 0; t < 2; t++)
                bench_name(ctx, "tls-t", g->names[i][t], sizeof g->names[i][t]);
            w[i].g = g;
            w[i].idx = i;
            if (pthread_create(&w[i].th, NULL, tworker_main, &w[i]) != 0)
                bench_die("pthread_create failed");
        }
        double sum[2] = {0, 0}, ratios[TLS_THREAD_ROUNDS];
        for (int r = 0; r < TLS_THREAD_ROUNDS; r++) {
            double v[2];
            for (int step = 0; step < 2; step++) {
                int t = (step == 0) == (r % 2 == 0) ? T_TCP : T_TLS;
                v[t] = tbatch(g, t, TLS_THREAD_SECS);
            }
            sum[0] += v[0];
            sum[1] += v[1];
            ratios[r] = ratio(v[T_TLS], v[T_TCP]);
        }
        g->mode = TM_EXIT;
        pthread_barrier_wait(&g->start);
        for (int i = 0; i < TLS_THREADS; i++)
            pthread_join(w[i].th, NULL);
        pthread_barrier_destroy(&g->start);
        pthread_barrier_destroy(&g->end);
        free(g);

        char rr[512] = "";
        json_t *jr = json_array();
        for (int i = 0; i < TLS_THREAD_ROUNDS; i++) {
            size_t l = strlen(rr);
            snprintf(rr + l, sizeof rr - l, "%s%.3f", i ? " " : "", ratios[i]);
            json_array_append_new(jr, json_real(ratios[i]));
        }
        double med = bench_median(ratios, TLS_THREAD_ROUNDS);
        printf("%-8s %7d | %10.0f %10.0f %8.3f | %s\n", bench_kind_name(kind), TLS_THREADS,
               sum[0] / TLS_THREAD_ROUNDS, sum[1] / TLS_THREAD_ROUNDS, med, rr);
        fflush(stdout);
        json_t *row = json_object();
        json_object_set_new(row, "strategy", json_string(bench_kind_name(kind)));
        json_object_set_new(row, "threads", json_integer(TLS_THREADS));
        json_object_set_new(row, "tcp_pairs_per_s", json_real(sum[0] / TLS_THREAD_ROUNDS));
        json_object_set_new(row, "tls_pairs_per_s", json_real(sum[1] / TLS_THREAD_ROUNDS));
        json_object_set_new(row, "ratio_pairs_per_s", json_real(med));
        json_object_set_new(row, "round_ratios", jr);
        json_array_append_new(arr, row);
        bench_cleanup(&cx[T_TCP], NULL);
    }
    json_object_set_new(out, "threads", arr);
}

/* ---------------------------------------------------------------- 4. a client's cost */

/* What one TLS client costs (CPU, heap), its TLS context and its one connection: a fresh
 * client made and pinged, CLIENT_ROUNDS times, measured with it alive: the process's CPU
 * (getrusage) and its heap in use (mallinfo2) from before redsem_client_new() to after the
 * ping. Two CA files: the test CA alone, and the system's CA bundle followed by the test CA
 * (what a client verifying against the system's CA certificates loads) when the system has
 * one. Medians of the rounds. */
#define CLIENT_ROUNDS 5
#define SYSTEM_CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"

static double process_cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* ca: the CA file; *cpu_us and *heap_kib per client, medians over the rounds; *conns the
 * connections the last round's client made. */
static void client_measure(bench_ctx *cx, const char *ca, double *cpu_us, double *heap_kib,
                           int *conns)
{
    double cpu[CLIENT_ROUNDS], heap[CLIENT_ROUNDS];
    for (int round = 0; round < CLIENT_ROUNDS; round++) {
        redsem_options *o = NULL;
        redsem_client *c = NULL;
        char err[512] = "";
        if (redsem_options_new(&o) != REDSEM_OK ||
            redsem_options_set_url(o, cx[T_TLS].url) != REDSEM_OK ||
            redsem_options_set_tls_ca(o, ca, NULL) != REDSEM_OK)
            bench_die("tls client: options");
        struct mallinfo2 m0 = mallinfo2();
        double c0 = process_cpu_us();
        int rc = redsem_client_new_verbose(o, &c, err, sizeof err);
        redsem_options_free(o);
        if (rc != REDSEM_OK)
            bench_die("tls client: connect: %s (%s)", redsem_err_name(rc), err);
        check(redsem_client_ping(c), c, "ping");
        double c1 = process_cpu_us();
        struct mallinfo2 m1 = mallinfo2();
        redsem_client_stats st;
        check(redsem_client_get_stats(c, &st), c, "stats");
        *conns = (int)st.connects;
        cpu[round] = c1 - c0;
        heap[round] = ((double)m1.uordblks - (double)m0.uordblks) / 1024.0;
        redsem_client_free(c);
    }
    *cpu_us = bench_median(cpu, CLIENT_ROUNDS);
    *heap_kib = bench_median(heap, CLIENT_ROUNDS);
}

static void run_client(bench_ctx *ctx, bench_ctx *cx, const char *dir, json_t *out)
{
    char bundle[400];
    snprintf(bundle, sizeof bundle, "%s/bundle.crt", dir);
    char cmd[1000];
    snprintf(cmd, sizeof cmd, "cat %s %s > %s 2>/dev/null", SYSTEM_CA_BUNDLE, cx[T_TLS].tls_ca,
             bundle);
    bool have_bundle = access(SYSTEM_CA_BUNDLE, R_OK) == 0 && system(cmd) == 0;
    printf("\n== tls client: what one TLS client costs, made and pinged, with it alive (its "
           "TLS context and its connection; medians of %d rounds)\n",
           CLIENT_ROUNDS);
    json_t *arr = json_array();
    for (int v = 0; v < (have_bundle ? 2 : 1); v++) {
        const char *ca = v == 0 ? cx[T_TLS].tls_ca : bundle;
        bench_progress(ctx, "tls client: %s", v == 0 ? "test CA" : "system bundle + test CA");
        double cpu = 0, heap = 0;
        int conns = 0;
        client_measure(cx, ca, &cpu, &heap, &conns);
        printf("  CA file %-26s: CPU %.0f us and heap %.0f KiB per client (%d connection%s)\n",
               v == 0 ? "test CA" : "system bundle + test CA", cpu, heap, conns,
               conns == 1 ? "" : "s");
        json_t *row = json_object();
        json_object_set_new(row, "ca", json_string(v == 0 ? "test" : "system+test"));
        json_object_set_new(row, "connections", json_integer(conns));
        json_object_set_new(row, "cpu_us_per_client", json_real(cpu));
        json_object_set_new(row, "heap_kib_per_client", json_real(heap));
        json_array_append_new(arr, row);
    }
    if (have_bundle)
        unlink(bundle);
    json_object_set_new(out, "client", arr);
    fflush(stdout);
}

/* ---------------------------------------------------------------- the workload */

void bench_run_tls(bench_ctx *ctx)
{
    const char *tmp = getenv("TMPDIR");
    char dir[256];
    snprintf(dir, sizeof dir, "%s/redsem-bench-tls-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL)
        bench_die("tls: mkdtemp: cannot make a temporary directory");
    bench_tempdir_track(dir, cert_files);
    bench_progress(ctx, "tls: certificates (openssl) in %s", dir);
    if (!make_certs(dir))
        bench_die("tls: making the certificates with the openssl command failed (is it "
                  "installed?)");

    static char port[16], cert[300], key[300], ca[300];
    snprintf(cert, sizeof cert, "%s/server.crt", dir);
    snprintf(key, sizeof key, "%s/server.key", dir);
    snprintf(ca, sizeof ca, "%s/ca.crt", dir);
    static const char *extra[] = {"--maxmemory-policy", "noeviction", "--tls-port", port,
                                  "--tls-cert-file", cert, "--tls-key-file", key,
                                  "--tls-ca-cert-file", ca, "--tls-auth-clients", "no", NULL};
    ts_server srv;
    int rc = -1;
    for (int attempt = 0; attempt < 3 && rc != 0; attempt++) {
        snprintf(port, sizeof port, "%d", ts_free_port());
        rc = bench_server_start(extra, true, ctx->server_cpu, &srv);
        if (rc == 77)
            bench_die("tls: redis-server not found");
    }
    if (rc != 0)
        bench_die("tls: could not start redis-server with a TLS port (built without TLS?)");

    bench_ctx cx[2];
    for (int t = 0; t < 2; t++) {
        cx[t] = *ctx;
        cx[t].tls_ca = t == T_TLS ? ca : NULL;
        cx[t].sync_replicas = 0;
    }
    snprintf(cx[T_TCP].url, sizeof cx[T_TCP].url, "redis://127.0.0.1:%d", srv.port);
    snprintf(cx[T_TLS].url, sizeof cx[T_TLS].url, "rediss://127.0.0.1:%s", port);
    char scpu[16] = "any";
    if (ctx->server_cpu >= 0)
        snprintf(scpu, sizeof scpu, "%d", ctx->server_cpu);
    printf("\n== tls: the library over TCP and over TLS (verified, a P-256 certificate; Redis's "
           "default TLS settings) to one private server on CPU %s, loopback; ratios TLS / TCP "
           "within this run\n",
           scpu);

    json_t *out = json_object();
    json_object_set_new(out, "server_cpu",
                        ctx->server_cpu >= 0 ? json_integer(ctx->server_cpu) : json_null());
    run_uncontended(ctx, cx, out);
    run_connect(ctx, cx, out);
    run_threads(ctx, cx, out);
    run_client(ctx, cx, dir, out);
    json_object_set_new(ctx->json, "tls", out);

    bench_server_stop(&srv);
    bench_tempdir_remove(dir);
}
