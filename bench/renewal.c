/* redsem-bench - the renewal workload (issue 4): what automatic renewal costs at a few
 * intervals, how close to the lost deadline the worst renewal came, and how early the
 * lost-lease notification reaches the holder.
 *
 * 1. interval: one client renews 16 fair permits (lease 1000 ms) every lease/2, /3, /4, /10
 *    for 2 s: renewals per second per permit, the worst lateness behind schedule
 *    (redsem_client_renew_stats), and the margin the worst renewal left before the permit
 *    would have been declared lost: (lease - drift - early) - interval - lateness.
 * 2. stall: a permit (lease 300 ms, default interval) is renewed; the server is stalled with
 *    DEBUG SLEEP 1 (sent on a raw connection without waiting for its reply); the lost
 *    callback's time is compared with the permit's validity deadline (how long before validity
 *    ended the holder learned) and with the earliest moment the server could grant the permit
 *    to someone else (validity deadline + drift). Needs DEBUG (private servers allow it).
 * 3. takeover: the holder's entry is removed behind its back (HDEL of its token); time until
 *    the callback (bounded by one interval plus a round trip).
 * 4. lifetimes (issue 29): a semaphore handle freed while its 16 permits are renewed every
 *    20 ms (how long the free takes: it waits for a renewal in flight; the renewer must do no
 *    more work after it), and lost callbacks that, on the renewer thread, release and free
 *    their permit, free its handle, or free the client. Under ThreadSanitizer (.ci/run) this
 *    is what checks those paths for races: the criterion tests cannot run there. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "bench.h"

#define RENEW_PERMITS 16
#define TRIALS 5

typedef struct lost_probe {
    _Atomic int64_t at_ns;
    atomic_int reason;
} lost_probe;

static void on_lost(redsem_permit *p, redsem_lost_reason why, void *arg)
{
    (void)p;
    lost_probe *l = arg;
    atomic_store(&l->reason, (int)why);
    atomic_store(&l->at_ns, bench_now_ns());
}

static int64_t wait_lost(lost_probe *l, int64_t limit_ns)
{
    int64_t until = bench_now_ns() + limit_ns;
    while (atomic_load(&l->at_ns) == 0 && bench_now_ns() < until)
        bench_sleep_ns(200000);
    return atomic_load(&l->at_ns);
}

static redsem_sem *open_fair(bench_ctx *ctx, redsem_client *c, const char *tag, uint32_t limit,
                             int64_t lease)
{
    char name[64];
    bench_name(ctx, tag, name, sizeof name);
    redsem_sem *s = NULL;
    int rc = redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, limit, lease, &s);
    if (rc != REDSEM_OK)
        bench_die("renewal: open %s: %s (%s)", name, redsem_strerror(rc), redsem_client_errmsg(c));
    return s;
}

static redsem_permit *take(redsem_client *c, redsem_sem *s)
{
    redsem_permit *p = NULL;
    int rc = redsem_sem_try_acquire(s, &p);
    if (rc != REDSEM_OK)
        bench_die("renewal: acquire: %s (%s)", redsem_strerror(rc), redsem_client_errmsg(c));
    return p;
}

static int64_t early_ms(int64_t lease)
{
    int64_t e = lease / 50;
    return e > 25 ? 25 : e < 1 ? 1 : e;
}

static void run_intervals(bench_ctx *ctx, json_t *out)
{
    static const int fractions[] = {2, 3, 4, 10};
    const int64_t lease = 1000, drift = lease / 100 + 2;
    json_t *arr = json_array();
    printf("\n== renewal interval: %d fair permits of a %lld ms lease renewed by one client "
           "for 2 s\n",
           RENEW_PERMITS, (long long)lease);
    printf("interval       ms | renewals/s/permit failures | worst late ms | margin left ms\n");
    bench_rule(80);
    for (size_t f = 0; f < sizeof fractions / sizeof *fractions; f++) {
        int64_t interval = lease / fractions[f];
        bench_progress(ctx, "renewal: interval lease/%d", fractions[f]);
        redsem_client *c = bench_client(ctx);
        redsem_sem *s = open_fair(ctx, c, "renew", RENEW_PERMITS, lease);
        redsem_permit *p[RENEW_PERMITS];
        for (int i = 0; i < RENEW_PERMITS; i++) {
            p[i] = take(c, s);
            if (redsem_permit_auto_renew(p[i], interval, NULL, NULL) != REDSEM_OK)
                bench_die("renewal: auto_renew: %s", redsem_client_errmsg(c));
        }
        int64_t t0 = bench_now_ns();
        bench_sleep_ns(2000000000LL);
        redsem_renew_stats st;
        redsem_client_renew_stats(c, &st);
        double secs = (double)(bench_now_ns() - t0) / 1e9;
        int held = 0;
        for (int i = 0; i < RENEW_PERMITS; i++) {
            held += redsem_permit_held(p[i]);
            redsem_permit_release(p[i]);
            redsem_permit_free(p[i]);
        }
        redsem_sem_free(s);
        redsem_client_free(c);
        double per = (double)st.renewals / RENEW_PERMITS / secs;
        int64_t margin = (lease - drift - early_ms(lease)) - interval - st.max_lateness_ms;
        printf("lease/%-3d %7lld | %17.2f %8llu | %13lld | %14lld%s\n", fractions[f],
               (long long)interval, per, (unsigned long long)st.failures,
               (long long)st.max_lateness_ms, (long long)margin,
               held == RENEW_PERMITS ? "" : "  (a permit was lost!)");
        json_t *row = json_object();
        json_object_set_new(row, "fraction", json_integer(fractions[f]));
        json_object_set_new(row, "interval_ms", json_integer(interval));
        json_object_set_new(row, "renewals_per_s_per_permit", json_real(per));
        json_object_set_new(row, "failures", json_integer((json_int_t)st.failures));
        json_object_set_new(row, "max_lateness_ms", json_integer(st.max_lateness_ms));
        json_object_set_new(row, "margin_ms", json_integer(margin));
        json_object_set_new(row, "permits_held_at_end", json_integer(held));
        json_array_append_new(arr, row);
    }
    json_object_set_new(out, "intervals", arr);
}

/* Send a command without waiting for its reply (the reply is read later). */
static void send_async(redisContext *r, const char *cmd)
{
    if (redisAppendCommand(r, cmd) != REDIS_OK)
        bench_die("renewal: %s: %s", cmd, r->errstr);
    int done = 0;
    while (!done)
        if (redisBufferWrite(r, &done) != REDIS_OK)
            bench_die("renewal: %s: %s", cmd, r->errstr);
}

