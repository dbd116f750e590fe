/* Failover with a lagging replica, counted both ways (issue 9, docs/guarantees.md, "Failover
 * with asynchronous replication" and "WAIT"): the same failover repeated ROUNDS times without
 * WAIT and ROUNDS times with redsem_options_set_sync_replicas(o, 1, WAIT_MS) (1 = every
 * replica there is), for each strategy and the lock, limit 1; and, for the lock, ROUNDS times
 * with WAIT for 1 of 2 replicas, the one that did not acknowledge being promoted.
 *
 * One round: a fresh primary P and a fresh replica R, in sync (a probe write acknowledged by
 * WAIT); client A on P. Just before A's
 * try-acquire, R's replication link is cut (R is pointed at a port where nothing listens: it
 * keeps its data and cannot resync behind our back). In even rounds the link comes back
 * CATCHUP_MS later (R pointed at P again: a partial resync, a replica that catches up); in odd
 * rounds it does not come back before P dies (a replica that stays behind). As soon as A's
 * acquire returns, the link is left as it is, P's view of the semaphore is read (status), P is
 * SIGKILLed and R is promoted (REPLICAOF NO ONE, what Sentinel makes it do); then client B
 * try-acquires on R and R's view is read.
 *
 * A double grant is judged from the servers: P listed A as a live holder (its lease had r ms
 * left by P's clock) and R, the new primary, listed B as a holder less than r ms later: two
 * holders of a limit-1 permit within the same lease period. With WAIT, A's grant must either
 * have been acknowledged by R (then R still lists A after the promotion and B is refused), or
 * refused with REDSEM_EREPLICA and given back on P (P lists no holder, B gets the permit). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define ROUNDS 20
#define LEASE_MS 5000
#define WAIT_MS 300    /* WAIT's timeout; the command timeout stays the default 2000 ms */
#define CATCHUP_MS 100 /* even rounds: the cut link comes back after this */

/* ------------------------------------------------------------------ replication helpers */

static bool info_has(redisContext *c, const char *what)
{
    redisReply *r = redisCommand(c, "INFO replication");
    bool yes = r && r->type != REDIS_REPLY_ERROR && r->str && strstr(r->str, what);
    freeReplyObject(r);
    return yes;
}

static redisContext *connect_unix(const ts_server *s)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectUnixWithTimeout(s->sock, tv);
    cr_assert(c != NULL && !c->err, "hiredis connect %s", s->sock);
    return c;
}

/* Both sides agree the link is up: R says master_link_status:up, P lists R as online. */
static int wait_synced(const ts_server *p, const ts_server *r, int64_t ms)
{
    redisContext *cp = connect_unix(p), *cr = connect_unix(r);
    char online[64];
    snprintf(online, sizeof online, "port=%d,state=online", r->port);
    int64_t until = fw_now_ns() + ms * 1000000LL;
    int rc = -1;
    while (fw_now_ns() < until) {
        if (info_has(cr, "master_link_status:up") && info_has(cp, online)) {
            rc = 0;
            break;
        }
        fw_sleep_ns(2 * 1000000LL);
    }
    redisFree(cp);
    redisFree(cr);
    return rc;
}

/* A write on P that every replica acknowledged (WAIT): replication really flows. "online" in
 * P's INFO is not enough: after a diskless sync the primary holds the command stream back
 * until the replica's first acknowledgement, which came up to a second later (hence a
 * disk-based sync, which starts the stream at once: an empty RDB costs a few ms). */
static int64_t wait_acked(const ts_server *p, int nrep, int64_t ms)
{
    redisContext *c = connect_unix(p);
    int64_t t0 = fw_now_ns();
    redisReply *r = redisCommand(c, "SET failover-probe %lld", (long long)t0);
    freeReplyObject(r);
    r = redisCommand(c, "WAIT %d %lld", nrep, (long long)ms);
    bool ok = r && r->type == REDIS_REPLY_INTEGER && r->integer >= nrep;
    freeReplyObject(r);
    redisFree(c);
    return ok ? (fw_now_ns() - t0) / 1000000 : -1;
}

/* Restores R's link to P after delay_ms unless cancelled first (the runner cancels as soon
 * as A's acquire has returned, before P is killed: R must never be re-pointed at a dead P). */
typedef struct healer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool cancel, healed;
    int64_t delay_ms; /* < 0: never */
    const ts_server *replica;
    char primary_port[16];
} healer;

