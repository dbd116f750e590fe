/* redsem-bench - the loops workload: one thread running libuv drives many concurrent
 * acquire-hold-release loops through the event-loop API (issue 10's target: 1,000 loops on
 * 100 semaphores).
 *
 * One client, one redsem_async attached to a libuv loop with redsem/adapters/libuv.h. M
 * semaphores (--loop-sems, default 100) of limit L (--limit, default 4); N loops (--loops,
 * default 1000), loop i on semaphore i mod M. Each loop: redsem_sem_acquire_async (timeout
 * 10 s) -> on its grant callback hold for --loop-hold ms (a uv timer; default 0: released from
 * the grant callback) -> redsem_permit_release_async -> on its callback the next acquire, until
 * --duration seconds have passed. With --loop-threads N the releases are started by N threads
 * of the bench instead (handed over through a queue): operations started off the loop's
 * thread, as async.h allows (for ThreadSanitizer runs; the callbacks stay on the loop).
 * Measured:
 *   grants/s    grants from the start to the last completion;
 *   max held    per semaphore, a permit counted as held from its grant callback until its
 *               release is requested; above L is a SAFETY VIOLATION (exit status 2);
 *   hand-off    per semaphore, the permits neither held nor taken by an acquire under way
 *               (L at the start): an acquire that begins while one is free takes it (it
 *               need not wait: its time is client-side queueing, the acquire's own figure,
 *               not a hand-off); one that begins when none is free waits. A release
 *               requested while acquires wait (more than the releases already queued for
 *               them) queues its time for them, else its permit is free again; a waiting
 *               acquire's grant takes the oldest release queued and records grant - that
 *               release as a hand-off (basic: a waiter that barges ahead takes the oldest
 *               one too). "hand n" says how many were recorded (with no hold, few: the
 *               semaphores are rarely full). (Before 0.7 a grant took a free permit only
 *               when it came, so an acquire begun before the grant of a release's earlier
 *               waiter seemed not to wait: few hand-offs were recorded, none for fair);
 *   acquire     from the acquire's start to its grant callback;
 *   max gap     the longest time between two consecutive callbacks (redsem's or the hold
 *               timers') while loops still start (until --duration): how long the loop went
 *               without running anything;
 *   threads     the most threads of the process (/proc/self/status), sampled every 100 ms
 *               from the callbacks: the loop's own thread, and those redsem runs for it
 *               (its event-loop API's workers: none on the loop engine, the default);
 *               connects and pool waits are redsem_client_get_stats(), cumulative;
 *   direct      the share of grants that a wake-up carried (fair and locked direct grants,
 *               redsem_client_stats.direct_grants), taken with no attempt after it.
 * With --renew every permit goes under automatic renewal in its grant callback, renewed every
 * LOOPS_RENEW_MS (so that holds of a few ms have renewals in flight at their release); the
 * renewer's counters are printed (on the loop engine, renewals run on the loop itself).
 * Without libuv at build time the workload says so and measures nothing. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifdef BENCH_HAVE_UV
#include <uv.h>

#include <redsem/adapters/libuv.h>

#define LOOPS_LEASE_MS 10000
#define LOOPS_WAIT_MS 10000
#define LOOPS_RENEW_MS 5

struct lrun;

typedef struct lsem {
    redsem_sem *sem;
    int held, max_held;
    int free;        /* permits neither held nor taken by an acquire under way */
    int waiting;     /* acquires begun when none was free, not granted yet */
    int64_t *rel_t;  /* ring of the times of the releases queued for those acquires */
    size_t head, count, cap;
} lsem;

typedef struct lloop {
    struct lrun *run;
    int sem;
    int64_t started_ns;
    bool waited; /* no permit of its semaphore was free when its acquire began */
    redsem_permit *permit;
    uv_timer_t hold;
} lloop;

