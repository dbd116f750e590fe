/* Scenario 4, a holder cut off from Redis for 2 s while it holds (renewing), and replies
 * dropped during an acquire.
 *
 * Cut-off: each worker reaches Redis through its own path, so one worker can be cut off
 * alone: a fault-injecting proxy in BLACKHOLE mode (works anywhere; bytes wait and flow on
 * heal, as TCP retransmission would, unless the client aborted the connection), and, as
 * root where iptables works, DROP rules on a per-worker loopback address (the real kernel
 * behaviour; skipped with a message elsewhere). Expected: the victim learns it lost by its
 * validity deadline, which is no later than its lease's expiry on the server (status: lease
 * left), a waiter is granted the permit within lease + 250 ms (by the send time of the
 * server's grants that brought the capacity back: a worker running late on a loaded machine
 * does not count; wall-clock bounds only against a hang), nothing ever exceeds the limit, and
 * no permit stays held on the server beyond lease + 1 s after the last thing its holder did
 * (no request abandoned during the partition is applied when it heals).
 *
 * Replies dropped: an acquire whose reply is lost reports REDSEM_EUNKNOWN (not "busy"), the
 * permit it may hold expires within lease + drift, and acquiring again with the same id
 * tells the truth, idempotently. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define LEASE_MS 1000
#define CUT_MS 2000
#define CMD_TIMEOUT_MS 300
#define ROUNDS 2

/* ------------------------------------------------------------------ cutting a worker off */

typedef struct cutter {
    bool iptables;
    fp_proxy *proxy[FW_MAX_SLOTS];
    char addr[FW_MAX_SLOTS][32];
    int port;
    char comment[64];
} cutter;