static void run_stall(bench_ctx *ctx, json_t *out)
{
    const int64_t lease = 300, drift = lease / 100 + 2;
    redisContext *raw = bench_raw_connect(ctx);
    redisReply *probe = redisCommand(raw, "DEBUG SLEEP 0");
    bool allowed = probe && probe->type != REDIS_REPLY_ERROR;
    if (probe)
        freeReplyObject(probe);
    if (!allowed) {
        printf("\n== lost-lease notification on a stalled server: skipped (DEBUG is not "
               "allowed on this server)\n");
        redisFree(raw);
        return;
    }
    bench_progress(ctx, "renewal: %d stalls of the server", TRIALS);
    double before_validity[TRIALS], before_server[TRIALS], after_stall[TRIALS];
    int n = 0;
    for (int t = 0; t < TRIALS; t++) {
        redsem_client *c = bench_client(ctx);
        redsem_sem *s = open_fair(ctx, c, "stall", 1, lease);
        redsem_permit *p = take(c, s);
        lost_probe lp = {0};
        if (redsem_permit_auto_renew(p, 0, on_lost, &lp) != REDSEM_OK)
            bench_die("renewal: auto_renew: %s", redsem_client_errmsg(c));
        /* let a renewal or two happen, at a varying point of the interval */
        bench_sleep_ns((150 + 17 * t) * 1000000LL);
        int64_t stall = bench_now_ns();
        send_async(raw, "DEBUG SLEEP 1");
        int64_t at = wait_lost(&lp, 3000000000LL);
        int64_t deadline_ns = redsem_permit_deadline_ms(p) * 1000000LL;
        redisReply *r = NULL;
        if (redisGetReply(raw, (void **)&r) == REDIS_OK && r)
            freeReplyObject(r);
        if (at != 0) {
            before_validity[n] = (double)(deadline_ns - at) / 1e6;
            before_server[n] = before_validity[n] + (double)drift;
            after_stall[n] = (double)(at - stall) / 1e6;
            n++;
        }
        redsem_permit_release(p);
        redsem_permit_free(p);
        redsem_sem_free(s);
        redsem_client_free(c);
    }
    redisFree(raw);
    double bv_min = 1e9, bs_min = 1e9;
    for (int i = 0; i < n; i++) {
        bv_min = before_validity[i] < bv_min ? before_validity[i] : bv_min;
        bs_min = before_server[i] < bs_min ? before_server[i] : bs_min;
    }
    double bv = bench_median(before_validity, (size_t)n);
    double bs = bench_median(before_server, (size_t)n);
    double as = bench_median(after_stall, (size_t)n);
    printf("\n== lost-lease notification: server stalled (DEBUG SLEEP 1) under a renewed %lld ms "
           "lease (interval lease/3), %d trials\n",
           (long long)lease, TRIALS);
    printf("notified %d of %d | before validity ended: median %.1f ms, min %.1f | before the "
           "server could regrant: median %.1f ms, min %.1f | after the stall began: median %.0f "
           "ms\n",
           n, TRIALS, bv, bv_min, bs, bs_min, as);
    json_t *o = json_object();
    json_object_set_new(o, "lease_ms", json_integer(lease));
    json_object_set_new(o, "trials", json_integer(TRIALS));
    json_object_set_new(o, "notified", json_integer(n));
    json_object_set_new(o, "before_validity_end_ms_median", json_real(bv));
    json_object_set_new(o, "before_validity_end_ms_min", json_real(bv_min));
    json_object_set_new(o, "before_server_regrant_ms_median", json_real(bs));
    json_object_set_new(o, "before_server_regrant_ms_min", json_real(bs_min));
    json_object_set_new(o, "after_stall_ms_median", json_real(as));
    json_object_set_new(out, "stall", o);
}