static void *heal_main(void *arg)
{
    healer *h = arg;
    pthread_mutex_lock(&h->mu);
    if (h->delay_ms >= 0) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        int64_t ns = dl.tv_nsec + (h->delay_ms % 1000) * 1000000LL;
        dl.tv_sec += h->delay_ms / 1000 + ns / 1000000000LL;
        dl.tv_nsec = ns % 1000000000LL;
        while (!h->cancel && pthread_cond_timedwait(&h->cv, &h->mu, &dl) == 0)
            ;
        if (!h->cancel) {
            char out[128];
            if (ts_command(h->replica, out, sizeof out, "REPLICAOF", "127.0.0.1",
                           h->primary_port, NULL) == 0)
                h->healed = true;
            else
                fprintf(stderr, "heal: REPLICAOF failed: %s\n", out);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void heal_start(healer *h, pthread_t *th, const ts_server *replica, int primary_port,
                       int64_t delay_ms)
{
    memset(h, 0, sizeof *h);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&h->mu, NULL);
    h->delay_ms = delay_ms;
    h->replica = replica;
    snprintf(h->primary_port, sizeof h->primary_port, "%d", primary_port);
    cr_assert_eq(pthread_create(th, NULL, heal_main, h), 0);
}

static void heal_stop(healer *h, pthread_t th)
{
    pthread_mutex_lock(&h->mu);
    h->cancel = true;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(th, NULL);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
}

/* ------------------------------------------------------------------ clients */

static redsem_client *client_new(const char *url, int sync_replicas)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
    /* no retry window: nothing here should ride out a dead server */
    cr_assert_eq(redsem_options_set_retry_ms(o, 0), REDSEM_OK);
    if (sync_replicas > 0)
        cr_assert_eq(redsem_options_set_sync_replicas(o, sync_replicas, WAIT_MS), REDSEM_OK);
    redsem_client *c = NULL;
    char err[256] = "";
    int rc = redsem_client_new_verbose(o, &c, err, sizeof err);
    redsem_options_free(o);
    cr_assert_eq(rc, REDSEM_OK, "connect %s: %s %s", url, redsem_err_name(rc), err);
    return c;
}

static void open_handle(fw_kind kind, redsem_client *c, const char *name, redsem_sem **s,
                        redsem_lock **l)
{
    *s = NULL;
    *l = NULL;
    int rc = kind == FW_LOCK
                 ? redsem_lock_open(c, name, LEASE_MS, l)
                 : redsem_sem_open(c, name, (redsem_strategy)kind, 1, LEASE_MS, s);
    cr_assert_eq(rc, REDSEM_OK, "open %s: %s %s", name, redsem_err_name(rc),
                 redsem_client_errmsg(c));
}

static int try_acquire_as(redsem_sem *s, redsem_lock *l, const char *id, redsem_permit **p)
{
    return s ? redsem_sem_acquire_as(s, id, 0, p) : redsem_lock_acquire_as(l, id, 0, p);
}

/* The server's view: is `id` a listed live holder, with how much lease left. */
typedef struct view {
    int rc;
    size_t holders;
    bool listed;
    int64_t left_ms;
} view;

static view server_view(redsem_sem *s, redsem_lock *l, const char *id)
{
    view v = {0};
    redsem_status *st = NULL;
    v.rc = fh_status(s, l, &st);
    if (v.rc != REDSEM_OK)
        return v;
    v.holders = redsem_status_holder_count(st);
    for (size_t i = 0; i < redsem_status_holders_listed(st); i++) {
        const char *hid = NULL;
        int64_t left = 0;
        redsem_status_holder(st, i, &hid, NULL, &left);
        if (hid && strcmp(hid, id) == 0 && left > 0) {
            v.listed = true;
            v.left_ms = left;
        }
    }
    redsem_status_free(st);
    return v;
}

/* ------------------------------------------------------------------ one round */

typedef enum outcome {
    OUT_DOUBLE,   /* two holders: A on P, B on R within A's lease */
    OUT_KEPT,     /* A acknowledged by R (or granted and R had it): R kept it, B refused */
    OUT_REFUSED,  /* A refused with REDSEM_EREPLICA and given back on P, B granted */
    OUT_OTHER,
} outcome;

typedef struct round_result {
    outcome out;
    int rc_a, rc_b;
    bool healed, a_on_p, a_on_r, b_on_r;
    int64_t acquire_ns; /* A's try-acquire, WAIT included */
    int64_t a_left_ms;  /* A's lease left on P, by P's clock, when P was read */
    int64_t gap_ms;     /* from reading P to reading R (B already granted) */
    int64_t sync_ms;    /* until a probe write was acknowledged by every replica */
} round_result;

