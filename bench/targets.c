/* redsem-bench - the targets workload (-w targets): what the targets of issue 25 need, and
 * nothing else, run --target-reps times (default 3) against one server.
 *
 * Each repetition runs, with the parameters (whatever -s, --threads, --clients,
 * --limit, --hold, --loops, --loop-sems, --loop-hold, --shared and --renew say; the transport,
 * affinity, --max-connections, --pairs, --rounds, --duration and --no-slowlog are honoured):
 *   threads      ONE client shared by 32 threads, each thread its own semaphore, 5 rounds
 *                of 0.4 s batches against the per-thread floor, for basic, fair and locked,
 *                each followed at once by
 *   loops        1,000 loops on 100 semaphores of limit 4 on one libuv thread, no hold, of
 *                the same strategy (their ratio is taken over the same few seconds);
 *   threads      the same with 8 threads (basic); 32 threads, basic, every permit renewed
 *                (--renew: conns);
 *   loops        the same with a 20-40 ms hold, basic, fair, locked (the threads the library
 *                starts: the most of the loops' "threads", less the loop's own thread);
 *   contended    32 threads on one shared client, one semaphore of limit 4, hold 1-5 ms,
 *                basic, fair, locked;
 *   uncontended  basic, one client (the pair over its floor).
 * Every sub-run prints its usual table; its JSON is kept per repetition. A target's value in
 * one repetition is a figure of that repetition (a ratio of two figures measured in it); the
 * printed value is the median of the repetitions', their range in the table before:
 *   target: <what> = <value> (<goal>) met|MISSED */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define MAX_REPS 15
#define LOOPS_HOLD_MIN 20.0
#define LOOPS_HOLD_MAX 40.0
#define TARGET_THREAD_ROUNDS 5 /* (floor, library) batch pairs of the threads workload */

enum { CMP_LE = 0, CMP_GE = 1, CMP_EQ = 2 };

typedef struct tgt {
    char what[112];
    const char *goal; /* as printed */
    int cmp;
    double bound;
    int decimals;
    double v[MAX_REPS];
    int n;
} tgt;

#define MAX_TGTS 24

typedef struct tset {
    tgt t[MAX_TGTS];
    int n;
} tset;

/* The target named what (added on first use). */
static tgt *tget(tset *s, const char *what, const char *goal, int cmp, double bound, int dec)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->t[i].what, what) == 0)
            return &s->t[i];
    if (s->n == MAX_TGTS)
        bench_die("targets: too many targets");
    tgt *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->what, sizeof t->what, "%s", what);
    t->goal = goal;
    t->cmp = cmp;
    t->bound = bound;
    t->decimals = dec;
    return t;
}

static void tadd(tset *s, const char *what, const char *goal, int cmp, double bound, int dec,
                 double v)
{
    tgt *t = tget(s, what, goal, cmp, bound, dec);
    if (t->n < MAX_REPS)
        t->v[t->n++] = v;
}

static bool tmet(const tgt *t, double v)
{
    return t->cmp == CMP_LE ? v <= t->bound : t->cmp == CMP_GE ? v >= t->bound : v == t->bound;
}

/* Runs one workload on a copy of the context with options o2; returns its JSON (a new
 * reference, NULL if it wrote none) under key. */
static json_t *sub_run(bench_ctx *ctx, const bench_opts *o2, int w, const char *key)
{
    bench_ctx c2 = *ctx;
    c2.o = o2;
    c2.json = json_object();
    c2.exit_code = 0;
    if (w == BENCH_W_UNCONTENDED)
        bench_run_uncontended(&c2, false);
    else if (w == BENCH_W_THREADS)
        bench_run_threads(&c2);
    else if (w == BENCH_W_LOOPS)
        bench_run_loops(&c2);
    else
        bench_run_contended(&c2);
    ctx->seq = c2.seq;
    if (c2.exit_code != 0)
        ctx->exit_code = c2.exit_code;
    json_t *r = json_object_get(c2.json, key);
    if (r != NULL)
        json_incref(r);
    json_decref(c2.json);
    return r;
}

static void only(bench_opts *o, int k1, int k2, int k3)
{
    for (int i = 0; i < BENCH_NALL; i++)
        o->kinds[i] = i == k1 || i == k2 || i == k3;
}

static json_t *row_of(json_t *rows, const char *strategy, const char *key, json_int_t val)
{
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r)
    {
        const char *s = json_string_value(json_object_get(r, "strategy"));
        if (s != NULL && strcmp(s, strategy) == 0 &&
            (key == NULL || json_integer_value(json_object_get(r, key)) == val))
            return r;
    }
    return NULL;
}

static double num(json_t *r, const char *key)
{
    return json_number_value(json_object_get(r, key));
}

static double p50_ms(json_t *r, const char *key)
{
    return json_number_value(json_object_get(json_object_get(r, key), "p50_us")) / 1e3;
}

/* One repetition: runs the workloads, adds each target's value of this repetition to s and
 * returns the workloads' JSON. */
