/* The distributed lock against a real redis-server. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define TO .timeout = 60

static redsem_lock *open_lock(redsem_client *c, const char *name, int64_t lease)
{
    redsem_lock *l = NULL;
    OK(c, redsem_lock_open(c, name, lease, &l));
    return l;
}

Test(lock, is_exclusive_and_fenced, TO)
{
    redsem_client *a = tf_client(), *b = tf_client();
    const char *name = tf_name("lock");
    redsem_lock *la = open_lock(a, name, 5000), *lb = open_lock(b, name, 5000);
    uint64_t last = 0;
    for (int i = 0; i < 20; i++) {
        redsem_permit *pa = NULL, *pb = NULL;
        OK(a, redsem_lock_try_acquire(la, &pa));
        cr_assert_gt(redsem_permit_token(pa), last);
        last = redsem_permit_token(pa);
        EXPECT(b, REDSEM_EBUSY, redsem_lock_try_acquire(lb, &pb));
        cr_assert_null(pb);
        OK(a, redsem_permit_refresh(pa));
        OK(a, redsem_permit_release(pa));
        OK(b, redsem_lock_try_acquire(lb, &pb));
        cr_assert_gt(redsem_permit_token(pb), last);
        last = redsem_permit_token(pb);
        OK(b, redsem_permit_release(pb));
        redsem_permit_free(pa);
        redsem_permit_free(pb);
    }
    redsem_lock_free(la);
    redsem_lock_free(lb);
    redsem_client_free(a);
    redsem_client_free(b);
}

Test(lock, uses_set_nx_px_and_a_random_token, TO)
{
    redsem_client *a = tf_client();
    const char *name = tf_name("raw");
    redsem_lock *l = open_lock(a, name, 3000);
    redsem_permit *p = NULL;
    OK(a, redsem_lock_try_acquire(l, &p));
    char key[256], out[128];
    snprintf(key, sizeof key, "redsem:{%s}:mutex", name);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "GET", key, NULL), 0);
    cr_assert_str_eq(out, redsem_permit_id(p), "the key holds the owner's token");
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "PTTL", key, NULL), 0);
    long long pttl = atoll(out);
    cr_assert(pttl > 2500 && pttl <= 3000, "PTTL %lld", pttl);
    OK(a, redsem_permit_release(p));
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "EXISTS", key, NULL), 0);
    cr_assert_str_eq(out, "0");
    redsem_permit_free(p);
    redsem_lock_free(l);
    redsem_client_free(a);
}

Test(lock, expired_owner_cannot_release_or_extend_the_new_owner, TO)
{
    redsem_client *a = tf_client(), *b = tf_client();
    const char *name = tf_name("expire");
    redsem_lock *la = open_lock(a, name, 100), *lb = open_lock(b, name, 5000);
    redsem_permit *pa = NULL, *pb = NULL;
    OK(a, redsem_lock_try_acquire(la, &pa));
    tf_sleep_ms(200);
    cr_assert_not(redsem_permit_held(pa));
    OK(b, redsem_lock_try_acquire(lb, &pb));
    EXPECT(a, REDSEM_ELOST, redsem_permit_refresh(pa));
    EXPECT(a, REDSEM_ELOST, redsem_permit_release(pa));
    redsem_status *st = NULL;
    OK(b, redsem_lock_status(lb, 5, &st));
    cr_assert(redsem_status_exists(st));
    cr_assert_eq(redsem_status_holder_count(st), 1);
    const char *owner;
    uint64_t tok;
    OK(b, redsem_status_holder(st, 0, &owner, &tok, NULL));
    cr_assert_str_eq(owner, redsem_permit_id(pb));
    cr_assert_eq(tok, redsem_permit_token(pb));
    redsem_status_free(st);
    OK(b, redsem_permit_release(pb));
    redsem_permit_free(pa);
    redsem_permit_free(pb);
    redsem_lock_free(la);
    redsem_lock_free(lb);
    redsem_client_free(a);
    redsem_client_free(b);
}

struct lw {
    const char *name;
    int64_t granted_at;
    int rc;
};

static void *lock_waiter(void *arg)
{
    struct lw *w = arg;
    redsem_client *c = NULL;
    redsem_lock *l = NULL;
    redsem_permit *p = NULL;
    w->rc = redsem_client_connect(tf_url(), &c);
    if (w->rc == REDSEM_OK)
        w->rc = redsem_lock_open(c, w->name, 5000, &l);
    if (w->rc == REDSEM_OK)
        w->rc = redsem_lock_acquire(l, 10000, &p);
    w->granted_at = tf_now_ms();
    if (p)
        redsem_permit_release(p);
    redsem_permit_free(p);
    redsem_lock_free(l);
    redsem_client_free(c);
    return NULL;
}

Test(lock, waiter_is_woken_by_release, TO)
{
    redsem_client *a = tf_client();
    const char *name = tf_name("lwake");
    redsem_lock *l = open_lock(a, name, 10000);
    redsem_permit *p = NULL;
    OK(a, redsem_lock_try_acquire(l, &p));
    struct lw w = {.name = name};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, lock_waiter, &w), 0);
    tf_sleep_ms(900);
    int64_t released = tf_now_ms();
    OK(a, redsem_permit_release(p));
    pthread_join(t, NULL);
    cr_assert_eq(w.rc, REDSEM_OK);
    cr_assert_lt(w.granted_at - released, 150, "hand-off took %lld ms",
                 (long long)(w.granted_at - released));
    redsem_permit_free(p);
    redsem_lock_free(l);
    redsem_client_free(a);
}

Test(lock, acquire_as_and_adopt, TO)
{
    redsem_client *a = tf_client(), *b = tf_client();
    const char *name = tf_name("ladopt");
    redsem_lock *la = open_lock(a, name, 5000), *lb = open_lock(b, name, 5000);
    char tok[REDSEM_ID_BUFSIZE];
    OK(a, redsem_id_generate(tok));
    redsem_permit *p1 = NULL, *p2 = NULL, *p3 = NULL;
    OK(a, redsem_lock_acquire_as(la, tok, 0, &p1));
    OK(a, redsem_lock_acquire_as(la, tok, 0, &p2));
    cr_assert_eq(redsem_permit_token(p1), redsem_permit_token(p2), "retry got a new grant");
    EXPECT(a, REDSEM_EINVAL, redsem_lock_acquire_as(la, "nothex", 0, &p3));
    OK(b, redsem_lock_adopt(lb, tok, &p3));
    cr_assert_eq(redsem_permit_token(p3), redsem_permit_token(p1));
    OK(b, redsem_permit_release(p3));
    EXPECT(a, REDSEM_ELOST, redsem_permit_refresh(p1));
    EXPECT(b, REDSEM_ELOST, redsem_lock_adopt(lb, tok, &p3));
    redsem_permit_free(p1);
    redsem_permit_free(p2);
    redsem_permit_free(p3);
    redsem_lock_free(la);
    redsem_lock_free(lb);
    redsem_client_free(a);
    redsem_client_free(b);
}

Test(lock, invalid_arguments_are_einval, TO)
{
    redsem_client *c = tf_client();
    redsem_lock *l = NULL;
    EXPECT(c, REDSEM_EINVAL, redsem_lock_open(c, "", 1000, &l));
    EXPECT(c, REDSEM_EINVAL, redsem_lock_open(c, "a{b}", 1000, &l));
    EXPECT(c, REDSEM_EINVAL, redsem_lock_open(c, "ok", 0, &l));
    EXPECT(c, REDSEM_EINVAL, redsem_lock_open(c, "ok", REDSEM_LEASE_MAX_MS + 1, &l));
    EXPECT(c, REDSEM_EINVAL, redsem_lock_open(c, "ok", 1000, NULL));
    cr_assert_null(l);
    l = open_lock(c, tf_name("args"), 1000);
    redsem_permit *p = NULL;
    EXPECT(c, REDSEM_EINVAL, redsem_lock_acquire(l, -7, &p));
    EXPECT(c, REDSEM_EINVAL, redsem_lock_acquire(l, 10, NULL));
    EXPECT(c, REDSEM_EINVAL, redsem_lock_acquire_as(l, NULL, 10, &p));
    EXPECT(c, REDSEM_EINVAL, redsem_lock_status(l, 1, NULL));
    cr_assert_null(p);
    redsem_lock_free(l);
    redsem_client_free(c);
}

/* A fresh client's first lock acquire and refresh are one request each, like a warm
 * client's, on a server that has never seen the scripts (each script's first call is its
 * SCRIPT LOAD pipelined before its EVALSHA, one round trip; the SCRIPT LOAD is not counted in
 * stats.requests). A private server: SCRIPT FLUSH must not
 * disturb the suite's other tests. */