static void run_takeover(bench_ctx *ctx, json_t *out)
{
    const int64_t lease = 300;
    redisContext *raw = bench_raw_connect(ctx);
    bench_progress(ctx, "renewal: %d leases removed behind their holders", TRIALS);
    double detect[TRIALS];
    int n = 0;
    for (int t = 0; t < TRIALS; t++) {
        redsem_client *c = bench_client(ctx);
        char name[64];
        bench_name(ctx, "takeover", name, sizeof name);
        redsem_sem *s = NULL;
        if (redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, 1, lease, &s) != REDSEM_OK)
            bench_die("renewal: open: %s", redsem_client_errmsg(c));
        redsem_permit *p = take(c, s);
        lost_probe lp = {0};
        if (redsem_permit_auto_renew(p, 0, on_lost, &lp) != REDSEM_OK)
            bench_die("renewal: auto_renew: %s", redsem_client_errmsg(c));
        bench_sleep_ns((40 + 23 * t) * 1000000LL);
        int64_t t0 = bench_now_ns();
        redisReply *r = redisCommand(raw, "HDEL %s{%s}:meta t:%s", ctx->prefix, name,
                                     redsem_permit_id(p));
        if (r)
            freeReplyObject(r);
        int64_t at = wait_lost(&lp, 2000000000LL);
        if (at != 0 && atomic_load(&lp.reason) == REDSEM_LOST_EXPIRED)
            detect[n++] = (double)(at - t0) / 1e6;
        redsem_permit_release(p);
        redsem_permit_free(p);
        redsem_sem_free(s);
        redsem_client_free(c);
    }
    redisFree(raw);
    double max = 0;
    for (int i = 0; i < n; i++)
        max = detect[i] > max ? detect[i] : max;
    double med = bench_median(detect, (size_t)n);
    printf("\n== lost-lease notification: entry removed behind the holder (lease %lld ms, "
           "interval %lld ms), %d trials\n",
           (long long)lease, (long long)(lease / 3), TRIALS);
    printf("notified %d of %d as expired | after the removal: median %.1f ms, max %.1f ms "
           "(bounded by one interval)\n",
           n, TRIALS, med, max);
    json_t *o = json_object();
    json_object_set_new(o, "lease_ms", json_integer(lease));
    json_object_set_new(o, "trials", json_integer(TRIALS));
    json_object_set_new(o, "notified", json_integer(n));
    json_object_set_new(o, "detect_ms_median", json_real(med));
    json_object_set_new(o, "detect_ms_max", json_real(max));
    json_object_set_new(out, "takeover", o);
}

static uint64_t renewer_work(redsem_client *c)
{
    redsem_renew_stats st;
    redsem_client_renew_stats(c, &st);
    return st.renewals + st.failures + st.lost_expired + st.lost_deadline;
}

enum { LIFE_RELEASE, LIFE_FREE_HANDLE, LIFE_FREE_CLIENT, LIFE_KINDS };
static const char *const life_names[LIFE_KINDS] = {"release and free the permit",
                                                   "free the handle", "free the client"};

typedef struct life_cb {
    int what;
    redsem_client *c;
    redsem_sem *s;
    redsem_permit *other;
    atomic_int done;
} life_cb;

/* The lost callback of section 4: calls on the renewer thread that must neither deadlock
 * nor leave the renewer on freed memory. */
static void on_lost_calls(redsem_permit *p, redsem_lost_reason why, void *arg)
{
    (void)why;
    life_cb *l = arg;
    (void)redsem_permit_release(p);
    redsem_permit_free(p);
    if (l->what >= LIFE_FREE_HANDLE) {
        redsem_permit_free(l->other);
        redsem_sem_free(l->s);
    }
    if (l->what == LIFE_FREE_CLIENT)
        redsem_client_free(l->c);
    atomic_store(&l->done, 1);
}

