/* redsem-bench - workload 2: C clients contending for one semaphore of limit N.
 *
 * Every client (a thread, or with --procs a process) has its own redsem client (--shared, without
 * --procs: all the threads use one, made by the main thread) and loops:
 * acquire (blocking), hold for a fixed or uniformly random time, release. Everything the
 * bench observes goes through one region of shared memory (mmap MAP_SHARED, so threads and
 * processes use the same code), guarded by one process-shared mutex:
 *
 *   occupancy   +1 right after an acquire returned, -1 right before the release is sent. The
 *               counter's interval of each hold lies inside the server's, so if the counter
 *               ever exceeds N, more than N held a permit on the server at that instant: the
 *               run is a failure (exit status 2) unless a lease expired during the hold,
 *               which is counted separately (leases are 10 s; holds a few ms).
 *   waiting     clients inside an acquire call, and when each started waiting.
 *   hand-off    a FIFO of free permits: N at the start, one pushed (with its time) right
 *               before each release is sent, one popped by each grant. A grant to a client
 *               whose acquire began before the popped release's time records a hand-off:
 *               grant time - release time. The freed permit that has been free the longest is
 *               the one "taken" (permits are interchangeable).
 *   out of order  the server's grant order is the order of the fencing tokens (every grant
 *               draws a strictly larger token, fair waiters included); arrival order is the
 *               order of the timestamps the clients take just before calling acquire. A grant
 *               to c (wait began at w_c, token t_c) is out of arrival order, "strict", if some
 *               client d that began waiting earlier (w_d < w_c) was granted later (t_d > t_c):
 *               c overtook d. This count also catches near-ties that are no unfairness: a
 *               thread preempted between its timestamp and its request arrives later than
 *               its timestamp says, and when two queued waiters become entitled at once the
 *               faster one claims first. The second count, "margin", requires d to have
 *               begun waiting more than a margin m before c AND to have been granted (as
 *               seen by d, after the call returned) more than m after c (default m = 1 ms).
 *   under-grant the mean occupancy while more clients want a permit than there are free ones
 *               (clients inside acquire > N - occupancy), integrated exactly over time (every
 *               change is an event under the mutex), as 1 - mean/N: the share of the permits
 *               that sat idle although someone could have used them. With C <= N there is
 *               never such a shortage and the figure is not defined.
 *
 * Redis commands per grant come from two sources, over the same window (all clients warmed
 * up before, all finished after): the sum over the clients of redsem_client_get_stats()
 * .requests (requests written = round trips; --shared: the one client's) and the delta of INFO
 * commandstats (which also
 * counts the commands the scripts call; the bench's own INFO calls are excluded).
 *
 * The server's own time: the commandstats usec of the kind's requests per grant, and during
 * the run every command of 100 us or more goes to the SLOWLOG, which the main thread reads
 * and empties every 100 ms: the longest single command of the acquire path, the longest the
 * server did nothing else for it (bench_busy, reference.c).
 *
 * Redis in Action's fair and locked semaphores (book-fair, book-locked; reference.c) run the
 * same loop through their reference scripts: their acquire does not wait, so a client tries
 * again 1 ms after each refusal (a new identifier, a new ticket); the ticket stands in for
 * the fencing token (every attempt draws one, in the order the server runs them). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "bench.h"

#define MAX_CLIENTS 1024
#define SAMPLE_CAP (1u << 21)
#define LEASE_MS 10000
#define ACQUIRE_TIMEOUT_MS 60000
/* SLOWLOG while a run lasts (the commands at least SLOWLOG_US slow), read every
 * SLOWLOG_POLL_MS. Logging every command would cost the server about 1 us each: 7 % fewer
 * fair grants/s with 32 clients (3 runs each, alternating). */
#define SLOWLOG_US 100
#define STR_(x) #x
#define STR(x) STR_(x)
#define SLOWLOG_POLL_MS 100
#define SLOWLOG_MAX_LEN 100000

typedef struct cclient {
    int64_t wait_start; /* 0: not waiting */
    uint64_t grants, grants_window;
    int64_t max_wait;
    uint64_t requests;
    uint64_t errors;
    int ready_rc;
    char errmsg[200];
} cclient;

