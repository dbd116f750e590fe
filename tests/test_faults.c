/* Faults a user meets in production: SCRIPT FLUSH, restarts, foreign keys of the wrong type,
 * authentication and ACLs, databases, fork, killed connections, a stalled server. Tests that
 * disturb the server start a private one. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fixture.h"

#define TO .timeout = 90


/* ---------------------------------------------------------------- SCRIPT FLUSH */

static atomic_int flushing;

static void *flusher(void *arg)
{
    (void)arg;
    while (atomic_load(&flushing)) {
        ts_command(tf_server(), NULL, 0, "SCRIPT", "FLUSH", NULL);
        usleep(3000);
    }
    return NULL;
}

STRATEGY_TEST(faults, script_flush_mid_run_is_invisible, TO)
{
    redsem_client *c = tf_client();
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, tf_name("flush"), strategy, 2, 5000, &s));
    redsem_permit *warm = NULL; /* first use loads each script once; count after that */
    OK(c, redsem_sem_acquire(s, 1000, &warm));
    OK(c, redsem_permit_refresh(warm));
    OK(c, redsem_permit_release(warm));
    redsem_permit_free(warm);
    redsem_client_stats before;
    OK(c, redsem_client_get_stats(c, &before));
    atomic_store(&flushing, 1);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, flusher, NULL), 0);
    /* 300 pairs at least, and on until a flush has hit one (at most 20 s): on a busy machine
     * the flusher thread may not run at all during 300 quick pairs */
    redsem_client_stats after;
    int64_t end = tf_now_ms() + 20000;
    for (int i = 0;; i++) {
        redsem_permit *p = NULL;
        OK(c, redsem_sem_acquire(s, 1000, &p));
        OK(c, redsem_permit_refresh(p));
        OK(c, redsem_permit_release(p));
        redsem_permit_free(p);
        if (i < 300)
            continue;
        OK(c, redsem_client_get_stats(c, &after));
        if (after.noscript > before.noscript || tf_now_ms() > end)
            break;
    }
    atomic_store(&flushing, 0);
    pthread_join(t, NULL);
    OK(c, redsem_client_get_stats(c, &after));
    uint64_t noscript = after.noscript - before.noscript;
    uint64_t loads = after.script_loads - before.script_loads;
    cr_assert_gt(noscript, 0, "the flusher never hit us: the test proves nothing");
    cr_assert_eq(loads, noscript, "%llu loads for %llu NOSCRIPT replies",
                 (unsigned long long)loads, (unsigned long long)noscript);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- restart */

STRATEGY_TEST(faults, restart_gives_a_clear_error_then_recovers, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, 200, 0);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, "restart", strategy, 1, 5000, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    ts_server_kill(&srv);
    int64_t t0 = tf_now_ms();
    redsem_permit *q = NULL;
    EXPECT(c, REDSEM_ECONN, redsem_sem_try_acquire(s, &q));
    cr_assert_lt(tf_now_ms() - t0, 2000, "the retry window is 200 ms");
    cr_assert(strlen(redsem_client_errmsg(c)) > 0);
    EXPECT(c, REDSEM_ECONN, redsem_permit_refresh(p));
    cr_assert_eq(ts_server_restart(&srv), 0);
    /* without persistence the old permit is gone: the server lost it, the library says so */
    EXPECT(c, REDSEM_ELOST, redsem_permit_refresh(p));
    OK(c, redsem_sem_try_acquire(s, &q));
    cr_assert_gt(redsem_permit_token(q), redsem_permit_token(p),
                 "tokens keep increasing across a restart without persistence");
    OK(c, redsem_permit_release(q));
    redsem_client_stats st;
    OK(c, redsem_client_get_stats(c, &st));
    cr_assert_geq(st.connects, 2);
    redsem_permit_free(p);
    redsem_permit_free(q);
    redsem_sem_free(s);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