static json_t *one_rep(bench_ctx *ctx, tset *s)
{
    bench_opts o = *ctx->o;
    o.threads_shared = false;
    o.shared_client = false;
    o.renew = false;
    o.procs = false;
    o.limit = 4;
    json_t *rep = json_object();

    /* each strategy's 32-thread shared client right before its loops: the ratio of the two
     * is then taken over the same few seconds of a shared machine's load */
    o.shared_client = true;
    o.thread_secs = 0.4;
    o.rounds_threads = TARGET_THREAD_ROUNDS;
    o.loops = 1000;
    o.loop_sems = 100;
    o.loop_hold_min_ms = o.loop_hold_max_ms = 0;
    o.loop_threads = 0;
    json_t *th = json_array(), *lp = json_array();
    for (int k = BENCH_BASIC; k <= BENCH_LOCKED; k++) {
        only(&o, k, -1, -1);
        o.nthreads = 1;
        o.threads[0] = 32;
        json_t *t = sub_run(ctx, &o, BENCH_W_THREADS, "threads");
        json_t *l = sub_run(ctx, &o, BENCH_W_LOOPS, "loops");
        if (t != NULL)
            json_array_extend(th, t);
        if (l != NULL)
            json_array_extend(lp, l);
        json_decref(t);
        json_decref(l);
    }
    only(&o, BENCH_BASIC, -1, -1);
    o.threads[0] = 8;
    json_t *t8 = sub_run(ctx, &o, BENCH_W_THREADS, "threads");
    if (t8 != NULL)
        json_array_extend(th, t8);
    json_decref(t8);
    o.threads[0] = 32;
    o.renew = true;
    json_t *rn = sub_run(ctx, &o, BENCH_W_THREADS, "threads");
    o.renew = false;
    o.shared_client = false;

    only(&o, BENCH_BASIC, BENCH_FAIR, BENCH_LOCKED);
    o.loop_hold_min_ms = LOOPS_HOLD_MIN;
    o.loop_hold_max_ms = LOOPS_HOLD_MAX;
    json_t *lh = sub_run(ctx, &o, BENCH_W_LOOPS, "loops");

    o.shared_client = true;
    o.nclients = 1;
    o.clients[0] = 32;
    o.hold_min_ms = 1;
    o.hold_max_ms = 5;
    o.order_margin_us = 1000;
    json_t *ct = sub_run(ctx, &o, BENCH_W_CONTENDED, "contended");
    json_t *cr = json_object_get(ct, "runs");

    o.shared_client = false;
    only(&o, BENCH_BASIC, -1, -1);
    json_t *u = sub_run(ctx, &o, BENCH_W_UNCONTENDED, "uncontended");

    /* the values of this repetition */
    char what[112];
    double most = -1;
    json_t *lsets[2] = {lp, lh};
    for (int h = 0; h < 2; h++) {
        size_t i;
        json_t *r;
        json_array_foreach(lsets[h], i, r)
        {
            /* the most threads the process had, the loop's own (the bench's main thread,
             * its only one then) included */
            json_int_t t = json_integer_value(json_object_get(r, "threads"));
            if (t > 0 && (double)(t - 1) > most)
                most = (double)(t - 1);
        }
    }
    if (most >= 0)
        tadd(s, "threads the library starts while the event-loop API is used (loops, most)",
             "== 0", CMP_EQ, 0, 0, most);
    for (int k = BENCH_BASIC; k <= BENCH_LOCKED; k++) {
        const char *n = bench_kind_name(k);
        json_t *l = row_of(lp, n, NULL, 0), *t = row_of(th, n, "threads", 32);
        if (l != NULL && t != NULL && num(t, "pairs_per_s") > 0) {
            snprintf(what, sizeof what,
                     "loops %s, 1,000 on one libuv thread: grants/s / 32-thread shared client", n);
            tadd(s, what, ">= 1.5", CMP_GE, 1.5, 3, num(l, "grants_per_s") / num(t, "pairs_per_s"));
        }
    }
    for (int k = BENCH_BASIC; k <= BENCH_LOCKED; k++) {
        json_t *l = row_of(lh, bench_kind_name(k), NULL, 0);
        if (l != NULL && json_integer_value(json_object_get(json_object_get(l, "handoff"), "n"))) {
            snprintf(what, sizeof what, "loops %s, hold 20-40 ms: hand-off p50 (ms)",
                     bench_kind_name(k));
            tadd(s, what, "<= 0.5", CMP_LE, 0.5, 3, p50_ms(l, "handoff"));
        }
    }
    json_t *r;
    if ((r = row_of(th, "basic", "threads", 32)) != NULL)
        tadd(s, "32 threads on one client, basic, uncontended: pairs/s / per-thread floor",
             ">= 1.1", CMP_GE, 1.1, 3, num(r, "ratio_pairs_per_s"));
    if ((r = row_of(th, "basic", "threads", 8)) != NULL)
        tadd(s, "8 threads on one client, basic, uncontended: pairs/s / per-thread floor",
             ">= 0.9", CMP_GE, 0.9, 3, num(r, "ratio_pairs_per_s"));
    if ((r = row_of(u, "basic", NULL, 0)) != NULL)
        tadd(s,
             o.affinity == AFF_SAME
                 ? "one thread, basic, uncontended pair / its floor (PINNED: target is unpinned)"
                 : "one thread, basic, uncontended pair / its floor (not pinned)",
             ">= 0.89", CMP_GE, 0.89, 3, num(r, "ratio_pairs_per_s"));
    if ((r = row_of(rn, "basic", "threads", 32)) != NULL &&
        json_is_integer(json_object_get(r, "lib_connections")))
        tadd(s, "connections of 32 threads on one client, renewal on", "<= 5: 4 + 1 wait",
             CMP_LE, 5, 0, num(r, "lib_connections"));
    for (int k = BENCH_BASIC; k <= BENCH_LOCKED; k++) {
        const char *n = bench_kind_name(k);
        if ((r = row_of(cr, n, "clients", 32)) == NULL)
            continue;
        snprintf(what, sizeof what, "contended %s, 32 threads on one client: max holders", n);
        tadd(s, what, "== 4", CMP_EQ, 4, 0, num(r, "max_holders"));
        if (k == BENCH_FAIR) {
            tadd(s, "contended fair: grants out of arrival order (1 ms margin)", "== 0", CMP_EQ,
                 0, 0, num(r, "out_of_order_margin"));
            tadd(s, "contended fair: Jain's index", ">= 0.9995", CMP_GE, 0.9995, 4,
                 num(r, "jain_index"));
        }
        snprintf(what, sizeof what, "contended %s: hand-off p50 (ms)", n);
        tadd(s, what, "<= 0.25", CMP_LE, 0.25, 3, p50_ms(r, "handoff"));
    }

    json_object_set_new(rep, "uncontended", u ? u : json_null());
    json_object_set_new(rep, "threads_shared_client", th ? th : json_null());
    json_object_set_new(rep, "threads_shared_client_renew", rn ? rn : json_null());
    json_object_set_new(rep, "loops_no_hold", lp ? lp : json_null());
    json_object_set_new(rep, "loops_hold_20_40", lh ? lh : json_null());
    json_object_set_new(rep, "contended", ct ? ct : json_null());
    return rep;
}