typedef struct lrun {
    redsem_async *a;
    lsem *sems;
    lloop *loops;
    uint32_t limit;
    double hold_min, hold_max;
    bool renew;
    uint64_t rng;
    int64_t stop_ns, last_cb_ns, max_gap_ns, last_done_ns;
    int64_t threads_ns; /* threads last sampled then */
    int max_threads;
    int active;
    long grants, errors, violations;
    bench_samples handoff, acq;
    /* --loop-threads: loops whose release the threads start (a ring of nloops) */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    lloop **q;
    size_t qhead, qlen, qcap;
    bool qstop;
} lrun;

/* The threads of this process now (Threads: of /proc/self/status; 0 if unknown). */
static int threads_now(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[128];
    int n = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return n;
}

/* A callback ran: the gap since the previous one counts while loops still start (the end's
 * last holds, with nothing else to run, are not a stall). */
static void tick(lrun *r)
{
    int64_t now = bench_now_ns();
    if (r->last_cb_ns && now < r->stop_ns && now - r->last_cb_ns > r->max_gap_ns)
        r->max_gap_ns = now - r->last_cb_ns;
    r->last_cb_ns = now;
    if (now - r->threads_ns >= 100 * 1000000LL) {
        r->threads_ns = now;
        int n = threads_now();
        if (n > r->max_threads)
            r->max_threads = n;
    }
}

static void loop_start(lloop *l);

static void released(redsem_async *a, const redsem_result *res, void *user)
{
    (void)a;
    lloop *l = user;
    lrun *r = l->run;
    tick(r);
    redsem_permit_free(l->permit);
    l->permit = NULL;
    if (res->rc != REDSEM_OK && r->errors++ < 3)
        fprintf(stderr, "loops: release: %s (%s)\n", redsem_err_name(res->rc), res->errmsg);
    loop_start(l);
}

static void release_now(lloop *l)
{
    lrun *r = l->run;
    lsem *s = &r->sems[l->sem];
    s->held--;
    if ((size_t)s->waiting > s->count && s->count < s->cap)
        s->rel_t[(s->head + s->count++) % s->cap] = bench_now_ns(); /* for a waiter */
    else
        s->free++;
    if (r->q != NULL) { /* a thread of the bench starts it */
        pthread_mutex_lock(&r->qmu);
        r->q[(r->qhead + r->qlen++) % r->qcap] = l;
        pthread_cond_signal(&r->qcv);
        pthread_mutex_unlock(&r->qmu);
        return;
    }
    int rc = redsem_permit_release_async(r->a, l->permit, released, l, NULL);
    if (rc != REDSEM_OK) {
        fprintf(stderr, "loops: release not started: %s\n", redsem_err_name(rc));
        redsem_permit_free(l->permit);
        l->permit = NULL;
        r->errors++;
        r->active--;
    }
}

/* --loop-threads: start the releases handed over, until told to stop. */
static void *release_thread(void *arg)
{
    lrun *r = arg;
    pthread_mutex_lock(&r->qmu);
    for (;;) {
        while (r->qlen == 0 && !r->qstop)
            pthread_cond_wait(&r->qcv, &r->qmu);
        if (r->qlen == 0)
            break;
        lloop *l = r->q[r->qhead];
        r->qhead = (r->qhead + 1) % r->qcap;
        r->qlen--;
        pthread_mutex_unlock(&r->qmu);
        int rc = redsem_permit_release_async(r->a, l->permit, released, l, NULL);
        if (rc != REDSEM_OK)
            bench_die("loops: release not started from a thread: %s", redsem_err_name(rc));
        pthread_mutex_lock(&r->qmu);
    }
    pthread_mutex_unlock(&r->qmu);
    return NULL;
}

static void hold_done(uv_timer_t *t)
{
    lloop *l = t->data;
    tick(l->run);
    release_now(l);
}