STRATEGY_TEST(faults, retry_window_rides_out_a_short_outage, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, 3000, 0);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, "outage", strategy, 1, 5000, &s));
    ts_server_kill(&srv);
    tf_restarter r = {.srv = &srv};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, tf_restart_later, &r), 0);
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    redsem_client_stats st;
    OK(c, redsem_client_get_stats(c, &st));
    cr_assert_gt(st.retries, 0);
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
    while (!atomic_load(&r.restarted))
        usleep(1000);
    cr_assert_eq(r.rc, 0);
    ts_server_stop(&srv);
    atomic_store(&r.done, 1);
    pthread_join(t, NULL);
}

/* ---------------------------------------------------------------- wrong type */

static void expect_untouched(const char *key, const char *type, const char *value)
{
    char out[128];
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "TYPE", key, NULL), 0);
    cr_assert_str_eq(out, type, "%s changed type", key);
    if (value) {
        cr_assert_eq(ts_command(tf_server(), out, sizeof out, "GET", key, NULL), 0);
        cr_assert_str_eq(out, value, "%s changed value", key);
    }
}

STRATEGY_TEST(faults, wrong_type_key_is_a_server_error_and_is_not_overwritten, TO)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("wrongtype");
    char meta[256], set[256];
    snprintf(meta, sizeof meta, "redsem:{%s}:meta", name);
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "SET", meta, "foreign", NULL), 0);
    redsem_sem *s = NULL;
    EXPECT(c, REDSEM_ESERVER, redsem_sem_open(c, name, strategy, 1, 1000, &s));
    cr_assert(strstr(redsem_client_errmsg(c), "WRONGTYPE") != NULL, "%s",
              redsem_client_errmsg(c));
    expect_untouched(meta, "string", "foreign");
    ts_command(tf_server(), NULL, 0, "DEL", meta, NULL);

    /* a foreign key where the holders / owners set should be */
    const char *n2 = tf_name("wrongtype2");
    OK(c, redsem_sem_open(c, n2, strategy, 1, 1000, &s));
    snprintf(set, sizeof set, "redsem:{%s}:%s", n2,
             strategy == REDSEM_STRATEGY_BASIC ? "holders" : "owners");
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "SET", set, "mine", NULL), 0);
    redsem_permit *p = NULL;
    EXPECT(c, REDSEM_ESERVER, redsem_sem_try_acquire(s, &p));
    cr_assert(strstr(redsem_client_errmsg(c), "WRONGTYPE") != NULL, "%s",
              redsem_client_errmsg(c));
    EXPECT(c, REDSEM_ESERVER, redsem_sem_acquire(s, 200, &p));
    cr_assert_null(p);
    expect_untouched(set, "string", "mine");
    char meta2[256], out[64];
    snprintf(meta2, sizeof meta2, "redsem:{%s}:meta", n2);
    ts_command(tf_server(), out, sizeof out, "HLEN", meta2, NULL);
    redsem_sem_free(s);

    /* and for the lock */
    const char *n3 = tf_name("wrongtype3");
    char mutex[256];
    snprintf(mutex, sizeof mutex, "redsem:{%s}:mutex:meta", n3);
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "RPUSH", mutex, "x", NULL), 0);
    redsem_lock *l = NULL;
    OK(c, redsem_lock_open(c, n3, 1000, &l));
    EXPECT(c, REDSEM_ESERVER, redsem_lock_try_acquire(l, &p));
    cr_assert(strstr(redsem_client_errmsg(c), "WRONGTYPE") != NULL);
    expect_untouched(mutex, "list", NULL);
    char lockkey[256];
    snprintf(lockkey, sizeof lockkey, "redsem:{%s}:mutex", n3);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "EXISTS", lockkey, NULL), 0);
    cr_assert_str_eq(out, "0", "the lock was taken although the call failed");
    redsem_lock_free(l);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- auth and ACL */