static int sh_run(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void ipt_rules(cutter *k, int slot, bool add)
{
    char cmd[512];
    const char *op = add ? "-I" : "-D";
    snprintf(cmd, sizeof cmd,
             "iptables -w %s OUTPUT -o lo -p tcp -d %s --dport %d -m comment --comment %s "
             "-j DROP && iptables -w %s OUTPUT -o lo -p tcp -s %s --sport %d -m comment "
             "--comment %s -j DROP",
             op, k->addr[slot], k->port, k->comment, op, k->addr[slot], k->port, k->comment);
    int rc = sh_run(cmd);
    if (add)
        cr_assert_eq(rc, 0, "%s", cmd);
}

static void cut(cutter *k, fh_run *r, int slot, bool on)
{
    fh_fault(r, on ? "cut" : "heal", on);
    if (k->iptables)
        ipt_rules(k, slot, on);
    else
        fp_proxy_set_mode(k->proxy[slot], on ? FP_BLACKHOLE : FP_PASS);
}

static bool iptables_usable(char *why, size_t len)
{
    if (geteuid() != 0) {
        snprintf(why, len, "not root");
        return false;
    }
    if (sh_run("iptables -w -L OUTPUT -n >/dev/null 2>&1") != 0) {
        snprintf(why, len, "'iptables -L OUTPUT' fails (no iptables, or not permitted here)");
        return false;
    }
    return true;
}

/* The last time anything happened to each holder id, from the logs. */
typedef struct last_seen {
    char id[REDSEM_ID_BUFSIZE];
    int64_t t;
} last_seen;

static int cmp_ls(const void *a, const void *b)
{
    return strcmp(((const last_seen *)a)->id, ((const last_seen *)b)->id);
}

/* No permit stays held on the server beyond lease + 1 s after its holder's last event. */
static size_t held_beyond(fh_run *r, int64_t *worst_ms)
{
    fw_event *ev = NULL;
    ssize_t n = fw_logs_read(r->dir, &ev);
    cr_assert_geq(n, 0);
    last_seen *ls = calloc((size_t)n + 1, sizeof *ls);
    size_t nl = 0;
    for (ssize_t i = 0; i < n; i++) {
        if (strlen(ev[i].id) != REDSEM_ID_LEN)
            continue;
        snprintf(ls[nl].id, sizeof ls[nl].id, "%s", ev[i].id);
        ls[nl].t = ev[i].t_ns;
        nl++;
    }
    qsort(ls, nl, sizeof *ls, cmp_ls);
    size_t k = 0;
    for (size_t i = 0; i < nl; i++) { /* keep the latest per id */
        if (k > 0 && strcmp(ls[k - 1].id, ls[i].id) == 0) {
            if (ls[i].t > ls[k - 1].t)
                ls[k - 1].t = ls[i].t;
        } else {
            ls[k++] = ls[i];
        }
    }
    nl = k;
    size_t bad = 0;
    *worst_ms = 0;
    size_t ns = atomic_load(&r->nsamples);
    for (size_t i = 0; i < ns; i++) {
        last_seen key;
        snprintf(key.id, sizeof key.id, "%s", r->samples[i].id);
        last_seen *f = bsearch(&key, ls, nl, sizeof *ls, cmp_ls);
        int64_t over = f ? (r->samples[i].t_ns - f->t) / 1000000 - LEASE_MS : INT64_MAX;
        if (over > *worst_ms)
            *worst_ms = over;
        if (over > 1000) {
            if (bad < 5)
                fprintf(stderr, "  held beyond: %s seen on the server %lld ms after lease + "
                                "its holder's last event (%s)\n",
                        key.id, (long long)over, f ? "known id" : "unknown id");
            bad++;
        }
    }
    free(ls);
    free(ev);
    return bad;
}

/* When the granting request of holder `id` was sent, from its EV_ACQ (validity deadline =
 * sent + lease - drift): no later than the grant on the server, whenever the worker ran
 * after it. Waits up to ms for the event (the worker logs it after the reply); -1 if none. */
static int64_t grant_sent(fh_run *r, const char *id, int64_t ms)
{
    int64_t until = fw_now_ns() + ms * 1000000LL;
    for (;;) {
        fw_event *ev = NULL;
        ssize_t n = fw_logs_read(r->dir, &ev);
        int64_t sent = -1;
        for (ssize_t i = 0; i < n; i++)
            if (ev[i].ev == EV_ACQ && strcmp(ev[i].id, id) == 0)
                sent = ev[i].a - (r->lease_ms - (r->lease_ms / 100 + 2)) * 1000000LL;
        free(ev);
        if (sent >= 0 || fw_now_ns() >= until)
            return sent;
        fw_sleep_ns(2000000);
    }
}

/* The capacity back without the victim, as the server saw it: the first status after t_cut
 * (from sample `from` on) that lists `limit` holders other than the victim; they all held
 * since their grants, so the capacity was back by the latest of their grants (the requests'
 * send times: however late the poller or the workers ran afterwards). Waits up to ms for such
 * a status; -1 if none. */
static int64_t full_again(fh_run *r, const char *victim, int64_t t_cut, size_t from, int64_t ms)
{
    int64_t until = fw_now_ns() + ms * 1000000LL;
    size_t i = from;
    for (;;) {
        size_t n = atomic_load(&r->nsamples);
        while (i < n) { /* one status: the samples of one poll share t_ns */
            size_t j = i;
            int others = 0;
            while (j < n && r->samples[j].t_ns == r->samples[i].t_ns)
                others += strcmp(r->samples[j++].id, victim) != 0;
            if (j == n && n < FH_MAX_SAMPLES)
                break; /* maybe still being recorded */
            if (r->samples[i].t_ns >= t_cut && others >= (int)r->limit) {
                int64_t full = t_cut;
                for (size_t k = i; k < j; k++) {
                    if (strcmp(r->samples[k].id, victim) == 0)
                        continue;
                    int64_t sent = grant_sent(r, r->samples[k].id, 5000);
                    cr_assert_geq(sent, 0, "holder %s has no grant in the logs",
                                  r->samples[k].id);
                    if (sent > full)
                        full = sent;
                }
                return full - t_cut;
            }
            i = j;
        }
        if (fw_now_ns() >= until)
            return -1;
        fw_sleep_ns(5000000);
    }
}

/* The latest expiry of holder `id`'s lease seen by the server (status asked + lease left,
 * test's clock): it expires no earlier than that. -1 if never listed. */
static int64_t server_expiry(fh_run *r, const char *id)
{
    int64_t latest = -1;
    size_t n = atomic_load(&r->nsamples);
    for (size_t i = 0; i < n; i++)
        if (strcmp(r->samples[i].id, id) == 0 &&
            r->samples[i].t_ns + r->samples[i].remaining_ms * 1000000LL > latest)
            latest = r->samples[i].t_ns + r->samples[i].remaining_ms * 1000000LL;
    return latest;
}

static void partition(fw_kind kind, bool iptables)
{
    char why[128];
    if (iptables && !iptables_usable(why, sizeof why))
        cr_skip_test("SKIP iptables partition: %s; the proxy variant covers the scenario", why);
    fh_run r;
    char label[64];
    snprintf(label, sizeof label, "partition-%s-%s", iptables ? "iptables" : "proxy",
             fw_kind_name(kind));
    uint32_t limit = kind == FW_LOCK ? 1 : 3;
    int workers = (int)limit + 3;
    static cutter k;
    memset(&k, 0, sizeof k);
    k.iptables = iptables;
    const char *bind_args[8] = {NULL};
    char binds[512] = "127.0.0.1";
    if (iptables) {
        for (int i = 0; i < workers; i++) {
            snprintf(k.addr[i], sizeof k.addr[i], "127.0.0.%d", 100 + i);
            strcat(binds, " ");
            strcat(binds, k.addr[i]);
        }
        bind_args[0] = "--bind";
        bind_args[1] = binds;
        snprintf(k.comment, sizeof k.comment, "redsem-fault-%ld", (long)getpid());
    }
    fh_setup(&r, label, kind, limit, LEASE_MS, iptables ? bind_args : NULL, true);
    k.port = r.srv.port;
    fh_monitor_start(&r, 10, true);
    char tmo[16];
    snprintf(tmo, sizeof tmo, "%d", CMD_TIMEOUT_MS);
    const char *args[] = {"--hold-min-us", "300000", "--hold-max-us", "1500000", "--renew",
                          "--timeout-ms", "3000", "--cmd-timeout-ms", tmo, NULL};
    for (int i = 0; i < workers; i++) {
        char url[128];
        if (iptables) {
            snprintf(url, sizeof url, "redis://%s:%d", k.addr[i], r.srv.port);
        } else {
            k.proxy[i] = fp_proxy_start(r.srv.port);
            cr_assert_not_null(k.proxy[i]);
            snprintf(url, sizeof url, "redis://127.0.0.1:%d", fp_proxy_port(k.proxy[i]));
        }
        fh_spawn(&r, url, args);
    }
    int64_t worst_rec = 0, worst_learn = 0, worst_late = INT64_MIN, worst_margin = INT64_MAX;
    int losses = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int v = fh_pick_holder(&r, -1, 5000);
        cr_assert_geq(v, 0, "nobody holds");
        uint64_t vtok = atomic_load(&r.sh->slot[v].token);
        char vid[REDSEM_ID_BUFSIZE];
        memcpy(vid, r.sh->slot[v].id, sizeof vid);
        vid[sizeof vid - 1] = 0;
        size_t from = atomic_load(&r.nsamples);
        int64_t t_cut = fw_now_ns();
        cut(&k, &r, v, true);
        /* wall clock only against a hang: the workers may run late on a loaded machine */
        int64_t seen = fh_wait_full(&r, v, t_cut, LEASE_MS + 10000);
        cr_expect_geq(seen, 0, "round %d: nobody got the victim's permit", round);
        /* a waiter gets the permit within lease + 250 ms: measured by the server (the grant
         * that brought the capacity back), not when a worker got round to writing */
        int64_t rec = full_again(&r, vid, t_cut, from, 5000);
        cr_expect_geq(rec, 0, "round %d: the server never listed the capacity back", round);
        rec /= 1000000;
        cr_expect_leq(rec, LEASE_MS + 250, "round %d: the server granted the capacity back "
                      "%lld ms after the cut (a worker saw it after %lld ms)", round,
                      (long long)rec, (long long)(seen / 1000000));
        if (rec > worst_rec)
            worst_rec = rec;
        fw_event lost, end; /* the hold ends (EV_END) after the loss, if any, is logged */
        bool ended = fh_wait_event(&r, v, EV_END, vtok, t_cut, CUT_MS + 10000, &end);
        cr_expect(ended, "round %d: the victim's hold never ended", round);
        if (ended) {
            /* its validity deadline (where it stops, lost or not) is no later than its
             * lease's expiry on the server (status: lease left), so it stops before anyone
             * else can be granted its permit: measured by the server, not by when the worker
             * got round to noticing */
            int64_t expiry = server_expiry(&r, vid);
            cr_expect_geq(expiry, 0, "round %d: the server never listed the victim", round);
            int64_t margin = (expiry - end.a) / 1000000;
            cr_expect_geq(margin, 0, "round %d: the victim's validity deadline was %lld ms "
                          "after its lease's expiry on the server", round, (long long)-margin);
            if (margin < worst_margin)
                worst_margin = margin;
        }
        if (ended && fh_wait_event(&r, v, EV_LOST, vtok, t_cut, 0, &lost)) {
            /* it learns it lost by that deadline (held() is false from then on; the renewer
             * warns a little early) */
            losses++;
            int64_t late = (lost.t_ns - lost.b) / 1000000;
            cr_expect_leq(late, LEASE_MS, "round %d: the victim noticed the loss %lld ms after "
                          "its deadline (wall clock: only against a holder that never notices)",
                          round, (long long)late);
            if (late > worst_late)
                worst_late = late;
            int64_t learn = (lost.t_ns - t_cut) / 1000000;
            if (learn > worst_learn)
                worst_learn = learn;
        } /* else its hold ended normally before the lease could run out */
        fw_sleep_until_ns(t_cut + CUT_MS * 1000000LL);
        cut(&k, &r, v, false);
        fw_sleep_ns(700 * 1000000LL);
    }
    fh_finish(&r, 8000);
    fw_sleep_ns((LEASE_MS + 1500) * 1000000LL); /* let the monitor see any zombie */
    fh_monitor_stop(&r);
    fw_check_result res;
    fh_check(&r, &res);
    int64_t worst_over = 0;
    size_t beyond = held_beyond(&r, &worst_over);
    size_t dropped = 0;
    for (int i = 0; i < workers; i++) {
        if (k.proxy[i])
            dropped += fp_proxy_dropped_on_heal(k.proxy[i]);
        fp_proxy_stop(k.proxy[i]);
    }
    fprintf(stderr,
            "SCENARIO 4 %s: %d cut-offs of %d ms; handed over after at worst %lld ms (bound "
            "%d, by the server's grants); victim's deadline at least %lld ms before its lease's "
            "expiry on the server; victim lost in %d rounds, learned after at worst %lld ms "
            "(worker's clock, %lld ms after its deadline); unknown outcomes %zu; server "
            "samples %zu, held beyond lease + 1 s: %zu (worst %lld ms past the lease); "
            "aborted connections dropped on heal %zu\n",
            label, ROUNDS, CUT_MS, (long long)worst_rec, LEASE_MS + 250, (long long)worst_margin, losses, (long long)worst_learn,
            (long long)(losses ? worst_late : 0), res.unknown, atomic_load(&r.nsamples), beyond,
            (long long)worst_over, dropped);
    cr_expect_eq(res.violations, 0, "checker: %zu violations", res.violations);
    cr_expect_eq(atomic_load(&r.sh->nviol), 0);
    cr_expect_leq(atomic_load(&r.mon_max_holders), (int)limit);
    cr_expect_eq(beyond, 0, "%zu server observations of a permit held beyond lease + 1 s",
                 beyond);
    if (iptables)
        for (int i = 0; i < workers; i++)
            ipt_rules(&k, i, false);
    fh_quiescence(&r);
    fh_teardown(&r);
}