/* One way of running the rounds: how many replicas A's client waits for, and how many
 * replicas P has. The first replica is the one whose link is cut, and the one promoted; a
 * second one, if any, stays in sync (and is left behind as the replica of a dead primary:
 * as if it had been lost with it, or Sentinel could not reach it). */
typedef struct mode {
    int wait_n; /* 0: no WAIT */
    int nrep;   /* 1 or 2 */
} mode;

static void one_round(fw_kind kind, mode md, int round, round_result *res)
{
    memset(res, 0, sizeof *res);
    bool with_wait = md.wait_n > 0;
    int cpu = fh_pinning() ? 0 : -1;
    const char *pargs[] = {"--repl-diskless-sync", "no", NULL};
    ts_server p, r, r2;
    cr_assert_eq(ts_server_start_pinned(&p, pargs, true, cpu), 0, "cannot start the primary");
    char pport[16];
    snprintf(pport, sizeof pport, "%d", p.port);
    const char *rargs[] = {"--replicaof", "127.0.0.1", pport, NULL};
    cr_assert_eq(ts_server_start_pinned(&r, rargs, true, cpu), 0, "cannot start the replica");
    if (md.nrep > 1)
        cr_assert_eq(ts_server_start_pinned(&r2, rargs, true, cpu), 0,
                     "cannot start the second replica");
    cr_assert_eq(wait_synced(&p, &r, 10000), 0, "round %d: the replica never synced", round);
    if (md.nrep > 1)
        cr_assert_eq(wait_synced(&p, &r2, 10000), 0, "round %d: replica 2 never synced", round);
    res->sync_ms = wait_acked(&p, md.nrep, 5000);
    cr_assert_geq(res->sync_ms, 0, "round %d: the replicas never acknowledged a write", round);

    char name[160];
    snprintf(name, sizeof name, "failover-%s-%s-%ld-%d", fw_kind_name(kind),
             with_wait ? "wait" : "nowait", (long)getpid(), round);
    char id_a[REDSEM_ID_BUFSIZE], id_b[REDSEM_ID_BUFSIZE];
    cr_assert_eq(redsem_id_generate(id_a), REDSEM_OK);
    cr_assert_eq(redsem_id_generate(id_b), REDSEM_OK);

    redsem_client *a = client_new(p.url, md.wait_n);
    redsem_client *mp = client_new(p.url, 0); /* reads P's view */
    redsem_sem *sa = NULL, *smp = NULL;
    redsem_lock *la = NULL, *lmp = NULL;
    open_handle(kind, a, name, &sa, &la);
    open_handle(kind, mp, name, &smp, &lmp);
    view warm = server_view(smp, lmp, id_a); /* loads the status script before the clock runs */
    cr_assert_eq(warm.rc, REDSEM_OK);

    /* the lag: R's link is cut just before the grant; even rounds it comes back soon */
    cr_assert_eq(ts_command(&r, NULL, 0, "REPLICAOF", "127.0.0.1", "1", NULL), 0);
    healer h;
    pthread_t th;
    heal_start(&h, &th, &r, p.port, round % 2 == 0 ? CATCHUP_MS : -1);
    redsem_permit *pa = NULL;
    int64_t t0 = fw_now_ns();
    res->rc_a = try_acquire_as(sa, la, id_a, &pa);
    res->acquire_ns = fw_now_ns() - t0;
    heal_stop(&h, th);
    res->healed = h.healed;
    char err_a[512];
    snprintf(err_a, sizeof err_a, "%s", redsem_client_errmsg(a));

    view vp = server_view(smp, lmp, id_a);
    int64_t t_p = fw_now_ns();
    cr_assert_eq(vp.rc, REDSEM_OK, "status on the primary: %s", redsem_err_name(vp.rc));
    res->a_on_p = vp.listed;
    res->a_left_ms = vp.left_ms;

    ts_server_kill(&p); /* the primary dies */
    cr_assert_eq(ts_command(&r, NULL, 0, "REPLICAOF", "NO", "ONE", NULL), 0);

    redsem_client *b = client_new(r.url, 0);
    redsem_sem *sb = NULL;
    redsem_lock *lb = NULL;
    open_handle(kind, b, name, &sb, &lb);
    redsem_permit *pb = NULL;
    res->rc_b = try_acquire_as(sb, lb, id_b, &pb);
    view vb = server_view(sb, lb, id_b);
    res->gap_ms = (fw_now_ns() - t_p) / 1000000LL;
    cr_assert_eq(vb.rc, REDSEM_OK, "status on the promoted replica: %s", redsem_err_name(vb.rc));
    res->b_on_r = vb.listed;
    view va = server_view(sb, lb, id_a);
    res->a_on_r = va.listed;

    if (res->a_on_p && res->b_on_r && res->gap_ms < res->a_left_ms)
        res->out = OUT_DOUBLE;
    else if (res->a_on_r && !res->b_on_r && res->rc_b == REDSEM_EBUSY &&
             res->rc_a == REDSEM_OK)
        res->out = OUT_KEPT;
    else if (res->rc_a == REDSEM_EREPLICA && !res->a_on_p && vp.holders == 0 &&
             res->rc_b == REDSEM_OK && res->b_on_r)
        res->out = OUT_REFUSED;
    else
        res->out = OUT_OTHER;
    if (res->out == OUT_OTHER || (md.wait_n >= md.nrep && res->out == OUT_DOUBLE))
        fprintf(stderr,
                "  round %d (%s, WAIT %d of %d replicas): A %s (%s), healed=%d, P listed A=%d (%lld ms left, "
                "%zu holders), R listed A=%d B=%d, B %s, %lld ms between the views\n",
                round, fw_kind_name(kind), md.wait_n, md.nrep,
                redsem_err_name(res->rc_a), err_a, res->healed, res->a_on_p,
                (long long)res->a_left_ms, vp.holders, res->a_on_r, res->b_on_r,
                redsem_err_name(res->rc_b), (long long)res->gap_ms);

    redsem_permit_free(pa);
    redsem_permit_free(pb);
    redsem_sem_free(sa);
    redsem_sem_free(smp);
    redsem_sem_free(sb);
    redsem_lock_free(la);
    redsem_lock_free(lmp);
    redsem_lock_free(lb);
    redsem_client_free(a);
    redsem_client_free(mp);
    redsem_client_free(b);
    ts_server_kill(&r);
    ts_server_stop(&r);
    if (md.nrep > 1) {
        ts_server_kill(&r2);
        ts_server_stop(&r2);
    }
    ts_server_stop(&p);
}