Test(faults, password_and_acl_users, TO)
{
    const char *args[] = {"--requirepass", "s3cret", NULL};
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, args, false), 0);
    char url[512], err[256];
    redsem_options *o = NULL;
    redsem_client *c = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_retry_ms(o, 0), REDSEM_OK);

    /* no password: the connect's INFO memory (the eviction check) is refused with NOAUTH */
    snprintf(url, sizeof url, "unix://%s", srv.sock);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
    cr_assert_eq(redsem_client_new_verbose(o, &c, err, sizeof err), REDSEM_EPERM);
    cr_assert(strstr(err, "NOAUTH") != NULL, "%s", err);
    cr_assert_null(c);
    /* without the check the connection works, the first command is refused with NOAUTH */
    cr_assert_eq(redsem_options_set_allow_eviction(o, true), REDSEM_OK);
    cr_assert_eq(redsem_client_new(o, &c), REDSEM_OK);
    EXPECT(c, REDSEM_EPERM, redsem_client_ping(c));
    cr_assert(strstr(redsem_client_errmsg(c), "NOAUTH") != NULL, "%s", redsem_client_errmsg(c));
    redsem_client_free(c);
    c = NULL;
    cr_assert_eq(redsem_options_set_allow_eviction(o, false), REDSEM_OK);

    /* wrong password */
    snprintf(url, sizeof url, "unix://:wrong@%s", srv.sock);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
    cr_assert_eq(redsem_client_new_verbose(o, &c, err, sizeof err), REDSEM_EPERM);
    cr_assert(strstr(err, "WRONGPASS") != NULL, "%s", err);
    cr_assert_null(c);

    /* right password, then an ACL user with a percent-encoded password */
    snprintf(url, sizeof url, "unix://:s3cret@%s", srv.sock);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
    cr_assert_eq(redsem_client_new(o, &c), REDSEM_OK);
    OK(c, redsem_client_ping(c));
    redsem_client_free(c);

    redisContext *rc = redisConnectUnix(srv.sock);
    cr_assert(rc && !rc->err);
    freeReplyObject(redisCommand(rc, "AUTH s3cret"));
    redisReply *r = redisCommand(rc, "ACL SETUSER alice on >p@ss ~redsem:* +@all");
    cr_assert(r && r->type == REDIS_REPLY_STATUS, "%s", r ? r->str : "");
    freeReplyObject(r);
    r = redisCommand(rc, "ACL SETUSER bob on >pw ~redsem:* +@all -evalsha -eval");
    freeReplyObject(r);
    r = redisCommand(rc, "ACL SETUSER carol on >pw ~other:* +@all");
    freeReplyObject(r);
    redisFree(rc);

    snprintf(url, sizeof url, "unix://alice:p%%40ss@%s", srv.sock);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
    cr_assert_eq(redsem_client_new(o, &c), REDSEM_OK);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, "acl", REDSEM_STRATEGY_FAIR, 1, 1000, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);

    /* no EVALSHA: a permission error with Redis' NOPERM text, no retry loop */
    const char *denied_users[] = {"bob", "carol"};
    for (int i = 0; i < 2; i++) {
        snprintf(url, sizeof url, "unix://%s:pw@%s", denied_users[i], srv.sock);
        cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
        cr_assert_eq(redsem_client_new(o, &c), REDSEM_OK);
        int64_t t0 = tf_now_ms();
        EXPECT(c, REDSEM_EPERM, redsem_sem_open(c, "acl", REDSEM_STRATEGY_FAIR, 1, 1000, &s));
        cr_assert(strstr(redsem_client_errmsg(c), "NOPERM") != NULL, "%s",
                  redsem_client_errmsg(c));
        cr_assert_lt(tf_now_ms() - t0, 500);
        redsem_client_stats st;
        OK(c, redsem_client_get_stats(c, &st));
        /* AUTH, TIME and INFO memory at connect, SCRIPT LOAD, the refused EVALSHA: no
         * retry loop */
        cr_assert_leq(st.requests, 5, "%llu requests for one refused call",
                      (unsigned long long)st.requests);
        redsem_client_free(c);
    }
    redsem_options_free(o);
    ts_server_stop(&srv);
}

