/* redsem-bench - the async workload: the event-loop API (redsem/async.h) driven by a plain
 * poll() loop on the bench's thread.
 *
 * 1. Uncontended throughput: one client, one redsem_async, a basic and a fair semaphore of a
 *    large limit; D operations in flight (D = 1, 16, 64): each acquire (try-acquire, timeout
 *    0) completion starts its release, each release completion starts a new acquire, for
 *    --duration / 10 seconds per D. Reported: acquire+release pairs/s, and the ratio to the
 *    floor of the same kind measured right before or after (alternating) in a batch of the
 *    same length: bench_floor, one raw hiredis connection making the same round trips with a
 *    trivial script, pair after pair (the floor of the uncontended workload). The floor is
 *    sequential: a ratio above 1 at D > 1 is the overlap the worker threads buy.
 * 2. Contended hand-off: a fair semaphore of limit 2 held by the bench (2 blocking acquires),
 *    ASYNC_WAITERS async acquires (timeout ASYNC_WAIT_MS) queued behind it, then the two
 *    permits released: each grant callback requests its release at once. Reported: grants/s
 *    (from the releases of the first two permits to the last grant callback), errors, and the
 *    most permits held at once, counting a permit as held from its grant callback until its
 *    release is requested (the bench's two from their acquire until their release is
 *    requested); more than 2 is a SAFETY VIOLATION (exit status 2). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define ASYNC_LIMIT 100000
#define ASYNC_LEASE_MS 10000
#define ASYNC_WARMUP 100
#define ASYNC_WAITERS 32
#define ASYNC_WAIT_MS 5000
#define ASYNC_ROUNDS 3 /* contended rounds */
#define ASYNC_MAX_D 64

static const int depths[] = {1, 16, 64};
#define NDEPTHS ((int)(sizeof depths / sizeof *depths))

/* ---------------------------------------------------------------- the poll() loop */
typedef struct aloop {
    redsem_async *a;
    int fd; /* what socket_fn asked for; -1: nothing */
} aloop;

static void loop_socket(redsem_async *a, int fd, int what, void *data)
{
    aloop *l = data;
    (void)a;
    l->fd = (what & REDSEM_WATCH_REMOVE) ? -1 : fd;
}

/* One turn: wait up to timeout_ms for completions, run their callbacks. */
static void loop_once(aloop *l, int timeout_ms)
{
    struct pollfd p = {l->fd, POLLIN, 0};
    int n = poll(&p, l->fd >= 0 ? 1 : 0, timeout_ms);
    if (n > 0 && (p.revents & POLLIN)) {
        int rc = redsem_async_action(l->a, l->fd, REDSEM_WATCH_IN);
        if (rc < 0)
            bench_die("async: redsem_async_action: %s", redsem_err_name(rc));
    }
}

static void check(int rc, redsem_client *c, const char *what)
{
    if (rc != REDSEM_OK)
        bench_die("async: %s: %s (%s)", what, redsem_err_name(rc), redsem_client_errmsg(c));
}

/* ---------------------------------------------------------------- 1. throughput */
typedef struct tput {
    redsem_async *a;
    redsem_client *c;
    redsem_sem *sem;
    int64_t stop_ns; /* no new acquire after this */
    int active;      /* chains still running */
    long pairs;
    long errors;
    long starts; /* warm-up: pairs to make in all, 0: until stop_ns */
} tput;

static void tput_acquired(redsem_async *a, const redsem_result *r, void *user);

static void tput_start(tput *t)
{
    bool more = t->starts > 0 ? t->pairs + t->active <= t->starts : bench_now_ns() < t->stop_ns;
    if (!more) {
        t->active--;
        return;
    }
    int rc = redsem_sem_acquire_async(t->a, t->sem, 1, 0, tput_acquired, t, NULL);
    if (rc != REDSEM_OK) {
        fprintf(stderr, "async: acquire not started: %s\n", redsem_err_name(rc));
        t->errors++;
        t->active--;
    }
}

typedef struct rel_ctx {
    tput *t;
    redsem_permit *p;
} rel_ctx;