typedef struct cshared {
    pthread_mutex_t mu;
    pthread_barrier_t ready, go;
    _Atomic int stop;
    int nclients;
    uint32_t limit;
    int kind;
    char name[64];
    int64_t hold_min_ns, hold_max_ns, margin_ns;
    /* under mu */
    int64_t t_start, t_stop;
    int occupancy, max_occupancy;
    uint64_t over_limit, expired_holds;
    int waiting;
    int64_t last_change;
    double occ_ns, short_ns; /* integral of occupancy, and time, while in shortage */
    uint64_t grants;
    double hold_ns_sum; /* observed holds: grant processed to release started */
    uint64_t holds;
    uint64_t ring_head, ring_count, ring_cap;
    uint64_t nacq, nhand, dropped;
    uint64_t ngrant; /* grant records: wait start and token */
    cclient cl[MAX_CLIENTS];
    /* followed by: int64_t acq[SAMPLE_CAP], hand[SAMPLE_CAP], gwait[SAMPLE_CAP],
     * uint64_t gtoken[SAMPLE_CAP], int64_t gtime[SAMPLE_CAP], ring[ring_cap] */
} cshared;

static int64_t *acq_samples(cshared *s)
{
    return (int64_t *)(s + 1);
}

static int64_t *hand_samples(cshared *s)
{
    return acq_samples(s) + SAMPLE_CAP;
}

static int64_t *grant_wait(cshared *s)
{
    return hand_samples(s) + SAMPLE_CAP;
}

static uint64_t *grant_token(cshared *s)
{
    return (uint64_t *)(grant_wait(s) + SAMPLE_CAP);
}

static int64_t *grant_time(cshared *s)
{
    return (int64_t *)(grant_token(s) + SAMPLE_CAP);
}

static int64_t *ring(cshared *s)
{
    return grant_time(s) + SAMPLE_CAP;
}

static size_t shared_size(uint64_t ring_cap)
{
    return sizeof(cshared) + (5 * (size_t)SAMPLE_CAP + ring_cap) * sizeof(int64_t);
}

/* Call with mu held, before any change of occupancy or waiting: accounts for the time since
 * the last change, during which both were constant. */
static void integrate(cshared *s, int64_t now)
{
    if (s->waiting + s->occupancy > (int)s->limit) {
        int64_t a = s->last_change > s->t_start ? s->last_change : s->t_start;
        int64_t b = now < s->t_stop ? now : s->t_stop;
        if (b > a) {
            s->occ_ns += (double)s->occupancy * (double)(b - a);
            s->short_ns += (double)(b - a);
        }
    }
    s->last_change = now;
}

static void record_error(cclient *me, redsem_client *c, int rc, const char *what)
{
    me->errors++;
    snprintf(me->errmsg, sizeof me->errmsg, "%s: %s (%s)", what, redsem_err_name(rc),
             c ? redsem_client_errmsg(c) : "");
}

/* shared: the client of every thread (--shared), which the worker neither frees nor counts
 * the requests of; NULL: the worker makes its own. */