Test(faults, select_database_from_the_url, TO)
{
    char url[512];
    snprintf(url, sizeof url, "%s?db=5", tf_url());
    redsem_client *c = tf_client_for(url, 0, 0);
    const char *name = tf_name("db5");
    redsem_lock *l = NULL;
    OK(c, redsem_lock_open(c, name, 5000, &l));
    redsem_permit *p = NULL;
    OK(c, redsem_lock_try_acquire(l, &p));
    redisContext *rc = redisConnectUnix(tf_sock());
    cr_assert(rc && !rc->err);
    redisReply *r = redisCommand(rc, "EXISTS redsem:{%s}:mutex", name);
    cr_assert_eq(r->integer, 0, "the key landed in db 0");
    freeReplyObject(r);
    freeReplyObject(redisCommand(rc, "SELECT 5"));
    r = redisCommand(rc, "EXISTS redsem:{%s}:mutex", name);
    cr_assert_eq(r->integer, 1, "the key is not in db 5");
    freeReplyObject(r);
    redisFree(rc);
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_lock_free(l);
    redsem_client_free(c);
    char bad[512];
    snprintf(bad, sizeof bad, "%s?db=100000", tf_url());
    redsem_client *d = NULL;
    char err[256] = "";
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, bad), REDSEM_OK);
    cr_assert_eq(redsem_client_new_verbose(o, &d, err, sizeof err), REDSEM_ESERVER);
    cr_assert(strstr(err, "SELECT") != NULL, "%s", err);
    redsem_options_free(o);
}

/* ---------------------------------------------------------------- fork */

Test(faults, a_forked_child_cannot_touch_the_parents_permits, TO)
{
    redsem_client *c = tf_client();
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, tf_name("fork"), REDSEM_STRATEGY_BASIC, 1, 5000, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int bad = 0;
        redsem_permit *q = NULL;
        bad |= redsem_permit_release(p) != REDSEM_EFORKED;
        bad |= redsem_permit_refresh(p) != REDSEM_EFORKED;
        bad |= redsem_sem_try_acquire(s, &q) != REDSEM_EFORKED;
        bad |= redsem_client_ping(c) != REDSEM_EFORKED;
        bad |= strstr(redsem_client_errmsg(c), "fork") == NULL;
        redsem_permit_free(p);
        redsem_sem_free(s);
        redsem_client_free(c); /* closes the child's copy of the socket, sends nothing */
        _exit(bad);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert_eq(WEXITSTATUS(status), 0, "the child could use the parent's handles");
    OK(c, redsem_permit_refresh(p));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- killed connection, stall */

Test(faults, killed_connection_reconnects_on_the_next_call, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, 0, 0);
    OK(c, redsem_client_ping(c));
    cr_assert_eq(ts_command(&srv, NULL, 0, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes",
                            NULL),
                 0);
    /* retry window 0: the call that finds the connection dead fails clearly... */
    int rc = redsem_client_ping(c);
    cr_assert(rc == REDSEM_ECONN, "%s", redsem_err_name(rc));
    /* ...and the next call reconnects */
    OK(c, redsem_client_ping(c));
    redsem_client_stats st;
    OK(c, redsem_client_get_stats(c, &st));
    cr_assert_eq(st.connects, 2);
    redsem_client_free(c);
    /* with a retry window the killed connection is invisible */
    c = tf_client_for(srv.url, 1000, 0);
    OK(c, redsem_client_ping(c));
    ts_command(&srv, NULL, 0, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes", NULL);
    OK(c, redsem_client_ping(c));
    redsem_client_free(c);
    ts_server_stop(&srv);
}

Test(faults, stalled_server_times_out_by_the_command_timeout, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, 0, 300);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, "stall", REDSEM_STRATEGY_FAIR, 1, 5000, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    ts_server_pause(&srv, true);
    /* the acquire first, on the open connection (after a timeout the next call reconnects,
     * and its handshake, INFO memory, times out before anything is sent) */
    redsem_permit *q = NULL;
    int64_t t0 = tf_now_ms();
    EXPECT(c, REDSEM_EUNKNOWN, redsem_sem_try_acquire(s, &q));
    cr_assert_lt(tf_now_ms() - t0, 800);
    cr_assert(strstr(redsem_client_errmsg(c), "acquire again") != NULL, "%s",
              redsem_client_errmsg(c));
    t0 = tf_now_ms();
    EXPECT(c, REDSEM_ETIMEDOUT, redsem_permit_refresh(p));
    int64_t took = tf_now_ms() - t0;
    cr_assert(took >= 295 && took < 800, "timed out after %lld ms", (long long)took);
    ts_server_pause(&srv, false);
    OK(c, redsem_permit_refresh(p));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

/* ---------------------------------------------------------------- restart with AOF */

/* Found by the fault suite (scenario 6, restart with appendfsync always): while a restarted
 * server loads its AOF it accepts connections but answers every command with "-LOADING Redis
 * is loading the dataset in memory"; callers got REDSEM_ESERVER. Nothing was executed, so the
 * request is retried within the retry window, like the restart itself. key-load-delay makes
 * the load last ~1.5 s. */
Test(faults, server_loading_its_data_is_waited_for_within_the_retry_window, TO)
{
    ts_server srv;
    tf_slow_loading_server(&srv);
    redsem_client *c = tf_client_for(srv.url, 4000, 0);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, "loading", REDSEM_STRATEGY_BASIC, 1, 5000, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    ts_server_kill(&srv);
    tf_restarter r = {.srv = &srv};
    pthread_t t;
    r.rc = -1;
    /* restart_later waits 300 ms; the load then takes ~1.5 s */
    cr_assert_eq(pthread_create(&t, NULL, tf_restart_later, &r), 0);
    while (!atomic_load(&r.restarted)) {
        /* ts_server_restart returns once PING answers, i.e. after the load: poll the socket
         * ourselves to act while the server is still loading */
        char pong[64] = "";
        if (ts_command(&srv, pong, sizeof pong, "PING", NULL) != 0 &&
            strncmp(pong, "LOADING", 7) == 0)
            break;
        usleep(2000);
    }
    cr_assert_not(atomic_load(&r.restarted), "the load ended before the test could act");
    OK(c, redsem_permit_refresh(p)); /* persisted in the AOF: still ours */
    redsem_permit *q = NULL;
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(s, &q));
    OK(c, redsem_permit_release(p));
    redsem_client_stats st;
    OK(c, redsem_client_get_stats(c, &st));
    cr_assert_gt(st.retries, 0, "no retry: the load was not seen");
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
    while (!atomic_load(&r.restarted))
        usleep(1000);
    cr_assert_eq(r.rc, 0);
    ts_server_stop(&srv);
    atomic_store(&r.done, 1);
    pthread_join(t, NULL);
}

