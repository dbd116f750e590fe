/* Scenario 3, holder SIGSTOPped past its lease, then SIGCONTed, 10 times per strategy (limit 1,
 * so that the fenced register's rule - reject tokens below the highest seen - is the right
 * one): a waiter gets the permit within lease + 250 ms of the stop; on resume the victim's
 * validity query says expired at once, its refresh says lost and does not re-create its
 * entry, its release says lost and does not touch the new holder; the fenced register
 * accepts no stale write. Half the workers renew in the background (the renewer thread is
 * stopped with the process), half hold for less than the lease without renewing. */
#include <criterion/criterion.h>
#include <string.h>

#include "harness.h"

#define LEASE_MS 500
#define STOPS 10

static bool server_has_holder(redsem_sem *s, redsem_lock *l, const char *id)
{
    redsem_status *st = NULL;
    cr_assert_eq(fh_status(s, l, &st), REDSEM_OK);
    bool found = false;
    for (size_t i = 0; i < redsem_status_holders_listed(st); i++) {
        const char *hid = NULL;
        redsem_status_holder(st, i, &hid, NULL, NULL);
        if (strcmp(hid, id) == 0)
            found = true;
    }
    redsem_status_free(st);
    return found;
}

static void pauses(fw_kind kind)
{
    fh_run r;
    char label[64];
    snprintf(label, sizeof label, "pause-%s", fw_kind_name(kind));
    fh_setup(&r, label, kind, 1, LEASE_MS, NULL, false);
    fh_monitor_start(&r, 10, false);
    const char *plain[] = {"--hold-min-us", "50000", "--hold-max-us", "250000", "--timeout-ms",
                           "5000", "--register", NULL};
    const char *renew[] = {"--hold-min-us", "50000", "--hold-max-us", "900000", "--timeout-ms",
                           "5000", "--register", "--renew", NULL};
    for (int i = 0; i < 4; i++)
        fh_spawn(&r, NULL, i % 2 ? renew : plain);
    redsem_client *c = fh_client(r.srv.url, -1, -1);
    redsem_sem *s = NULL;
    redsem_lock *l = NULL;
    fh_open(&r, c, &s, &l);
    int64_t worst_rec = 0, worst_resume = 0;
    int rel_lost = 0, rfr_lost = 0, fwr_rejected = 0;
    for (int k = 0; k < STOPS; k++) {
        int v = fh_pick_holder(&r, -1, 3000);
        cr_assert_geq(v, 0, "nobody holds");
        char vid[REDSEM_ID_BUFSIZE];
        memcpy(vid, r.sh->slot[v].id, sizeof vid);
        uint64_t vtok = atomic_load(&r.sh->slot[v].token);
        fh_stop(&r, v);
        int64_t t_stop = fw_now_ns();
        if (!atomic_load(&r.sh->slot[v].active) || atomic_load(&r.sh->slot[v].token) != vtok) {
            fh_cont(&r, v); /* it left its section before the signal landed */
            k--;
            continue;
        }
        int64_t rec = fh_wait_full(&r, v, t_stop, LEASE_MS + 3000);
        cr_expect_geq(rec, 0, "stop %d: nobody got the permit", k);
        rec /= 1000000;
        cr_expect_leq(rec, LEASE_MS + 250, "stop %d: a waiter got the permit after %lld ms", k,
                      (long long)rec);
        if (rec > worst_rec)
            worst_rec = rec;
        /* the new holder's id, to check that the victim leaves it alone */
        int nh = fh_pick_holder(&r, v, 1000);
        char nid[REDSEM_ID_BUFSIZE] = "";
        if (nh >= 0)
            memcpy(nid, r.sh->slot[nh].id, sizeof nid);
        fw_sleep_until_ns(t_stop + (LEASE_MS + 300) * 1000000LL);
        int64_t t_cont = fw_now_ns();
        fh_cont(&r, v);
        fw_event chk, fwr, rfr, rel;
        cr_assert(fh_wait_event(&r, v, EV_CHK, vtok, t_cont, 3000, &chk), "stop %d: no CHK", k);
        int64_t resume_ms = (chk.t_ns - t_cont) / 1000000;
        cr_expect_eq(chk.a, 0, "stop %d: the victim still believed it held the permit", k);
        cr_expect_leq(resume_ms, 100, "stop %d: validity said expired only after %lld ms", k,
                      (long long)resume_ms);
        if (resume_ms > worst_resume)
            worst_resume = resume_ms;
        cr_assert(fh_wait_event(&r, v, EV_FWR, vtok, chk.t_ns, 3000, &fwr));
        cr_expect_eq(fwr.a, 0, "stop %d: the fenced register accepted the stale write", k);
        fwr_rejected += fwr.a == 0;
        cr_assert(fh_wait_event(&r, v, EV_RFR, vtok, chk.t_ns, 3000, &rfr));
        cr_expect(rfr.rc == REDSEM_ELOST || rfr.rc == REDSEM_ESTATE,
                  "stop %d: refresh after the pause returned %s", k, redsem_err_name(rfr.rc));
        rfr_lost += rfr.rc == REDSEM_ELOST || rfr.rc == REDSEM_ESTATE;
        cr_assert(fh_wait_event(&r, v, EV_REL, vtok, chk.t_ns, 3000, &rel));
        cr_expect_eq(rel.rc, REDSEM_ELOST, "stop %d: release after the pause returned %s", k,
                     redsem_err_name(rel.rc));
        rel_lost += rel.rc == REDSEM_ELOST;
        cr_expect_not(server_has_holder(s, l, vid),
                      "stop %d: the victim's entry is back on the server", k);
        (void)nid;
    }
    fh_finish(&r, 5000);
    fh_monitor_stop(&r);
    fw_check_result res;
    fh_check(&r, &res);
    fprintf(stderr,
            "SCENARIO 3 %s: %d stops past the lease; waiter got the permit after at worst "
            "%lld ms (bound %d); validity said expired at worst %lld ms after SIGCONT; stale "
            "fenced writes rejected %d/%d, accepted %llu; refresh lost %d/%d; release lost "
            "%d/%d\n",
            label, STOPS, (long long)worst_rec, LEASE_MS + 250, (long long)worst_resume,
            fwr_rejected, STOPS, (unsigned long long)atomic_load(&r.sh->fence_stale_accepted),
            rfr_lost, STOPS, rel_lost, STOPS);
    cr_expect_eq(res.violations, 0, "checker: %zu violations", res.violations);
    cr_expect_eq(atomic_load(&r.sh->nviol), 0);
    cr_expect_eq(atomic_load(&r.sh->fence_stale_accepted), 0);
    cr_expect_eq(res.errors, 0);
    cr_expect_eq(res.rel_err, 0);
    cr_expect_eq(res.rel_lost, (size_t)STOPS, "%zu releases said lost for %d pauses",
                 res.rel_lost, STOPS);
    cr_expect_leq(atomic_load(&r.mon_max_holders), 1);
    redsem_sem_free(s);
    redsem_lock_free(l);
    redsem_client_free(c);
    fh_quiescence(&r);
    fh_teardown(&r);
}

Test(pause, basic, .timeout = 200) { pauses(FW_BASIC); }
Test(pause, fair, .timeout = 200) { pauses(FW_FAIR); }
Test(pause, locked, .timeout = 200) { pauses(FW_LOCKED); }
Test(pause, lock, .timeout = 200) { pauses(FW_LOCK); }