static void acquired(redsem_async *a, const redsem_result *res, void *user)
{
    (void)a;
    lloop *l = user;
    lrun *r = l->run;
    tick(r);
    lsem *s = &r->sems[l->sem];
    if (res->rc != REDSEM_OK) {
        if (r->errors++ < 3)
            fprintf(stderr, "loops: acquire: %s (%s)\n", redsem_err_name(res->rc), res->errmsg);
        if (l->waited)
            s->waiting--;
        if (!l->waited || s->count > (size_t)s->waiting) { /* its permit, or a release's */
            if (l->waited) {
                s->head = (s->head + 1) % s->cap;
                s->count--;
            }
            s->free++;
        }
        loop_start(l);
        return;
    }
    int64_t now = bench_now_ns();
    r->grants++;
    if (++s->held > s->max_held)
        s->max_held = s->held;
    if (s->held > (int)r->limit)
        r->violations++;
    if (l->waited) {
        s->waiting--;
        if (s->count > 0) {
            int64_t t = s->rel_t[s->head];
            s->head = (s->head + 1) % s->cap;
            s->count--;
            samples_add(&r->handoff, now - t);
        }
    }
    samples_add(&r->acq, now - l->started_ns);
    l->permit = res->permit;
    int rc = r->renew ? redsem_permit_auto_renew(l->permit, LOOPS_RENEW_MS, NULL, NULL) : 0;
    if (rc != REDSEM_OK && r->errors++ < 3)
        fprintf(stderr, "loops: auto_renew: %s\n", redsem_err_name(rc));
    double ms = r->hold_min;
    if (r->hold_max > r->hold_min)
        ms += (r->hold_max - r->hold_min) * (double)(bench_rand(&r->rng) % 1000001) / 1e6;
    if (ms < 0.5) {
        release_now(l);
        return;
    }
    uv_timer_start(&l->hold, hold_done, (uint64_t)(ms + 0.5), 0);
}

static void loop_start(lloop *l)
{
    lrun *r = l->run;
    int64_t now = bench_now_ns();
    if (now >= r->stop_ns) {
        r->active--;
        r->last_done_ns = now;
        return;
    }
    l->started_ns = now;
    lsem *s = &r->sems[l->sem];
    l->waited = s->free == 0;
    if (l->waited)
        s->waiting++;
    else
        s->free--;
    int rc = redsem_sem_acquire_async(r->a, r->sems[l->sem].sem, 1, LOOPS_WAIT_MS, acquired, l,
                                      NULL);
    if (rc != REDSEM_OK) {
        fprintf(stderr, "loops: acquire not started: %s\n", redsem_err_name(rc));
        r->errors++;
        r->active--;
    }
}

static void check(int rc, redsem_client *c, const char *what)
{
    if (rc != REDSEM_OK)
        bench_die("loops: %s: %s (%s)", what, redsem_err_name(rc), redsem_client_errmsg(c));
}

static void closed(uv_handle_t *h)
{
    (void)h;
}