Test(lock, a_fresh_client_pays_no_extra_round_trip, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    char url[512];
    snprintf(url, sizeof url, "unix://%s", srv.sock);
    for (int round = 0; round < 3; round++) {
        if (round == 2)
            cr_assert_eq(ts_command(&srv, NULL, 0, "SCRIPT", "FLUSH", NULL), 0);
        redsem_client *c = tf_client_for(url, -1, 0);
        redsem_lock *l = open_lock(c, "fresh", 10000);
        for (int warm = 0; warm < 2; warm++) {
            redsem_client_stats st0, st1, st2;
            redsem_permit *p = NULL;
            OK(c, redsem_client_get_stats(c, &st0));
            OK(c, redsem_lock_try_acquire(l, &p));
            OK(c, redsem_client_get_stats(c, &st1));
            OK(c, redsem_permit_refresh(p));
            OK(c, redsem_client_get_stats(c, &st2));
            OK(c, redsem_permit_release(p));
            redsem_permit_free(p);
            cr_assert_eq(st1.requests - st0.requests, 1, "round %d, %s client: acquire took "
                         "%llu requests", round, warm ? "warm" : "fresh",
                         (unsigned long long)(st1.requests - st0.requests));
            cr_assert_eq(st2.requests - st1.requests, 1, "round %d, %s client: refresh took "
                         "%llu requests", round, warm ? "warm" : "fresh",
                         (unsigned long long)(st2.requests - st1.requests));
        }
        redsem_lock_free(l);
        redsem_client_free(c);
    }
    ts_server_stop(&srv);
}