/* ---------------------------------------------------------------- a wait cut short */

/* Kill the clients once the waiter is blocked in its BLPOP (not at a fixed delay: under
 * valgrind the first attempt can take longer, and a kill during its script is a lost reply,
 * REDSEM_EUNKNOWN, another case). Gives up after 10 s (the test then fails on its code). */
static void *kill_normal_clients_later(void *arg)
{
    ts_server *srv = arg;
    char out[2048] = "";
    for (int i = 0; i < 1000 && strstr(out, "blocked_clients:1") == NULL; i++) {
        usleep(10000);
        if (ts_command(srv, out, sizeof out, "INFO", "clients", NULL) != 0)
            out[0] = '\0';
    }
    ts_command(srv, NULL, 0, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes", NULL);
    return NULL;
}

/* Found by the fault suite (scenario 12, CLIENT KILL during a blocking acquire, retry window
 * 0): the fair/locked waiter got REDSEM_ECONN but its queue entry stayed; once the holder
 * released, that entry was entitled to the permit and withheld it for the wait lease, so the
 * same client's next acquire got REDSEM_EBUSY. A wait cut short by a lost connection now
 * leaves the queue (one attempt in mode "last") before it returns. */
static void killed_wait_leaves_the_queue(redsem_strategy strategy)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *h = tf_client_for(srv.url, 1000, 0);
    redsem_client *c = tf_client_for(srv.url, 0, 0);
    redsem_sem *hs = NULL, *s = NULL;
    OK(h, redsem_sem_open(h, "killedwait", strategy, 1, 5000, &hs));
    OK(c, redsem_sem_open(c, "killedwait", strategy, 1, 5000, &s));
    redsem_permit *hp = NULL, *p = NULL;
    OK(h, redsem_sem_try_acquire(hs, &hp));
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, kill_normal_clients_later, &srv), 0);
    EXPECT(c, REDSEM_ECONN, redsem_sem_acquire(s, 2000, &p));
    pthread_join(t, NULL);
    OK(h, redsem_permit_release(hp)); /* reconnects (retry window) */
    OK(c, redsem_sem_acquire(s, 500, &p));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_permit_free(hp);
    redsem_sem_free(s);
    redsem_sem_free(hs);
    redsem_client_free(c);
    redsem_client_free(h);
    ts_server_stop(&srv);
}