/* ------------------------------------------------------------------ both ways */

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

typedef struct mode_summary {
    int n[4];
    int healed;
    int64_t acq_ms_p50, acq_ms_max, left_min, left_max, gap_max;
    int64_t acq_ms_max_by[4]; /* A's slowest acquire per outcome */
    int64_t sync_max;         /* slowest probe write acknowledged by every replica */
    char pattern[ROUNDS + 1]; /* per round: D double, K kept, R refused, ? other */
    double secs;
} mode_summary;

static void run_mode(fw_kind kind, mode md, mode_summary *m)
{
    memset(m, 0, sizeof *m);
    int64_t acq[ROUNDS];
    m->left_min = INT64_MAX;
    int64_t t0 = fw_now_ns();
    for (int i = 0; i < ROUNDS; i++) {
        round_result res;
        one_round(kind, md, i, &res);
        m->n[res.out]++;
        m->healed += res.healed;
        acq[i] = res.acquire_ns;
        m->pattern[i] = "DKR?"[res.out];
        if (res.acquire_ns / 1000000 > m->acq_ms_max_by[res.out])
            m->acq_ms_max_by[res.out] = res.acquire_ns / 1000000;
        if (res.gap_ms > m->gap_max)
            m->gap_max = res.gap_ms;
        if (res.sync_ms > m->sync_max)
            m->sync_max = res.sync_ms;
        if (res.a_on_p) {
            if (res.a_left_ms < m->left_min)
                m->left_min = res.a_left_ms;
            if (res.a_left_ms > m->left_max)
                m->left_max = res.a_left_ms;
        }
    }
    m->pattern[ROUNDS] = '\0';
    m->secs = (double)(fw_now_ns() - t0) / 1e9;
    qsort(acq, ROUNDS, sizeof *acq, cmp_i64);
    m->acq_ms_p50 = acq[ROUNDS / 2] / 1000000;
    m->acq_ms_max = acq[ROUNDS - 1] / 1000000;
    if (m->left_min == INT64_MAX)
        m->left_min = 0;
}