static void worker(bench_ctx *ctx, cshared *s, int i, redsem_client *shared)
{
    cclient *me = &s->cl[i];
    redsem_client *c = shared;
    bench_handle h = {0};
    bench_ref *ref = NULL;
    bool is_ref = s->kind >= BENCH_NKINDS;
    uint64_t rng = bench_seed() ^ ((uint64_t)i << 32);
    char err[512] = "";
    int rc = REDSEM_OK;
    if (is_ref) {
        /* the book's timeout (its lease) is the library's lease here */
        ref = bench_ref_new(ctx, s->kind, s->name, s->limit, LEASE_MS / 1000.0, false);
        long long t = bench_ref_acquire(ref, ACQUIRE_TIMEOUT_MS);
        if (t <= 0 || bench_ref_release(ref) != 0) {
            rc = t == 0 ? REDSEM_EBUSY : REDSEM_ESERVER;
            snprintf(me->errmsg, sizeof me->errmsg, "warm-up: %s",
                     t == 0 ? "not granted" : "failed (see stderr)");
        }
    } else if (c == NULL) {
        rc = bench_client_try(ctx, &c, err, sizeof err);
        if (rc != REDSEM_OK)
            snprintf(me->errmsg, sizeof me->errmsg, "connect: %s", err);
    }
    if (rc == REDSEM_OK && !is_ref) {
        rc = bench_handle_open(c, s->kind, s->name, s->limit, LEASE_MS, &h);
        if (rc != REDSEM_OK)
            record_error(me, c, rc, "open");
    }
    if (rc == REDSEM_OK && !is_ref) {
        /* Warm-up: loads the scripts, so the measured window sees only EVALSHA. */
        redsem_permit *p = NULL;
        rc = bench_acquire(&h, ACQUIRE_TIMEOUT_MS, &p);
        if (rc == REDSEM_OK) {
            rc = redsem_permit_release(p);
            redsem_permit_free(p);
        }
        if (rc != REDSEM_OK)
            record_error(me, c, rc, "warm-up");
    }
    me->ready_rc = rc;
    uint64_t req0 = is_ref ? bench_ref_requests(ref) : c ? bench_requests(c) : 0;
    pthread_barrier_wait(&s->ready);
    pthread_barrier_wait(&s->go);

    while (rc == REDSEM_OK && !atomic_load(&s->stop)) {
        pthread_mutex_lock(&s->mu);
        int64_t tw = bench_now_ns();
        integrate(s, tw);
        me->wait_start = tw;
        s->waiting++;
        pthread_mutex_unlock(&s->mu);

        redsem_permit *p = NULL;
        int arc;
        uint64_t token = 0;
        if (is_ref) {
            long long t = bench_ref_acquire(ref, ACQUIRE_TIMEOUT_MS);
            arc = t > 0 ? REDSEM_OK : t == 0 ? REDSEM_EBUSY : REDSEM_ESERVER;
            token = t > 0 ? (uint64_t)t : 0;
        } else {
            arc = bench_acquire(&h, ACQUIRE_TIMEOUT_MS, &p);
            if (arc == REDSEM_OK)
                token = redsem_permit_token(p);
        }
        int64_t tg = bench_now_ns();

        pthread_mutex_lock(&s->mu);
        integrate(s, tg);
        s->waiting--;
        if (arc == REDSEM_OK) {
            s->occupancy++;
            if (s->occupancy > s->max_occupancy)
                s->max_occupancy = s->occupancy;
            if (s->occupancy > (int)s->limit)
                s->over_limit++;
            if (s->ngrant < SAMPLE_CAP) {
                grant_wait(s)[s->ngrant] = tw;
                grant_token(s)[s->ngrant] = token;
                grant_time(s)[s->ngrant] = tg;
                s->ngrant++;
            } else {
                s->dropped++;
            }
            if (s->ring_count > 0) {
                int64_t released = ring(s)[s->ring_head];
                s->ring_head = (s->ring_head + 1) % s->ring_cap;
                s->ring_count--;
                if (released > tw) {
                    if (s->nhand < SAMPLE_CAP)
                        hand_samples(s)[s->nhand++] = tg - released;
                    else
                        s->dropped++;
                }
            }
            if (s->nacq < SAMPLE_CAP)
                acq_samples(s)[s->nacq++] = tg - tw;
            else
                s->dropped++;
            s->grants++;
            me->grants++;
            if (tg >= s->t_start && tg <= s->t_stop)
                me->grants_window++;
            if (tg - tw > me->max_wait)
                me->max_wait = tg - tw;
        }
        me->wait_start = 0;
        pthread_mutex_unlock(&s->mu);

        if (arc != REDSEM_OK) {
            record_error(me, c, arc, "acquire");
            if (redsem_is_fault(arc) && me->errors > 10)
                break;
            continue;
        }

        int64_t hold = s->hold_min_ns;
        if (s->hold_max_ns > s->hold_min_ns)
            hold += (int64_t)(bench_rand(&rng) % (uint64_t)(s->hold_max_ns - s->hold_min_ns + 1));
        bench_sleep_ns(hold);

        /* the book's timeout (10 s) cannot pass in a hold of a few ms */
        bool held = is_ref || redsem_permit_held(p);
        pthread_mutex_lock(&s->mu);
        int64_t tr = bench_now_ns();
        integrate(s, tr);
        s->hold_ns_sum += (double)(tr - tg);
        s->holds++;
        s->occupancy--;
        if (!held)
            s->expired_holds++;
        if (s->ring_count < s->ring_cap) {
            ring(s)[(s->ring_head + s->ring_count) % s->ring_cap] = tr;
            s->ring_count++;
        }
        pthread_mutex_unlock(&s->mu);
        int rrc = REDSEM_OK;
        if (is_ref)
            rrc = bench_ref_release(ref) == 0 ? REDSEM_OK : REDSEM_ESERVER;
        else
            rrc = redsem_permit_release(p);
        redsem_permit_free(p);
        if (rrc != REDSEM_OK)
            record_error(me, c, rrc, "release");
    }
    if (is_ref)
        me->requests = bench_ref_requests(ref) - req0;
    else if (c && c != shared)
        me->requests = bench_requests(c) - req0;
    bench_ref_free(ref);
    bench_handle_close(&h);
    if (c != shared)
        redsem_client_free(c);
}