void bench_run_targets(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    int reps = o->target_reps;
    static tset s; /* large; one run at a time */
    memset(&s, 0, sizeof s);
    printf("\n== targets of issue 25: %d repetitions of the workloads they need (tables "
           "follow)\n",
           reps);
    json_t *jr = json_array();
    double loads[MAX_REPS];
    for (int i = 0; i < reps; i++) {
        double load[3] = {-1, -1, -1};
        (void)getloadavg(load, 3);
        loads[i] = load[0];
        bench_progress(ctx, "targets: repetition %d of %d", i + 1, reps);
        printf("\n-- targets, repetition %d of %d (load average %.2f)\n", i + 1, reps, load[0]);
        json_t *rep = one_rep(ctx, &s);
        json_object_set_new(rep, "loadavg_at_start", json_real(load[0]));
        json_array_append_new(jr, rep);
    }
    char ls[128] = "";
    for (int i = 0; i < reps; i++) {
        size_t l = strlen(ls);
        snprintf(ls + l, sizeof ls - l, "%s%.1f", i ? " " : "", loads[i]);
    }
    printf("\n== the targets of issue 25, from this run: each value a figure or ratio within "
           "one repetition; medians of %d, range in []; 1-minute load average at the "
           "repetitions' starts: %s\n",
           reps, ls);
    json_t *jt = json_array();
    for (int i = 0; i < s.n; i++) {
        tgt *t = &s.t[i];
        double v[MAX_REPS];
        memcpy(v, t->v, sizeof v);
        double med = bench_median(v, (size_t)t->n); /* sorts v */
        char runs[160] = "";
        for (int k = 0; k < t->n; k++) {
            size_t l = strlen(runs);
            snprintf(runs + l, sizeof runs - l, "%s%.*f", k ? " " : "", t->decimals, t->v[k]);
        }
        printf("  %-86s [%.*f-%.*f] runs: %s\n", t->what, t->decimals, v[0], t->decimals,
               v[t->n - 1], runs);
        json_t *jv = json_array();
        for (int k = 0; k < t->n; k++)
            json_array_append_new(jv, json_real(t->v[k]));
        json_array_append_new(jt, json_pack("{s:s, s:s, s:f, s:f, s:f, s:o, s:b}", "what",
                                            t->what, "goal", t->goal, "median", med, "min",
                                            v[0], "max", v[t->n - 1], "values", jv, "met",
                                            tmet(t, med)));
    }
    printf("\n");
    for (int i = 0; i < s.n; i++) {
        tgt *t = &s.t[i];
        double v[MAX_REPS];
        memcpy(v, t->v, sizeof v);
        double med = bench_median(v, (size_t)t->n);
        printf("target: %s = %.*f (%s) %s\n", t->what, t->decimals, med, t->goal,
               tmet(t, med) ? "met" : "MISSED");
    }
    json_object_set_new(ctx->json, "targets",
                        json_pack("{s:i, s:o, s:o}", "repetitions", reps, "targets", jt,
                                  "runs", jr));
}