static void run_lifetimes(bench_ctx *ctx, json_t *out)
{
    const int64_t lease = 300, interval = 20;
    bench_progress(ctx, "renewal: %d handles freed under renewal, %d lost callbacks", TRIALS,
                   LIFE_KINDS);
    double free_ms[TRIALS];
    int renewed_after = 0;
    for (int t = 0; t < TRIALS; t++) {
        redsem_client *c = bench_client(ctx);
        redsem_sem *s = open_fair(ctx, c, "lifetime", RENEW_PERMITS, lease);
        redsem_permit *p[RENEW_PERMITS];
        for (int i = 0; i < RENEW_PERMITS; i++) {
            p[i] = take(c, s);
            if (redsem_permit_auto_renew(p[i], interval, NULL, NULL) != REDSEM_OK)
                bench_die("renewal: auto_renew: %s", redsem_client_errmsg(c));
        }
        bench_sleep_ns((60 + 7 * t) * 1000000LL);
        int64_t t0 = bench_now_ns();
        redsem_sem_free(s); /* its permits are still renewed */
        free_ms[t] = (double)(bench_now_ns() - t0) / 1e6;
        uint64_t work = renewer_work(c);
        bench_sleep_ns(3 * interval * 1000000LL); /* past the next renewals */
        renewed_after += renewer_work(c) != work;
        for (int i = 0; i < RENEW_PERMITS; i++)
            redsem_permit_free(p[i]);
        redsem_client_free(c);
    }
    redisContext *raw = bench_raw_connect(ctx);
    int returned = 0;
    for (int what = 0; what < LIFE_KINDS; what++) {
        life_cb l = {.what = what, .c = bench_client(ctx)};
        char name[64];
        bench_name(ctx, "lostcalls", name, sizeof name);
        if (redsem_sem_open(l.c, name, REDSEM_STRATEGY_FAIR, 3, lease, &l.s) != REDSEM_OK)
            bench_die("renewal: open: %s", redsem_client_errmsg(l.c));
        redsem_permit *p = take(l.c, l.s), *third = take(l.c, l.s);
        l.other = take(l.c, l.s);
        if (redsem_permit_auto_renew(p, interval, on_lost_calls, &l) != REDSEM_OK ||
            redsem_permit_auto_renew(l.other, interval, NULL, NULL) != REDSEM_OK ||
            redsem_permit_auto_renew(third, interval, NULL, NULL) != REDSEM_OK)
            bench_die("renewal: auto_renew: %s", redsem_client_errmsg(l.c));
        redisReply *r = redisCommand(raw, "HDEL %s{%s}:meta t:%s", ctx->prefix, name,
                                     redsem_permit_id(p));
        if (r)
            freeReplyObject(r);
        int64_t until = bench_now_ns() + 2000000000LL;
        while (!atomic_load(&l.done) && bench_now_ns() < until)
            bench_sleep_ns(200000);
        if (!atomic_load(&l.done))
            bench_die("renewal: the lost callback that must %s did not return", life_names[what]);
        returned++;
        bench_sleep_ns(3 * interval * 1000000LL); /* the renewer runs on */
        if (what < LIFE_FREE_CLIENT)
            (void)redsem_permit_stop_renewal(third);
        redsem_permit_free(third);
        if (what == LIFE_RELEASE) {
            redsem_permit_free(l.other);
            redsem_sem_free(l.s);
        }
        if (what < LIFE_FREE_CLIENT)
            redsem_client_free(l.c);
    }
    redisFree(raw);
    double med = bench_median(free_ms, TRIALS), max = 0;
    for (int i = 0; i < TRIALS; i++)
        max = free_ms[i] > max ? free_ms[i] : max;
    printf("\n== lifetimes: a semaphore handle freed while its %d permits are renewed every "
           "%lld ms, %d trials\n",
           RENEW_PERMITS, (long long)interval, TRIALS);
    printf("redsem_sem_free: median %.3f ms, max %.3f ms | renewer worked after the free: %d "
           "of %d | lost callbacks that released/freed on the renewer thread and returned: %d "
           "of %d\n",
           med, max, renewed_after, TRIALS, returned, LIFE_KINDS);
    json_t *o = json_object();
    json_object_set_new(o, "trials", json_integer(TRIALS));
    json_object_set_new(o, "free_handle_ms_median", json_real(med));
    json_object_set_new(o, "free_handle_ms_max", json_real(max));
    json_object_set_new(o, "renewer_worked_after_free", json_integer(renewed_after));
    json_object_set_new(o, "lost_callbacks_returned", json_integer(returned));
    json_object_set_new(out, "lifetimes", o);
}

void bench_run_renewal(bench_ctx *ctx)
{
    json_t *out = json_object();
    run_intervals(ctx, out);
    run_stall(ctx, out);
    run_takeover(ctx, out);
    run_lifetimes(ctx, out);
    json_object_set_new(ctx->json, "renewal", out);
}