typedef struct grant_rec {
    int64_t wait, granted;
    uint64_t token;
} grant_rec;

static int cmp_wait(const void *a, const void *b)
{
    const grant_rec *x = a, *y = b;
    return (x->wait > y->wait) - (x->wait < y->wait);
}

/* Grants out of arrival order (see the top of this file); g is sorted by wait. */
static void out_of_order(cshared *s, int64_t m, uint64_t *strict, uint64_t *margin)
{
    size_t n = s->ngrant;
    grant_rec *g = malloc((n ? n : 1) * sizeof *g);
    if (g == NULL)
        bench_die("out of memory");
    for (size_t i = 0; i < n; i++)
        g[i] = (grant_rec){grant_wait(s)[i], grant_time(s)[i], grant_token(s)[i]};
    qsort(g, n, sizeof *g, cmp_wait);
    uint64_t max_token = 0;
    int64_t max_granted = 0;
    size_t j = 0, k = 0;
    *strict = *margin = 0;
    for (size_t i = 0; i < n; i++) {
        while (j < i && g[j].wait < g[i].wait) { /* strictly earlier arrivals */
            if (g[j].token > max_token)
                max_token = g[j].token;
            j++;
        }
        while (k < i && g[k].wait < g[i].wait - m) { /* earlier by more than m */
            if (g[k].granted > max_granted)
                max_granted = g[k].granted;
            k++;
        }
        *strict += max_token > g[i].token;
        *margin += k > 0 && max_granted > g[i].granted + m;
    }
    free(g);
}

typedef struct wthread {
    pthread_t th;
    bench_ctx *ctx;
    cshared *s;
    int i;
    redsem_client *shared;
} wthread;

static void *wthread_main(void *arg)
{
    wthread *w = arg;
    worker(w->ctx, w->s, w->i, w->shared);
    return NULL;
}

/* Median of single trivial round trips, us: the unit hand-off latency is compared with. */
static double floor_rtt_us(bench_ctx *ctx)
{
    char name[64];
    bench_name(ctx, "c-rtt", name, sizeof name); /* in a cluster: on the raw node */
    bench_floor *f = bench_floor_new(ctx, BENCH_BASIC, name);
    bench_samples sm;
    samples_init(&sm);
    for (int i = 0; i < 2200; i++) {
        int64_t t0 = bench_now_ns();
        if (bench_floor_release(f) != 0)
            bench_die("floor round trip failed");
        if (i >= 200)
            samples_add(&sm, bench_now_ns() - t0);
    }
    bench_pct p = bench_percentiles(sm.v, sm.n);
    samples_free(&sm);
    bench_floor_free(f);
    return p.p50;
}

typedef struct crow {
    int kind, clients;
    uint32_t limit;
    double secs, grants_per_s, ideal;
    uint64_t grants;
    bench_pct acq, hand;
    double trips_per_grant, cmds_per_grant, top_per_grant;
    int max_holders;
    uint64_t over_limit, expired;
    double under_grant, mean_occ;
    bool shortage; /* some time with more clients wanting a permit than free permits */
    uint64_t ooo_strict, ooo_margin;
    double jain, max_wait_ms;
    uint64_t errors;
    bench_busy busy;
    double server_us_per_grant;
} crow;

static uint64_t stat_delta(const bench_cmdstats *a, const bench_cmdstats *b, const char *n)
{
    return bench_cmdstats_calls(b, n) - bench_cmdstats_calls(a, n);
}