/* A lock holder that never releases: the waiter is granted when the lease ends on the
 * server, not when an idle server's event loop next wakes (hz 1: once a second). Why the
 * bounds are what they are: see sem::an_expired_lease_is_taken_over_at_once. */
Test(lock, an_expired_lease_is_taken_over_at_once, TO)
{
    static const char *const hz1[] = {"--hz", "1", NULL};
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, hz1, false), 0);
    char url[512];
    snprintf(url, sizeof url, "unix://%s", srv.sock);
    redsem_client *h = tf_client_for(url, -1, 0), *w = tf_client_for(url, -1, 0);
    const int64_t lease = 300;
    for (int round = 0; round < 3; round++) {
        char name[32];
        snprintf(name, sizeof name, "takeover-%d", round);
        redsem_lock *hl = open_lock(h, name, lease), *wl = open_lock(w, name, lease);
        redsem_permit *hp = NULL, *wp = NULL;
        OK(h, redsem_lock_try_acquire(hl, &hp)); /* never released */
        OK(w, redsem_lock_acquire(wl, 5000, &wp));
        int64_t end_ms = (int64_t)(redsem_permit_token(hp) / 1000) + lease;
        int64_t late_us = (int64_t)redsem_permit_token(wp) - end_ms * 1000;
        cr_assert_geq(late_us, 0, "round %d: granted %lld us BEFORE the holder's lease ended",
                      round, (long long)-late_us);
        cr_assert_lt(late_us, 100000,
                     "round %d: granted %lld ms after the holder's lease ended (server clock)",
                     round, (long long)(late_us / 1000));
        OK(w, redsem_permit_release(wp));
        redsem_permit_free(wp);
        redsem_permit_free(hp);
        redsem_lock_free(hl);
        redsem_lock_free(wl);
    }
    redsem_client_free(h);
    redsem_client_free(w);
    ts_server_stop(&srv);
}

/* The lock's meta hash (fencing counter, current token, reentrant hold count) records its
 * own expiry, and an acquire gives it a new one only when that record runs short. A refresh
 * set it to expire its lease + 60 s from then: sooner than recorded after a grant with a
 * longer lease, so that the hash could expire under a held lock while every acquire trusted
 * the record (a reentrant hold count lost: the inner release frees the lock). The hash never
 * expires before the time it records. */
Test(lock, a_refresh_never_brings_the_meta_hash_expiry_closer, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("metaexp");
    redsem_lock *lasting = open_lock(c, name, 600000);
    redsem_lock *brief = open_lock(c, name, 1000);
    redsem_permit *p = NULL;
    OK(c, redsem_lock_try_acquire(lasting, &p));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    OK(c, redsem_lock_try_acquire(brief, &p));
    OK(c, redsem_permit_refresh(p));
    char meta[160], exp[64] = "", at[64] = "";
    snprintf(meta, sizeof meta, "redsem:{%s}:mutex:meta", name);
    cr_assert_eq(ts_command(tf_server(), exp, sizeof exp, "HGET", meta, "exp", NULL), 0);
    cr_assert_eq(ts_command(tf_server(), at, sizeof at, "PEXPIRETIME", meta, NULL), 0);
    cr_assert(strtoll(at, NULL, 10) >= strtoll(exp, NULL, 10),
              "the meta hash expires at %s, before the %s it records", at, exp);
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_lock_free(brief);
    redsem_lock_free(lasting);
    redsem_client_free(c);
}