static void tput_released(redsem_async *a, const redsem_result *r, void *user)
{
    (void)a;
    rel_ctx *rc = user;
    tput *t = rc->t;
    redsem_permit_free(rc->p);
    free(rc);
    if (r->rc == REDSEM_OK) {
        t->pairs++;
    } else if (t->errors++ < 3) {
        fprintf(stderr, "async: release: %s (%s)\n", redsem_err_name(r->rc), r->errmsg);
    }
    tput_start(t);
}

static void tput_acquired(redsem_async *a, const redsem_result *r, void *user)
{
    tput *t = user;
    if (r->rc != REDSEM_OK) {
        if (t->errors++ < 3)
            fprintf(stderr, "async: try-acquire: %s (%s)\n", redsem_err_name(r->rc), r->errmsg);
        tput_start(t);
        return;
    }
    rel_ctx *rc = malloc(sizeof *rc);
    if (rc == NULL)
        bench_die("async: out of memory");
    rc->t = t;
    rc->p = r->permit;
    int s = redsem_permit_release_async(a, r->permit, tput_released, rc, NULL);
    if (s != REDSEM_OK) {
        fprintf(stderr, "async: release not started: %s\n", redsem_err_name(s));
        redsem_permit_free(rc->p);
        free(rc);
        t->errors++;
        tput_start(t);
    }
}

/* Runs D chains until stop_ns (or, warmup > 0, for that many pairs); returns the seconds
 * from the start to the last completion. */
static double tput_run(aloop *l, tput *t, int d, double secs, long warmup)
{
    t->pairs = t->errors = 0;
    t->starts = warmup;
    t->active = d;
    int64_t t0 = bench_now_ns();
    t->stop_ns = t0 + (int64_t)(secs * 1e9);
    for (int i = 0; i < d; i++)
        tput_start(t); /* counts itself out when it does not start */
    while (t->active > 0)
        loop_once(l, 100);
    return (double)(bench_now_ns() - t0) / 1e9;
}

static double floor_batch(bench_floor *f, double secs, long *pairs)
{
    int64_t t0 = bench_now_ns(), stop = t0 + (int64_t)(secs * 1e9), now;
    long n = 0;
    do {
        if (bench_floor_acquire(f) != 0 || bench_floor_release(f) != 0)
            bench_die("async: floor pair failed");
        n++;
    } while ((now = bench_now_ns()) < stop);
    *pairs = n;
    return (double)(now - t0) / 1e9;
}

/* ---------------------------------------------------------------- 2. hand-off */
typedef struct handoff {
    redsem_async *a;
    int held, max_held;
    int granted, errors, done;
    int64_t last_grant_ns;
} handoff;

static void handoff_released(redsem_async *a, const redsem_result *r, void *user)
{
    (void)a;
    handoff *h = ((void **)user)[0];
    redsem_permit_free(((void **)user)[1]);
    free(user);
    if (r->rc != REDSEM_OK) {
        h->errors++;
        fprintf(stderr, "async: hand-off release: %s (%s)\n", redsem_err_name(r->rc),
                r->errmsg);
    }
    h->done++;
}

static void handoff_granted(redsem_async *a, const redsem_result *r, void *user)
{
    handoff *h = user;
    if (r->rc != REDSEM_OK) {
        h->errors++;
        h->done++;
        fprintf(stderr, "async: hand-off acquire: %s (%s)\n", redsem_err_name(r->rc), r->errmsg);
        return;
    }
    h->granted++;
    h->last_grant_ns = bench_now_ns();
    if (++h->held > h->max_held)
        h->max_held = h->held;
    /* held until the release is requested, here and now */
    h->held--;
    void **pair = malloc(2 * sizeof *pair);
    if (pair == NULL)
        bench_die("async: out of memory");
    pair[0] = h;
    pair[1] = r->permit;
    int rc = redsem_permit_release_async(a, r->permit, handoff_released, pair, NULL);
    if (rc != REDSEM_OK) {
        fprintf(stderr, "async: hand-off release not started: %s\n", redsem_err_name(rc));
        redsem_permit_free(r->permit);
        free(pair);
        h->errors++;
        h->done++;
    }
}