static crow run_one(bench_ctx *ctx, int kind, int nclients, json_t *arr)
{
    const bench_opts *o = ctx->o;
    uint32_t limit = kind == BENCH_LOCK ? 1 : o->limit;
    uint64_t ring_cap = (uint64_t)limit + (uint64_t)nclients + 16;
    size_t size = shared_size(ring_cap);
    cshared *s = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED)
        bench_die("mmap: %s", strerror(errno));
    s->nclients = nclients;
    s->limit = limit;
    s->kind = kind;
    s->hold_min_ns = (int64_t)(o->hold_min_ms * 1e6);
    s->hold_max_ns = (int64_t)(o->hold_max_ms * 1e6);
    s->margin_ns = o->order_margin_us * 1000;
    s->ring_cap = ring_cap;
    for (uint32_t k = 0; k < limit; k++)
        ring(s)[k] = 0; /* N free permits, freed "before the start" */
    s->ring_count = limit;
    s->t_start = INT64_MAX;
    s->t_stop = INT64_MAX;
    bench_name(ctx, "c", s->name, sizeof s->name);

    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&s->mu, &ma);
    pthread_barrierattr_t ba;
    pthread_barrierattr_init(&ba);
    pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&s->ready, &ba, (unsigned)nclients + 1);
    pthread_barrier_init(&s->go, &ba, (unsigned)nclients + 1);

    bench_progress(ctx, "contended %s: %d %s, limit %u, %.1f s", bench_kind_name(kind),
                   nclients, o->procs ? "processes" : "threads", limit, o->duration);
    redisContext *raw = bench_raw_connect(ctx);
    redsem_client *shared = o->shared_client && !o->procs ? bench_client(ctx) : NULL;
    wthread *ths = calloc((size_t)nclients, sizeof *ths);
    pid_t *pids = calloc((size_t)nclients, sizeof *pids);
    if (ths == NULL || pids == NULL)
        bench_die("out of memory");
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < nclients; i++) {
        if (o->procs) {
            pid_t pid = fork();
            if (pid < 0)
                bench_die("fork: %s", strerror(errno));
            if (pid == 0) {
                worker(ctx, s, i, NULL);
                _exit(0);
            }
            pids[i] = pid;
        } else {
            ths[i] = (wthread){.ctx = ctx, .s = s, .i = i, .shared = shared};
            if (pthread_create(&ths[i].th, NULL, wthread_main, &ths[i]) != 0)
                bench_die("pthread_create failed");
        }
    }
    pthread_barrier_wait(&s->ready);
    for (int i = 0; i < nclients; i++)
        if (s->cl[i].ready_rc != REDSEM_OK)
            fprintf(stderr, "redsem-bench: client %d failed to start: %s\n", i, s->cl[i].errmsg);
    bench_cmdstats before, after;
    if (bench_cmdstats_get(raw, &before) != 0)
        bench_die("INFO commandstats failed");
    uint64_t shared_req0 = shared ? bench_requests(shared) : 0; /* every thread warmed up */
    bench_busy busy = {0};
    bench_slowlog *sl =
        o->no_slowlog ? NULL : bench_slowlog_start(ctx, SLOWLOG_US, SLOWLOG_MAX_LEN);
    pthread_mutex_lock(&s->mu);
    s->t_start = bench_now_ns();
    s->last_change = s->t_start;
    pthread_mutex_unlock(&s->mu);
    pthread_barrier_wait(&s->go);
    busy.valid = sl != NULL;
    busy.threshold_us = SLOWLOG_US;
    for (int64_t end = s->t_start + (int64_t)(o->duration * 1e9), now;
         (now = bench_now_ns()) < end;) {
        int64_t left = end - now, step = SLOWLOG_POLL_MS * 1000000LL;
        bench_sleep_ns(left < step ? left : step);
        if (sl != NULL && bench_slowlog_collect(sl, kind, &busy) != 0)
            busy.valid = false;
    }
    pthread_mutex_lock(&s->mu);
    int64_t now = bench_now_ns();
    integrate(s, now);
    s->t_stop = now;
    atomic_store(&s->stop, 1);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < nclients; i++) {
        if (o->procs) {
            int st = 0;
            while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR)
                ;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                fprintf(stderr, "redsem-bench: client process %d ended abnormally\n", i);
        } else {
            pthread_join(ths[i].th, NULL);
        }
    }
    if (bench_cmdstats_get(raw, &after) != 0)
        bench_die("INFO commandstats failed");
    redisFree(raw);
    if (sl != NULL && bench_slowlog_collect(sl, kind, &busy) != 0)
        busy.valid = false;
    bench_slowlog_stop(sl);
    uint64_t shared_requests = shared ? bench_requests(shared) - shared_req0 : 0;
    redsem_client_free(shared);

    /* ------------------------------------------------------------ figures */
    crow r = {.kind = kind, .clients = nclients, .limit = limit, .busy = busy};
    r.secs = (double)(s->t_stop - s->t_start) / 1e9;
    uint64_t *gw = calloc((size_t)nclients, sizeof *gw);
    uint64_t requests = shared_requests, window = 0;
    int64_t max_wait = 0;
    for (int i = 0; i < nclients; i++) {
        gw[i] = s->cl[i].grants_window;
        window += gw[i];
        requests += s->cl[i].requests;
        r.errors += s->cl[i].errors;
        if (s->cl[i].max_wait > max_wait)
            max_wait = s->cl[i].max_wait;
        if (s->cl[i].errors)
            fprintf(stderr, "redsem-bench: client %d: %llu errors, last: %s\n", i,
                    (unsigned long long)s->cl[i].errors, s->cl[i].errmsg);
    }
    r.grants = s->grants;
    r.grants_per_s = (double)window / r.secs;
    double mean_hold_s = (o->hold_min_ms + o->hold_max_ms) / 2 / 1e3;
    r.ideal = mean_hold_s > 0 ? limit / mean_hold_s : 0;
    r.acq = bench_percentiles(acq_samples(s), s->nacq);
    r.hand = bench_percentiles(hand_samples(s), s->nhand);
    r.trips_per_grant = s->grants ? (double)requests / (double)s->grants : 0;
    uint64_t total = 0;
    json_t *jstats = json_object();
    for (int k = 0; k < after.n; k++) {
        if (strcmp(after.name[k], "info") == 0)
            continue;
        uint64_t d = after.calls[k] - bench_cmdstats_calls(&before, after.name[k]);
        total += d;
        if (d)
            json_object_set_new(jstats, after.name[k], json_integer((json_int_t)d));
    }
    /* Top-level requests the library can send here: EVALSHA (the locked strategy's guard
     * included: its SET NX PX runs inside guard_acquire.lua, like the lock's), BLPOP and
     * SCRIPT LOAD. */
    uint64_t top = stat_delta(&before, &after, "evalsha") + stat_delta(&before, &after, "blpop") +
                   stat_delta(&before, &after, "script|load");
    /* the book's guard is a top-level SET (the library's guard runs SET inside a script) */
    if (kind == BENCH_BOOK_LOCKED)
        top += stat_delta(&before, &after, "set");
    r.cmds_per_grant = s->grants ? (double)total / (double)s->grants : 0;
    r.server_us_per_grant = s->grants ? (double)(bench_cmdstats_request_usec(&after, kind) -
                                                 bench_cmdstats_request_usec(&before, kind)) /
                                            (double)s->grants
                                      : 0;
    r.top_per_grant = s->grants ? (double)top / (double)s->grants : 0;
    r.max_holders = s->max_occupancy;
    r.over_limit = s->over_limit;
    r.expired = s->expired_holds;
    r.shortage = s->short_ns > 0;
    r.mean_occ = r.shortage ? s->occ_ns / s->short_ns : 0;
    r.under_grant = r.shortage ? 1 - r.mean_occ / limit : 0;
    out_of_order(s, s->margin_ns, &r.ooo_strict, &r.ooo_margin);
    r.jain = bench_jain(gw, (size_t)nclients);
    r.max_wait_ms = (double)max_wait / 1e6;

    json_t *jg = json_array(), *jmw = json_array();
    for (int i = 0; i < nclients; i++) {
        json_array_append_new(jg, json_integer((json_int_t)gw[i]));
        json_array_append_new(jmw, json_real((double)s->cl[i].max_wait / 1e6));
    }
    json_t *row = json_pack(
        "{s:s, s:i, s:i, s:s, s:f, s:f, s:f, s:I, s:I, s:f, s:f}", "strategy",
        bench_kind_name(kind), "clients", nclients, "limit", (int)limit, "clients_are",
        o->procs ? "processes" : "threads", "hold_min_ms", o->hold_min_ms, "hold_max_ms",
        o->hold_max_ms, "duration_s", r.secs, "grants_in_window", (json_int_t)window,
        "grants_total", (json_int_t)s->grants, "grants_per_s", r.grants_per_s,
        "ideal_grants_per_s", r.ideal);
    json_object_set_new(row, "shared_client", json_boolean(shared != NULL));
    json_object_set_new(row, "reference", json_boolean(kind >= BENCH_NKINDS));
    json_object_set_new(row, "server", bench_busy_json(&busy, s->grants));
    json_object_set_new(row, "server_us_per_grant", json_real(r.server_us_per_grant));
    json_object_set_new(row, "ratio_to_ideal", json_real(r.ideal > 0 ? r.grants_per_s / r.ideal : 0));
    json_object_set_new(row, "mean_hold_ms_observed",
                        json_real(s->holds ? s->hold_ns_sum / (double)s->holds / 1e6 : 0));
    json_object_set_new(row, "acquire", bench_pct_json(&r.acq));
    json_object_set_new(row, "handoff", bench_pct_json(&r.hand));
    json_object_set_new(row, "round_trips_per_grant", json_real(r.trips_per_grant));
    json_object_set_new(row, "round_trips_total", json_integer((json_int_t)requests));
    json_object_set_new(row, "server_commands_per_grant", json_real(r.cmds_per_grant));
    json_object_set_new(row, "server_top_level_per_grant", json_real(r.top_per_grant));
    json_object_set_new(row, "commandstats_delta", jstats);
    json_object_set_new(row, "max_holders", json_integer(r.max_holders));
    json_object_set_new(row, "holders_over_limit_events", json_integer((json_int_t)r.over_limit));
    json_object_set_new(row, "leases_expired_during_hold", json_integer((json_int_t)r.expired));
    json_object_set_new(row, "mean_occupancy_in_shortage",
                        r.shortage ? json_real(r.mean_occ) : json_null());
    json_object_set_new(row, "under_grant", r.shortage ? json_real(r.under_grant) : json_null());
    json_object_set_new(row, "shortage_time_fraction",
                        json_real(r.secs > 0 ? s->short_ns / 1e9 / r.secs : 0));
    json_object_set_new(row, "out_of_order_strict", json_integer((json_int_t)r.ooo_strict));
    json_object_set_new(row, "out_of_order_margin", json_integer((json_int_t)r.ooo_margin));
    json_object_set_new(row, "order_margin_us", json_integer(o->order_margin_us));
    json_object_set_new(row, "max_wait_ms", json_real(r.max_wait_ms));
    json_object_set_new(row, "jain_index", json_real(r.jain));
    json_object_set_new(row, "per_client_grants", jg);
    json_object_set_new(row, "per_client_max_wait_ms", jmw);
    json_object_set_new(row, "errors", json_integer((json_int_t)r.errors));
    json_object_set_new(row, "samples_dropped", json_integer((json_int_t)s->dropped));
    json_array_append_new(arr, row);

    if (r.over_limit > 0 && r.expired == 0) {
        fprintf(stderr,
                "\nredsem-bench: SAFETY VIOLATION: %s semaphore of limit %u had %d concurrent "
                "holders (%llu times above the limit) with no lease expired\n\n",
                bench_kind_name(kind), limit, r.max_holders, (unsigned long long)r.over_limit);
        ctx->exit_code = 2;
    } else if (r.over_limit > 0) {
        fprintf(stderr,
                "redsem-bench: %s: %d holders seen with limit %u, but %llu leases expired during "
                "a hold (a stalled client), so the limit may have been honoured\n",
                bench_kind_name(kind), r.max_holders, limit, (unsigned long long)r.expired);
        ctx->exit_code = 2;
    }
    free(gw);
    free(ths);
    free(pids);
    pthread_barrier_destroy(&s->ready);
    pthread_barrier_destroy(&s->go);
    pthread_mutex_destroy(&s->mu);
    munmap(s, size);
    bench_cleanup(ctx, NULL);
    return r;
}