Test(faults, a_wait_cut_by_a_lost_connection_leaves_the_queue_fair, TO)
{
    killed_wait_leaves_the_queue(REDSEM_STRATEGY_FAIR);
}

Test(faults, a_wait_cut_by_a_lost_connection_leaves_the_queue_locked, TO)
{
    killed_wait_leaves_the_queue(REDSEM_STRATEGY_LOCKED);
}

/* Found by the fault suite (scenario 9, an ACL user without SCRIPT LOAD): the lock's first
 * acquire failed at SCRIPT LOAD, before any request that could grant, yet returned
 * REDSEM_EUNKNOWN: redsem__eval returned on the load path without initialising the caller's
 * outcome record, whose maybe_applied was stack garbage. A script's first call is SCRIPT LOAD
 * pipelined before its EVALSHA, and a refused SCRIPT LOAD falls back to EVAL of the body
 * (node/script.c): a user without either is refused there, before anything ran. */
Test(faults, a_refused_script_load_is_eperm_not_unknown, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    cr_assert_eq(ts_command(&srv, NULL, 0, "ACL", "SETUSER", "noload", "on", ">pw", "~redsem:*",
                            "+@all", "-eval", "-script|load", NULL),
                 0);
    char url[512];
    snprintf(url, sizeof url, "unix://noload:pw@%s", srv.sock);
    for (int i = 0; i < 20; i++) {
        redsem_client *c = tf_client_for(url, 0, 0);
        redsem_lock *l = NULL;
        OK(c, redsem_lock_open(c, "noload", 1000, &l));
        redsem_permit *p = NULL;
        EXPECT(c, REDSEM_EPERM, i % 2 ? redsem_lock_try_acquire(l, &p)
                                      : redsem_lock_acquire(l, 200, &p));
        cr_assert(strstr(redsem_client_errmsg(c), "NOPERM") != NULL, "%s",
                  redsem_client_errmsg(c));
        redsem_lock_free(l);
        redsem_client_free(c);
    }
    ts_server_stop(&srv);
}

/* Found by the fault suite (scenario 10, a foreign key at each key of a semaphore or lock):
 * a waiting acquire DELeted a foreign string at the wake-up list (basic, lock); a lock
 * refresh PEXPIREd a foreign string at the lock's meta hash; moving the semaphore's expiry
 * PEXPIREATed foreign keys it had never read (waiters, signal, owners); and a foreign list
 * at the locked strategy's guard made every acquire "busy" forever instead of an error. */
static void plant(const char *key, bool list)
{
    ts_command(tf_server(), NULL, 0, "DEL", key, NULL);
    cr_assert_eq(list ? ts_command(tf_server(), NULL, 0, "RPUSH", key, "foreign", NULL)
                      : ts_command(tf_server(), NULL, 0, "SET", key, "foreign", NULL),
                 0);
}

static void expect_foreign(redsem_client *c, int rc, const char *key, bool list)
{
    if (rc != REDSEM_OK && rc != REDSEM_EBUSY)
        cr_assert(rc == REDSEM_ESERVER && strstr(redsem_client_errmsg(c), "WRONGTYPE") != NULL,
                  "%s: %s (%s)", key, redsem_err_name(rc), redsem_client_errmsg(c));
    char out[64];
    ts_command(tf_server(), out, sizeof out, "TYPE", key, NULL);
    cr_assert_str_eq(out, list ? "list" : "string", "%s was changed", key);
    ts_command(tf_server(), out, sizeof out, "PTTL", key, NULL);
    cr_assert_str_eq(out, "-1", "%s got a TTL", key);
}