static json_t *run_kind(bench_ctx *ctx, int kind)
{
    const bench_opts *o = ctx->o;
    int nloops = o->loops, nsems = o->loop_sems;
    bench_progress(ctx, "loops %s: %d loops on %d semaphores of limit %u", bench_kind_name(kind),
                   nloops, nsems, o->limit);
    redsem_client *c = bench_client(ctx);
    uv_loop_t uv;
    if (uv_loop_init(&uv) != 0)
        bench_die("loops: uv_loop_init failed");
    lrun r = {.limit = o->limit, .hold_min = o->loop_hold_min_ms,
              .hold_max = o->loop_hold_max_ms, .renew = o->renew, .rng = bench_seed()};
    samples_init(&r.handoff);
    samples_init(&r.acq);
    check(redsem_async_new(c, &r.a), c, "redsem_async_new");
    check(redsem_uv_attach(r.a, &uv), c, "redsem_uv_attach");
    r.sems = calloc((size_t)nsems, sizeof *r.sems);
    r.loops = calloc((size_t)nloops, sizeof *r.loops);
    char (*names)[64] = calloc((size_t)nsems, sizeof *names);
    if (r.sems == NULL || r.loops == NULL || names == NULL)
        bench_die("loops: out of memory");
    for (int i = 0; i < nsems; i++) {
        bench_name(ctx, "loops", names[i], sizeof names[i]);
        bench_handle h;
        check(bench_handle_open(c, kind, names[i], o->limit, LOOPS_LEASE_MS, &h), c, "open");
        r.sems[i].sem = h.sem;
        r.sems[i].cap = (size_t)nloops + 1; /* at most one release queued per waiter */
        r.sems[i].rel_t = calloc(r.sems[i].cap, sizeof *r.sems[i].rel_t);
        if (r.sems[i].rel_t == NULL)
            bench_die("loops: out of memory");
        r.sems[i].free = (int)o->limit;
        if (i == 0) {               /* the scripts loaded before the clock starts */
            redsem_permit *p = NULL;
            check(redsem_sem_acquire(h.sem, 5000, &p), c, "warm-up acquire");
            check(redsem_permit_release(p), c, "warm-up release");
            redsem_permit_free(p);
        }
    }
    for (int i = 0; i < nloops; i++) {
        r.loops[i].run = &r;
        r.loops[i].sem = i % nsems;
        uv_timer_init(&uv, &r.loops[i].hold);
        r.loops[i].hold.data = &r.loops[i];
    }
    redsem_client_stats st0;
    check(redsem_client_get_stats(c, &st0), c, "stats");
    int64_t t0 = bench_now_ns();
    r.stop_ns = t0 + (int64_t)(o->duration * 1e9);
    r.active = nloops;
    pthread_t threads[BENCH_LOOP_THREADS_MAX];
    if (o->loop_threads > 0) {
        pthread_mutex_init(&r.qmu, NULL);
        pthread_cond_init(&r.qcv, NULL);
        r.qcap = (size_t)nloops;
        r.q = calloc(r.qcap, sizeof *r.q);
        if (r.q == NULL)
            bench_die("loops: out of memory");
        for (int i = 0; i < o->loop_threads; i++)
            if (pthread_create(&threads[i], NULL, release_thread, &r) != 0)
                bench_die("loops: pthread_create failed");
    }
    for (int i = 0; i < nloops; i++)
        loop_start(&r.loops[i]);
    while (r.active > 0)
        uv_run(&uv, UV_RUN_ONCE);
    if (r.q != NULL) {
        pthread_mutex_lock(&r.qmu);
        r.qstop = true;
        pthread_cond_broadcast(&r.qcv);
        pthread_mutex_unlock(&r.qmu);
        for (int i = 0; i < o->loop_threads; i++)
            pthread_join(threads[i], NULL);
        free(r.q);
        pthread_cond_destroy(&r.qcv);
        pthread_mutex_destroy(&r.qmu);
    }
    double secs = (double)(r.last_done_ns - t0) / 1e9;
    redsem_client_stats st;
    check(redsem_client_get_stats(c, &st), c, "stats");
    redsem_renew_stats rs; /* before the free: a loop's renewer counts while its loop runs */
    check(redsem_client_renew_stats(c, &rs), c, "renew stats");

    redsem_async_free(r.a);
    for (int i = 0; i < nloops; i++)
        uv_close((uv_handle_t *)&r.loops[i].hold, closed);
    uv_run(&uv, UV_RUN_DEFAULT);
    if (uv_loop_close(&uv) != 0)
        fprintf(stderr, "loops: uv_loop_close: handles still open\n");

    int max_held = 0;
    for (int i = 0; i < nsems; i++) {
        if (r.sems[i].max_held > max_held)
            max_held = r.sems[i].max_held;
        redsem_sem_free(r.sems[i].sem);
        free(r.sems[i].rel_t);
        bench_cleanup(ctx, names[i]);
    }
    bench_pct ho = bench_percentiles(r.handoff.v, r.handoff.n);
    bench_pct aq = bench_percentiles(r.acq.v, r.acq.n);
    double gps = secs > 0 ? r.grants / secs : 0;
    uint64_t direct = st.direct_grants - st0.direct_grants;
    printf("  %-8s %9.0f %7ld %5d%s %7zu %9.3f %9.3f %9.2f %9.2f %8.1f %9llu %10llu %7.1f %7d\n",
           bench_kind_name(kind), gps, r.errors, max_held,
           r.violations ? " SAFETY VIOLATION" : "", ho.n, ho.p50 / 1e3, ho.p99 / 1e3, aq.p50 / 1e3,
           aq.p99 / 1e3, (double)r.max_gap_ns / 1e6,
           (unsigned long long)(st.connects - st0.connects),
           (unsigned long long)(st.pool_waits - st0.pool_waits),
           r.grants > 0 ? 100.0 * (double)direct / (double)r.grants : 0.0, r.max_threads);
    if (r.renew)
        printf("  %-8s renewals %llu, failed %llu, lost %llu\n", bench_kind_name(kind),
               (unsigned long long)rs.renewals, (unsigned long long)rs.failures,
               (unsigned long long)(rs.lost_expired + rs.lost_deadline));
    if (r.violations)
        ctx->exit_code = 2;
    json_t *row = json_pack(
        "{s:s, s:i, s:i, s:i, s:f, s:f, s:I, s:I, s:i, s:I, s:o, s:o, s:f, s:I, s:I, s:I, s:i}",
        "strategy",
        bench_kind_name(kind), "loops", nloops, "semaphores", nsems, "limit", (int)o->limit,
        "secs", secs, "grants_per_s", gps, "grants", (json_int_t)r.grants, "errors",
        (json_int_t)r.errors, "max_held", max_held, "violations", (json_int_t)r.violations,
        "handoff", bench_pct_json(&ho), "acquire", bench_pct_json(&aq), "max_gap_ms",
        (double)r.max_gap_ns / 1e6, "connects", (json_int_t)(st.connects - st0.connects),
        "pool_waits", (json_int_t)(st.pool_waits - st0.pool_waits), "direct_grants",
        (json_int_t)direct, "threads", r.max_threads);
    if (r.renew)
        json_object_set_new(row, "renewals", json_integer((json_int_t)rs.renewals));
    samples_free(&r.handoff);
    samples_free(&r.acq);
    free(r.loops);
    free(r.sems);
    free(names);
    redsem_client_free(c);
    return row;
}
#endif