Test(partition, proxy_basic, .timeout = 120) { partition(FW_BASIC, false); }
Test(partition, proxy_fair, .timeout = 120) { partition(FW_FAIR, false); }
Test(partition, proxy_locked, .timeout = 120) { partition(FW_LOCKED, false); }
Test(partition, proxy_lock, .timeout = 120) { partition(FW_LOCK, false); }
Test(partition, iptables_basic, .timeout = 120) { partition(FW_BASIC, true); }
Test(partition, iptables_lock, .timeout = 120) { partition(FW_LOCK, true); }

/* ------------------------------------------------------------------ replies dropped */

static void dropped_replies(fw_kind kind)
{
    fh_run r;
    char label[64];
    snprintf(label, sizeof label, "dropped-replies-%s", fw_kind_name(kind));
    uint32_t limit = kind == FW_LOCK ? 1 : 2;
    fh_setup(&r, label, kind, limit, LEASE_MS, NULL, true);
    fp_proxy *px = fp_proxy_start(r.srv.port);
    cr_assert_not_null(px);
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", fp_proxy_port(px));
    redsem_client *c = fh_client(url, -1, CMD_TIMEOUT_MS);
    redsem_client *obs = fh_client(r.srv.url, -1, -1);
    redsem_sem *s = NULL, *os = NULL;
    redsem_lock *l = NULL, *ol = NULL;
    fh_open(&r, c, &s, &l);
    fh_open(&r, obs, &os, &ol);
    /* load the scripts first: a lost SCRIPT LOAD reply is a plain timeout (nothing applied) */
    redsem_permit *w = NULL;
    cr_assert_eq(fh_acquire(s, l, 0, &w), REDSEM_OK);
    cr_assert_eq(redsem_permit_refresh(w), REDSEM_OK);
    cr_assert_eq(redsem_permit_release(w), REDSEM_OK);
    redsem_permit_free(w);
    int unknown = 0, cases = 0;
    int64_t worst_gone = 0;
    /* case 0: a free permit, try-acquire; case 1: a free permit, blocking acquire; case 2:
     * all permits held, blocking acquire (whatever the server did, the reply is lost) */
    for (int cs = 0; cs < 3; cs++) {
        redsem_permit *held[4] = {0};
        if (cs == 2)
            for (uint32_t i = 0; i < limit; i++)
                cr_assert_eq(fh_acquire(os, ol, 2000, &held[i]), REDSEM_OK);
        char id[REDSEM_ID_BUFSIZE];
        redsem_id_generate(id);
        fp_proxy_set_mode(px, FP_DROP_EVAL_REPLIES);
        redsem_permit *p = NULL;
        int64_t t0 = fw_now_ns();
        int rc = s ? redsem_sem_acquire_as(s, id, cs == 0 ? 0 : 2000, &p)
                   : redsem_lock_acquire_as(l, id, cs == 0 ? 0 : 2000, &p);
        int64_t t_ret = fw_now_ns();
        fp_proxy_set_mode(px, FP_PASS);
        {
            redsem_client_stats cst;
            redsem_client_get_stats(c, &cst);
            fprintf(stderr, "  case %d: %s after %lld ms; requests %llu connects %llu retries %llu\n",
                    cs, redsem_err_name(rc), (long long)((t_ret - t0) / 1000000),
                    (unsigned long long)cst.requests, (unsigned long long)cst.connects,
                    (unsigned long long)cst.retries);
        }
        cases++;
        cr_expect_eq(rc, REDSEM_EUNKNOWN, "case %d: a lost reply gave %s (%s)", cs,
                     redsem_err_name(rc), redsem_client_errmsg(c));
        unknown += rc == REDSEM_EUNKNOWN;
        cr_expect_leq((t_ret - t0) / 1000000, CMD_TIMEOUT_MS + 100,
                      "case %d: took %lld ms", cs, (long long)((t_ret - t0) / 1000000));
        cr_expect(strstr(redsem_client_errmsg(c), id) != NULL,
                  "the message names the holder id: %s", redsem_client_errmsg(c));
        for (uint32_t i = 0; i < limit; i++) {
            if (held[i]) {
                cr_expect_eq(redsem_permit_release(held[i]), REDSEM_OK);
                redsem_permit_free(held[i]);
            }
        }
        /* case 2, fair and locked: a release hands a permit to the queue's head, which may
         * be the lost acquire's entry (within its not-after time): granted by then at the
         * latest */
        int64_t t_grant = cs == 2 ? fw_now_ns() : t_ret;
        if (cs == 1) {
            /* acquiring again with the same id tells the truth: the same grant (waiting, for
             * the locked strategy's guard, left to expire by the failed attempt) */
            redsem_permit *q = NULL;
            rc = s ? redsem_sem_acquire_as(s, id, 2000, &q)
                   : redsem_lock_acquire_as(l, id, 2000, &q);
            cr_expect_eq(rc, REDSEM_OK, "retry with the same id: %s", redsem_err_name(rc));
            if (q) {
                cr_expect_eq(redsem_permit_release(q), REDSEM_OK);
                redsem_permit_free(q);
            }
            continue;
        }
        /* otherwise the permit it may hold expires by itself within lease + drift of its
         * grant: at the latest the unknown outcome (t_ret), or in case 2 the releases
         * (t_grant). Measured by the server: each status lists the holder with its lease
         * left by the server's clock, so it expires no earlier than the moment the status
         * was asked + that; this must be within the bound (the poller's own lateness, on a
         * loaded machine, does not count). Then it must be gone: a generous wall-clock
         * bound only against a permit that never goes. */
        int64_t expires = t_grant; /* the latest expiry seen, test's clock */
        bool gone = false;
        while (fw_now_ns() - t_ret < (LEASE_MS + 10000) * 1000000LL) {
            redsem_status *st = NULL;
            int64_t asked = fw_now_ns();
            cr_assert_eq(fh_status(os, ol, &st), REDSEM_OK);
            bool there = false;
            for (size_t i = 0; i < redsem_status_holders_listed(st); i++) {
                const char *hid;
                int64_t left = 0;
                redsem_status_holder(st, i, &hid, NULL, &left);
                if (strcmp(hid, id) == 0) {
                    there = true;
                    if (asked + left * 1000000LL > expires)
                        expires = asked + left * 1000000LL;
                }
            }
            redsem_status_free(st);
            if (!there) {
                gone = true;
                break;
            }
            fw_sleep_ns(5000000);
        }
        int64_t held_ms = (expires - t_grant) / 1000000;
        cr_expect(gone, "case %d: the maybe-held permit never went away", cs);
        cr_expect_leq(held_ms, LEASE_MS + LEASE_MS / 100 + 2 + 20,
                      "case %d: held by the server until %lld ms after its last possible "
                      "grant (%lld ms after the unknown outcome)", cs, (long long)held_ms,
                      (long long)((t_grant - t_ret) / 1000000));
        if (held_ms > worst_gone)
            worst_gone = held_ms;
    }
    fprintf(stderr, "SCENARIO 4 %s: %d/%d acquires with a lost reply reported REDSEM_EUNKNOWN; "
                    "a maybe-held permit was held by the server at worst until %lld ms after its "
                    "last possible grant (lease %d + drift %d)\n",
            label, unknown, cases, (long long)worst_gone, LEASE_MS, LEASE_MS / 100 + 2);
    redsem_sem_free(s);
    redsem_lock_free(l);
    redsem_sem_free(os);
    redsem_lock_free(ol);
    redsem_client_free(c);
    redsem_client_free(obs);
    fp_proxy_stop(px);
    fh_teardown(&r);
}