Test(faults, foreign_keys_of_another_type_are_never_modified, TO)
{
    redsem_client *c = tf_client();
    char key[256], meta[256];
    redsem_permit *p = NULL, *q = NULL;
    /* basic: the wake-up list, while an acquire waits; the waiters set, when the expiry moves */
    const char *n1 = tf_name("foreign1");
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, n1, REDSEM_STRATEGY_BASIC, 1, 5000, &s));
    OK(c, redsem_sem_try_acquire(s, &p));
    snprintf(key, sizeof key, "redsem:{%s}:signal", n1);
    plant(key, false);
    expect_foreign(c, redsem_sem_acquire(s, 100, &q), key, false);
    snprintf(key, sizeof key, "redsem:{%s}:waiters", n1);
    plant(key, false);
    snprintf(meta, sizeof meta, "redsem:{%s}:meta", n1);
    ts_command(tf_server(), NULL, 0, "HSET", meta, "exp", "1", NULL); /* the expiry must move */
    expect_foreign(c, redsem_permit_refresh(p), key, false);
    redsem_permit_free(p);
    redsem_sem_free(s);
    /* the lock: its meta hash on refresh, its wake-up list while an acquire waits */
    const char *n2 = tf_name("foreign2");
    redsem_lock *l = NULL;
    OK(c, redsem_lock_open(c, n2, 5000, &l));
    OK(c, redsem_lock_try_acquire(l, &p));
    snprintf(key, sizeof key, "redsem:{%s}:mutex:meta", n2);
    plant(key, false);
    expect_foreign(c, redsem_permit_refresh(p), key, false);
    snprintf(key, sizeof key, "redsem:{%s}:mutex:signal", n2);
    plant(key, false);
    expect_foreign(c, redsem_lock_acquire(l, 100, &q), key, false);
    redsem_permit_free(p);
    redsem_lock_free(l);
    /* the locked strategy's guard: an error, not "busy" forever */
    const char *n3 = tf_name("foreign3");
    OK(c, redsem_sem_open(c, n3, REDSEM_STRATEGY_LOCKED, 1, 5000, &s));
    snprintf(key, sizeof key, "redsem:{%s}:lock", n3);
    plant(key, true);
    EXPECT(c, REDSEM_ESERVER, redsem_sem_try_acquire(s, &q));
    expect_foreign(c, REDSEM_ESERVER, key, true);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- hostile replies */

/* A fake server that answers anything with an array header claiming 377,777,777 elements. */
static void *oversized_server(void *arg)
{
    int lfd = *(int *)arg;
    int fd = accept(lfd, NULL, NULL);
    char buf[4096];
    if (fd >= 0 && read(fd, buf, sizeof buf) > 0) {
        static const char reply[] = "*377777777\r\n:0\r\n";
        (void)!write(fd, reply, sizeof reply - 1);
        usleep(800000); /* keep the connection open: the client must not wait for the rest */
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

/* Found by the fault suite's reply fuzzer (tests/fuzz/fuzz_reply.c, libFuzzer: out-of-memory,
 * malloc(3022222216)): hiredis 0.14's reader allocates an array for the count an aggregate
 * header announces, before any element arrives, so 12 bytes from a broken or hostile peer
 * reserved 3 GB. No redsem reply has more than 3 x REDSEM_LIMIT_MAX elements: larger
 * headers are a protocol error now, reported at once. */
Test(faults, an_oversized_reply_header_is_a_protocol_error, TO)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(lfd, 4), 0);
    cr_assert_eq(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, oversized_server, &lfd), 0);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", ntohs(sa.sin_port));
    /* The first reply a client reads is that of TIME, on connect: the hostile header fails
     * the connect at once, with the count in the message, instead of waiting for 377,777,777
     * elements (or allocating room for them). */
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
    cr_assert_eq(redsem_options_set_retry_ms(o, 0), REDSEM_OK);
    cr_assert_eq(redsem_options_set_command_timeout_ms(o, 500), REDSEM_OK);
    redsem_client *c = NULL;
    char err[256] = "";
    int64_t t0 = tf_now_ms();
    int orc = redsem_client_new_verbose(o, &c, err, sizeof err);
    cr_assert_eq(orc, REDSEM_EPROTO, "%s: %s", redsem_err_name(orc), err);
    cr_assert_lt(tf_now_ms() - t0, 400, "waited for the announced elements");
    cr_assert(strstr(err, "377777777") != NULL, "%s", err);
    cr_assert_null(c);
    redsem_options_free(o);
    pthread_join(t, NULL);
    close(lfd);
}