static void failover_both_ways(fw_kind kind)
{
    fh_run run;
    char label[64];
    snprintf(label, sizeof label, "failover-wait-%s", fw_kind_name(kind));
    fh_setup(&run, label, kind, 1, LEASE_MS, (const char *const *)-1, false);
    if (ts_redis_server_path() == NULL)
        cr_skip_test("redis-server is not installed");
    mode_summary off, on;
    run_mode(kind, (mode){0, 1}, &off);
    fprintf(stderr,
            "LIMIT failover x%d without WAIT (%s, limit 1): %d double grants, %d kept by the "
            "promoted replica, %d other [%s]; the replica's link was cut before each grant "
            "(to come back after %d ms in even rounds: back before the acquire returned in %d); "
            "the old primary listed A with %lld-%lld ms of lease left, and B was granted on "
            "the new one at most %lld ms later; A's acquire p50 %lld ms, max %lld ms; replica "
            "in sync before each round within %lld ms; %.1f s\n",
            ROUNDS, fw_kind_name(kind), off.n[OUT_DOUBLE], off.n[OUT_KEPT],
            off.n[OUT_OTHER] + off.n[OUT_REFUSED], off.pattern, CATCHUP_MS, off.healed,
            (long long)off.left_min, (long long)off.left_max, (long long)off.gap_max,
            (long long)off.acq_ms_p50, (long long)off.acq_ms_max, (long long)off.sync_max,
            off.secs);
    run_mode(kind, (mode){1, 1}, &on);
    fprintf(stderr,
            "LIMIT failover x%d with WAIT for 1 of 1 replica (every replica), %d ms (%s, "
            "limit 1): %d double "
            "grants; %d acknowledged by the replica and kept after the promotion (B refused), "
            "%d refused with REDSEM_EREPLICA and given back (B granted), %d other [%s]; link "
            "back before the acquire returned in %d rounds; A's acquire p50 %lld ms, at most "
            "%lld ms when kept, %lld ms when refused; replica in sync before each round within "
            "%lld ms; %.1f s\n",
            ROUNDS, WAIT_MS, fw_kind_name(kind), on.n[OUT_DOUBLE], on.n[OUT_KEPT],
            on.n[OUT_REFUSED], on.n[OUT_OTHER], on.pattern, on.healed,
            (long long)on.acq_ms_p50, (long long)on.acq_ms_max_by[OUT_KEPT],
            (long long)on.acq_ms_max_by[OUT_REFUSED], (long long)on.sync_max, on.secs);
    cr_expect_gt(off.n[OUT_DOUBLE], 0, "without WAIT the documented limit should show");
    cr_expect_eq(on.n[OUT_DOUBLE], 0, "with WAIT for every replica: no double grant");
    cr_expect_eq(on.n[OUT_KEPT] + on.n[OUT_REFUSED], ROUNDS,
                 "with WAIT every grant is either kept or refused and given back");
    fh_teardown(&run);
}

Test(failover, wait_lock, .timeout = 120) { failover_both_ways(FW_LOCK); }
Test(failover, wait_fair, .timeout = 120) { failover_both_ways(FW_FAIR); }
Test(failover, wait_basic, .timeout = 120) { failover_both_ways(FW_BASIC); }
Test(failover, wait_locked, .timeout = 120) { failover_both_ways(FW_LOCKED); }

/* What WAIT does not promise: waiting for fewer replicas than there are. P has two replicas,
 * A's client waits for 1; the one whose link is cut is the one promoted (the other one, which
 * acknowledged at once, is lost with the primary or unreachable). The same rounds as above
 * otherwise. */
Test(failover, wait_for_fewer_than_every_replica_lock, .timeout = 120)
{
    fh_run run;
    fh_setup(&run, "failover-wait-1-of-2-lock", FW_LOCK, 1, LEASE_MS, (const char *const *)-1,
             false);
    if (ts_redis_server_path() == NULL)
        cr_skip_test("redis-server is not installed");
    mode_summary m;
    run_mode(FW_LOCK, (mode){1, 2}, &m);
    fprintf(stderr,
            "LIMIT failover x%d with WAIT for 1 of 2 replicas, %d ms, the one that had not "
            "acknowledged promoted (lock, limit 1): %d double grants, %d kept, %d other [%s]; "
            "A's acquire p50 %lld ms, max %lld ms; %.1f s\n",
            ROUNDS, WAIT_MS, m.n[OUT_DOUBLE], m.n[OUT_KEPT], m.n[OUT_REFUSED] + m.n[OUT_OTHER],
            m.pattern, (long long)m.acq_ms_p50, (long long)m.acq_ms_max, m.secs);
    cr_expect_gt(m.n[OUT_DOUBLE], 0,
                 "WAIT for 1 of 2 replicas does not protect a grant when the other is promoted");
    fh_teardown(&run);
}