Test(partition, dropped_replies_basic, .timeout = 60) { dropped_replies(FW_BASIC); }
Test(partition, dropped_replies_fair, .timeout = 60) { dropped_replies(FW_FAIR); }
Test(partition, dropped_replies_locked, .timeout = 60) { dropped_replies(FW_LOCKED); }
Test(partition, dropped_replies_lock, .timeout = 60) { dropped_replies(FW_LOCK); }

/* ------------------------------------------------------------------ abandoned requests */

/* An acquire sent into a partition times out (REDSEM_EUNKNOWN) and the library gives the
 * connection up. When the partition heals, that request must not reach the server: a permit
 * granted then would be held by nobody for a whole lease, long after the caller was told
 * "maybe, until lease + drift". */
static void abandoned(fw_kind kind, bool iptables)
{
    char why[128];
    if (iptables && !iptables_usable(why, sizeof why))
        cr_skip_test("SKIP iptables partition: %s; the proxy variant covers the scenario", why);
    fh_run r;
    char label[64];
    snprintf(label, sizeof label, "abandoned-%s-%s", iptables ? "iptables" : "proxy",
             fw_kind_name(kind));
    static cutter k;
    memset(&k, 0, sizeof k);
    k.iptables = iptables;
    const char *bind_args[] = {"--bind", "127.0.0.1 127.0.0.100", NULL};
    snprintf(k.addr[0], sizeof k.addr[0], "127.0.0.100");
    snprintf(k.comment, sizeof k.comment, "redsem-fault-%ld", (long)getpid());
    fh_setup(&r, label, kind, kind == FW_LOCK ? 1 : 2, LEASE_MS, iptables ? bind_args : NULL,
             true);
    k.port = r.srv.port;
    char url[128];
    if (iptables) {
        snprintf(url, sizeof url, "redis://127.0.0.100:%d", r.srv.port);
    } else {
        k.proxy[0] = fp_proxy_start(r.srv.port);
        snprintf(url, sizeof url, "redis://127.0.0.1:%d", fp_proxy_port(k.proxy[0]));
    }
    redsem_client *c = fh_client(url, -1, CMD_TIMEOUT_MS);
    redsem_client *obs = fh_client(r.srv.url, -1, -1);
    redsem_sem *s = NULL, *os = NULL;
    redsem_lock *l = NULL, *ol = NULL;
    fh_open(&r, c, &s, &l);
    fh_open(&r, obs, &os, &ol);
    redsem_permit *w = NULL; /* load the scripts */
    cr_assert_eq(fh_acquire(s, l, 0, &w), REDSEM_OK);
    cr_assert_eq(redsem_permit_release(w), REDSEM_OK);
    redsem_permit_free(w);
    int zombies = 0;
    for (int round = 0; round < 1; round++) {
        char id[REDSEM_ID_BUFSIZE];
        redsem_id_generate(id);
        cr_assert_eq(redsem_client_ping(c), REDSEM_OK); /* connected before the cut */
        cut(&k, &r, 0, true);
        redsem_permit *p = NULL;
        int rc = s ? redsem_sem_acquire_as(s, id, 0, &p) : redsem_lock_acquire_as(l, id, 0, &p);
        /* locked: the guard's SET NX is the request that times out (nothing granted) */
        cr_expect(rc == REDSEM_EUNKNOWN || (kind == FW_LOCKED && rc == REDSEM_ETIMEDOUT),
                  "an acquire into the partition gave %s", redsem_err_name(rc));
        fw_sleep_ns(1500 * 1000000LL);
        cut(&k, &r, 0, false);
        int64_t t_heal = fw_now_ns();
        bool seen = false;
        /* loopback retransmissions back off 0.2, 0.4, 0.8, 1.6 s: the one after a 1.5 s
         * partition comes about 1.5 s after the heal */
        while (!seen && fw_now_ns() - t_heal < 2500 * 1000000LL) {
            redsem_status *st = NULL;
            cr_assert_eq(fh_status(os, ol, &st), REDSEM_OK);
            for (size_t i = 0; i < redsem_status_holders_listed(st); i++) {
                const char *hid;
                redsem_status_holder(st, i, &hid, NULL, NULL);
                seen |= strcmp(hid, id) == 0;
            }
            redsem_status_free(st);
            fw_sleep_ns(10 * 1000000LL);
        }
        if (seen)
            fprintf(stderr, "  round %d: the abandoned acquire was granted %lld ms after the "
                            "heal, %lld ms after the caller got REDSEM_EUNKNOWN\n",
                    round, (long long)((fw_now_ns() - t_heal) / 1000000),
                    (long long)((fw_now_ns() - t_heal) / 1000000 + 1500));
        zombies += seen;
    }
    fprintf(stderr, "SCENARIO 4 %s: abandoned acquires applied after the heal: %d of 1%s\n",
            label, zombies,
            iptables ? "" : (fp_proxy_dropped_on_heal(k.proxy[0]) ? " (aborted connections "
                                                                     "dropped on heal)"
                                                                   : ""));
    cr_expect_eq(zombies, 0, "%d acquires abandoned with REDSEM_EUNKNOWN were applied when the "
                             "partition healed",
                 zombies);
    redsem_sem_free(s);
    redsem_lock_free(l);
    redsem_sem_free(os);
    redsem_lock_free(ol);
    redsem_client_free(c);
    redsem_client_free(obs);
    fp_proxy_stop(k.proxy[0]);
    if (iptables)
        ipt_rules(&k, 0, false);
    fh_teardown(&r);
}

Test(partition, abandoned_acquire_proxy_basic, .timeout = 60) { abandoned(FW_BASIC, false); }
Test(partition, abandoned_acquire_proxy_fair, .timeout = 60) { abandoned(FW_FAIR, false); }
Test(partition, abandoned_acquire_proxy_locked, .timeout = 60) { abandoned(FW_LOCKED, false); }
Test(partition, abandoned_acquire_proxy_lock, .timeout = 60) { abandoned(FW_LOCK, false); }
Test(partition, abandoned_acquire_iptables_basic, .timeout = 60) { abandoned(FW_BASIC, true); }
Test(partition, abandoned_acquire_iptables_lock, .timeout = 60) { abandoned(FW_LOCK, true); }