/* ---------------------------------------------------------------- the workload */
void bench_run_async(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    double secs = o->duration / 10;
    static const int kinds[] = {BENCH_BASIC, BENCH_FAIR};
    json_t *jt = json_array();

    printf("\n== async: the event-loop API on a poll() loop, one client, one redsem_async; "
           "D try-acquire+release chains in flight, %.2f s per batch\n",
           secs);
    printf("   floor: bench_floor, one raw hiredis connection, the same round trips with "
           "\"return 1\", pair after pair (as uncontended), in a batch of the same length\n");
    printf("  %-8s %4s %10s %10s %8s %7s %9s %10s\n", "strategy", "D", "pairs/s", "floor/s",
           "x floor", "errors", "connects", "pool waits");
    bench_rule(74);
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        int kind = kinds[k];
        if (!o->kinds[kind])
            continue;
        char name[64];
        bench_name(ctx, "async", name, sizeof name);
        bench_progress(ctx, "async %s: D = 1, 16, 64", bench_kind_name(kind));
        redsem_client *c = bench_client(ctx);
        bench_handle h;
        check(bench_handle_open(c, kind, name, ASYNC_LIMIT, ASYNC_LEASE_MS, &h), c, "open");
        redsem_async *a = NULL;
        check(redsem_async_new(c, &a), c, "redsem_async_new");
        aloop l = {a, -1};
        check(redsem_async_set_loop(a, loop_socket, NULL, &l), c, "redsem_async_set_loop");
        bench_floor *f = bench_floor_new(ctx, kind, name);
        tput t = {.a = a, .c = c, .sem = h.sem};
        tput_run(&l, &t, 1, 0, ASYNC_WARMUP); /* scripts loaded, a worker started */
        long fdummy;
        floor_batch(f, 0.02, &fdummy);
        for (int di = 0; di < NDEPTHS; di++) {
            int d = depths[di];
            double lib_s = 0, floor_s = 0;
            long floor_pairs = 0, lib_pairs = 0, lib_errors = 0;
            for (int step = 0; step < 2; step++) {
                bool lib = (step == 0) == (di % 2 == 1);
                if (lib) {
                    lib_s = tput_run(&l, &t, d, secs, 0);
                    lib_pairs = t.pairs;
                    lib_errors = t.errors;
                } else {
                    floor_s = floor_batch(f, secs, &floor_pairs);
                }
            }
            redsem_client_stats st;
            check(redsem_client_get_stats(c, &st), c, "stats");
            double lps = lib_pairs / lib_s, fps = floor_pairs / floor_s;
            printf("  %-8s %4d %10.0f %10.0f %8.2f %7ld %9llu %10llu\n", bench_kind_name(kind),
                   d, lps, fps, fps > 0 ? lps / fps : 0, lib_errors,
                   (unsigned long long)st.connects, (unsigned long long)st.pool_waits);
            json_t *row = json_pack("{s:s, s:i, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:I}",
                                    "strategy", bench_kind_name(kind), "depth", d,
                                    "secs", lib_s, "pairs_per_s", lps, "floor_pairs_per_s",
                                    fps, "ratio_to_floor", fps > 0 ? lps / fps : 0, "errors",
                                    (json_int_t)lib_errors, "pairs", (json_int_t)lib_pairs,
                                    "connects", (json_int_t)st.connects, "pool_waits",
                                    (json_int_t)st.pool_waits);
            json_array_append_new(jt, row);
        }
        redsem_async_free(a);
        bench_floor_free(f);
        bench_handle_close(&h);
        redsem_client_free(c);
        bench_cleanup(ctx, name);
    }
    printf("  (connects, pool waits: redsem_client_get_stats() of the one client, cumulative; "
           "the stats do not expose the connections open now)\n");

    /* ------------------------------------------------------------ hand-off */
    printf("\n== async hand-off: fair semaphore of limit 2 held by the bench, %d async "
           "acquires waiting (timeout %d ms), each released from its grant callback; %d "
           "rounds\n",
           ASYNC_WAITERS, ASYNC_WAIT_MS, ASYNC_ROUNDS);
    bench_progress(ctx, "async hand-off: %d rounds of %d waiters", ASYNC_ROUNDS, ASYNC_WAITERS);
    char name[64];
    bench_name(ctx, "async-h", name, sizeof name);
    redsem_client *c = bench_client(ctx);
    bench_handle h;
    check(bench_handle_open(c, BENCH_FAIR, name, 2, ASYNC_LEASE_MS, &h), c, "open");
    redsem_async *a = NULL;
    check(redsem_async_new(c, &a), c, "redsem_async_new");
    aloop l = {a, -1};
    check(redsem_async_set_loop(a, loop_socket, NULL, &l), c, "redsem_async_set_loop");
    handoff ho = {.a = a};
    int64_t handoff_ns = 0;
    int not_queued = 0;
    for (int round = 0; round < ASYNC_ROUNDS; round++) {
        redsem_permit *mine[2] = {NULL, NULL};
        for (int i = 0; i < 2; i++) {
            check(redsem_sem_acquire(h.sem, 5000, &mine[i]), c, "hand-off: hold");
            if (++ho.held > ho.max_held)
                ho.max_held = ho.held;
        }
        int done0 = ho.done;
        for (int i = 0; i < ASYNC_WAITERS; i++)
            check(redsem_sem_acquire_async(a, h.sem, 1, ASYNC_WAIT_MS, handoff_granted, &ho,
                                           NULL),
                  c, "hand-off: acquire_async");
        /* until all of them wait on the server (at most 2 s) */
        int64_t until = bench_now_ns() + 2000000000LL;
        size_t waiting = 0;
        while (bench_now_ns() < until) {
            loop_once(&l, 5);
            redsem_status *s = NULL;
            check(redsem_sem_status(h.sem, 0, &s), c, "hand-off: status");
            waiting = redsem_status_waiter_count(s);
            redsem_status_free(s);
            if (waiting >= ASYNC_WAITERS)
                break;
        }
        if (waiting < ASYNC_WAITERS)
            not_queued++;
        int64_t t0 = bench_now_ns();
        for (int i = 0; i < 2; i++) {
            ho.held--; /* from its release request on */
            check(redsem_permit_release(mine[i]), c, "hand-off: release");
            redsem_permit_free(mine[i]);
        }
        /* every acquire and its release completed */
        while (ho.done - done0 < ASYNC_WAITERS)
            loop_once(&l, 100);
        handoff_ns += ho.last_grant_ns - t0;
    }
    redsem_async_free(a);
    bench_handle_close(&h);
    redsem_client_free(c);
    bench_cleanup(ctx, name);
    int expected = ASYNC_ROUNDS * ASYNC_WAITERS;
    double gps = handoff_ns > 0 ? ho.granted / ((double)handoff_ns / 1e9) : 0;
    printf("  %8s %8s %10s %7s %9s\n", "granted", "of", "grants/s", "errors", "max held");
    bench_rule(48);
    printf("  %8d %8d %10.0f %7d %9d%s\n", ho.granted, expected, gps, ho.errors, ho.max_held,
           not_queued ? "  (not every waiter was queued before the releases)" : "");
    printf("  (held: from the grant callback until the release is requested)\n");
    if (ho.max_held > 2) {
        printf("SAFETY VIOLATION: %d permits of a limit of 2 held at once\n", ho.max_held);
        ctx->exit_code = 2;
    }
    json_t *jh = json_pack("{s:i, s:i, s:i, s:i, s:i, s:f, s:i, s:i, s:i}", "limit", 2,
                           "waiters", ASYNC_WAITERS, "rounds", ASYNC_ROUNDS, "granted",
                           ho.granted, "expected", expected, "grants_per_s", gps, "errors",
                           ho.errors, "max_held", ho.max_held, "rounds_not_all_queued",
                           not_queued);
    json_t *r = json_object();
    json_object_set_new(r, "throughput", jt);
    json_object_set_new(r, "handoff", jh);
    json_object_set_new(ctx->json, "async", r);
}