void bench_run_loops(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
#ifndef BENCH_HAVE_UV
    (void)o;
    printf("\n== loops: not built (redsem-bench was built without libuv: apt-get install "
           "libuv1-dev, then reconfigure)\n");
    json_object_set_new(ctx->json, "loops", json_pack("{s:b}", "built", 0));
#else
    printf("\n== loops: one thread running libuv drives %d acquire-hold-release loops on %d "
           "semaphores of limit %u (hold %g-%g ms; releases started by %d other threads), one "
           "client, %.1f s per strategy\n",
           o->loops, o->loop_sems, o->limit, o->loop_hold_min_ms, o->loop_hold_max_ms,
           o->loop_threads, o->duration);
    printf("  %-8s %9s %7s %5s %7s %9s %9s %9s %9s %8s %9s %10s %7s %7s\n", "strategy",
           "grants/s", "errors", "held", "hand n", "hand p50", "p99 ms", "acq p50", "p99 ms",
           "gap ms", "connects", "pool waits", "direct", "threads");
    bench_rule(128);
    json_t *rows = json_array();
    static const int kinds[] = {BENCH_BASIC, BENCH_FAIR, BENCH_LOCKED};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
        if (o->kinds[kinds[k]])
            json_array_append_new(rows, run_kind(ctx, kinds[k]));
    printf("  (held: the most permits of one semaphore held at once, counted from the grant "
           "callback until the release is requested; hand: grants to acquires that began "
           "when no permit was free, from the release that freed theirs; gap: the longest "
           "time between two callbacks on the loop; direct: %% of grants a wake-up carried, "
           "with no attempt after it; threads: the most the process had)\n");
    json_object_set_new(ctx->json, "loops", rows);
#endif
}