void bench_run_contended(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    json_t *arr = json_array();
    double rtt = floor_rtt_us(ctx);
    crow *rows = calloc((size_t)(o->nclients * BENCH_NALL), sizeof *rows);
    int n = 0;
    for (int ci = 0; ci < o->nclients; ci++)
        for (int kind = 0; kind < BENCH_NALL; kind++)
            if (o->kinds[kind])
                rows[n++] = run_one(ctx, kind, o->clients[ci], arr);

    char hold[64];
    if (o->hold_max_ms > o->hold_min_ms)
        snprintf(hold, sizeof hold, "uniform %g-%g ms", o->hold_min_ms, o->hold_max_ms);
    else
        snprintf(hold, sizeof hold, "%g ms", o->hold_min_ms);
    printf("\n== contended: C %s%s on one semaphore of limit N (the lock: N = 1), hold %s, "
           "%.1f s each; latencies in ms\n",
           o->procs ? "processes" : "threads",
           o->procs ? "" : o->shared_client ? " sharing ONE client" : ", each its own client",
           hold, o->duration);
    printf("%-11s %4s %3s %9s %7s | %7s %7s %7s %7s | %7s %7s %7s %7s\n", "strategy", "C", "N",
           "grants/s", "x ideal", "acq p50", "p99", "p99.9", "max", "handoff", "p99", "max",
           "x rtt");
    bench_rule(112);
    for (int i = 0; i < n; i++) {
        crow *r = &rows[i];
        char hand[64] = "      -       -       -       -";
        if (r->hand.n > 0)
            snprintf(hand, sizeof hand, "%7.3f %7.3f %7.2f %7.1f", r->hand.p50 / 1e3,
                     r->hand.p99 / 1e3, r->hand.max / 1e3, rtt > 0 ? r->hand.p50 / rtt : 0);
        printf("%-11s %4d %3u %9.0f %7.3f | %7.2f %7.2f %7.2f %7.2f | %s\n",
               bench_kind_name(r->kind), r->clients, r->limit, r->grants_per_s,
               r->ideal > 0 ? r->grants_per_s / r->ideal : 0, r->acq.p50 / 1e3,
               r->acq.p99 / 1e3, r->acq.p999 / 1e3, r->acq.max / 1e3, hand);
    }
    printf("\n%-11s %4s %3s | %6s %7s %5s | %6s %6s | %5s %6s | %7s %7s %8s %6s\n", "strategy",
           "C", "N", "trips/", "srvcmd/", "top/", "max", "over", "under", "mean", "out-of-",
           "order", "max wait", "Jain");
    printf("%-11s %4s %3s | %6s %7s %5s | %6s %6s | %5s %6s | %7s %7s %8s %6s\n", "", "", "",
           "grant", "grant", "grant", "holdrs", "limit", "grant", "occup", "strict", "margin",
           "ms", "index");
    bench_rule(112);
    for (int i = 0; i < n; i++) {
        crow *r = &rows[i];
        char ug[16] = "    -", mo[16] = "     -";
        if (r->shortage) {
            snprintf(ug, sizeof ug, "%5.3f", r->under_grant);
            snprintf(mo, sizeof mo, "%6.2f", r->mean_occ);
        }
        printf("%-11s %4d %3u | %6.2f %7.1f %5.2f | %6d %6llu | %5s %6s | %7llu %7llu %8.1f "
               "%6.4f\n",
               bench_kind_name(r->kind), r->clients, r->limit, r->trips_per_grant,
               r->cmds_per_grant, r->top_per_grant, r->max_holders,
               (unsigned long long)r->over_limit, ug, mo, (unsigned long long)r->ooo_strict,
               (unsigned long long)r->ooo_margin, r->max_wait_ms, r->jain);
        if (r->errors)
            printf("         (%llu errors: see stderr)\n", (unsigned long long)r->errors);
    }
    printf("\n%-11s %4s %3s | %9s | %9s %9s %9s\n", "strategy", "C", "N", "srv us/",
           "slow acq", "max busy", "max busy");
    printf("%-11s %4s %3s | %9s | %9s %9s %9s\n", "", "", "", "grant", "cmds", "acq us",
           "any us");
    bench_rule(68);
    for (int i = 0; i < n; i++) {
        crow *r = &rows[i];
        const bench_busy *b = &r->busy;
        char slow[48];
        if (!b->valid)
            snprintf(slow, sizeof slow, "(no SLOWLOG)");
        else if (b->acquire_cmds == 0 && b->any_max_us == 0)
            snprintf(slow, sizeof slow, "%9d %9s %9s", 0, "<" STR(SLOWLOG_US), "<" STR(SLOWLOG_US));
        else if (b->acquire_cmds == 0)
            snprintf(slow, sizeof slow, "%9d %9s %9lld", 0, "<" STR(SLOWLOG_US), b->any_max_us);
        else
            snprintf(slow, sizeof slow, "%9llu %9lld %9lld", (unsigned long long)b->acquire_cmds,
                     b->acquire_max_us, b->any_max_us);
        printf("%-11s %4d %3u | %9.1f | %s\n", bench_kind_name(r->kind), r->clients, r->limit,
               r->server_us_per_grant, slow);
    }
    printf("srv us/grant: the server's time (INFO commandstats usec) on the kind's requests per "
           "grant, failed and queued attempts and releases included; slow acq cmds: commands "
           "of the acquire path that took %d us or more (SLOWLOG, read every %d ms; "
           "--no-slowlog: not read); max busy: the longest of them, and of any command, the "
           "longest the server did nothing else.\n",
           SLOWLOG_US, SLOWLOG_POLL_MS);
    printf("trips/grant: round trips (requests written, redsem_client_get_stats) per grant, "
           "release included; srvcmd/grant: INFO commandstats delta per grant, commands run by "
           "scripts included; top/grant: EVALSHA+BLPOP from commandstats, the "
           "cross-check of trips/grant. under-grant: 1 - mean occupancy/N while more clients "
           "want a permit than are free (mean occup). x rtt: hand-off p50 / one trivial round "
           "trip (%.1f us).\n",
           rtt);
    fflush(stdout);
    for (int i = 0; i < n; i++)
        bench_busy_free(&rows[i].busy);
    free(rows);
    json_t *jc = json_pack("{s:f, s:o}", "floor_round_trip_p50_us", rtt, "runs", arr);
    json_object_set_new(ctx->json, "contended", jc);
}
