/* A Sentinel-managed primary (redis+sentinel://): one primary, two replicas and three
 * Sentinels on loopback, all started here (redis-server CONF --sentinel is what Debian's
 * redis-sentinel runs), with short down-after and failover timeouts. Using it, a failover
 * under a client, and the clear refusals. The failover under contended load, with counts, is
 * in the fault suite. */
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "sentinel.h"

#define TO .timeout = 120

typedef ts_sentinels cluster;

static void start_cluster(cluster *c)
{
    cr_assert_eq(ts_sentinels_start(c), 0, "could not start the Sentinel setup");
}

static void stop_cluster(cluster *c)
{
    ts_sentinels_stop(c);
}

Test(sentinel, every_strategy_and_the_lock_through_sentinel, TO)
{
    cluster c;
    start_cluster(&c);
    char err[512];
    int rc;
    /* the first Sentinel named is down: the next one answers */
    char url[600];
    snprintf(url, sizeof url, "redis+sentinel://127.0.0.1:%d,%s", ts_free_port(),
             c.url + strlen("redis+sentinel://"));
    redsem_client *cl = tf_client_try(url, -1, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    for (int k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof name, "sent-%d", k);
        redsem_sem *s = NULL;
        redsem_lock *l = NULL;
        redsem_permit *p = NULL;
        if (k < 3) {
            OK(cl, redsem_sem_open(cl, name, (redsem_strategy)(k + 1), 1, 5000, &s));
            OK(cl, redsem_sem_acquire(s, 1000, &p));
        } else {
            OK(cl, redsem_lock_open(cl, name, 5000, &l));
            OK(cl, redsem_lock_acquire(l, 1000, &p));
        }
        OK(cl, redsem_permit_refresh(p));
        OK(cl, redsem_permit_release(p));
        redsem_permit_free(p);
        redsem_sem_free(s);
        redsem_lock_free(l);
    }
    /* the permits were taken on the primary */
    char out[64] = "";
    cr_assert_eq(ts_command(&c.primary, out, sizeof out, "EXISTS", "redsem:{sent-1}:meta", NULL), 0);
    cr_assert_str_eq(out, "1", "the fair semaphore is not on the primary");
    redsem_client_free(cl);
    stop_cluster(&c);
}

/* SIGKILL of the primary under a client that keeps acquiring: the client follows the
 * Sentinels to the promoted replica within its retry window, with no error in between. */
Test(sentinel, a_failover_is_followed, TO)
{
    cluster c;
    start_cluster(&c);
    char err[512];
    int rc;
    redsem_client *cl = tf_client_try(c.url, 20000, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    redsem_sem *s = NULL;
    OK(cl, redsem_sem_open(cl, "failover", REDSEM_STRATEGY_FAIR, 1, 5000, &s));
    redsem_permit *p = NULL;
    OK(cl, redsem_sem_acquire(s, 1000, &p));
    OK(cl, redsem_permit_release(p));
    redsem_permit_free(p);
    int old_port = c.primary.port;
    ts_server_kill(&c.primary);
    int64_t killed = tf_now_ms();
    /* a release is idempotent and an acquire with the same id too: this loop sees every
     * outcome the caller would */
    int errors = 0, grants = 0;
    int64_t first_grant = 0;
    while (tf_now_ms() - killed < 15000 && grants < 5) {
        p = NULL;
        rc = redsem_sem_acquire(s, 1000, &p);
        if (rc == REDSEM_OK) {
            grants++;
            if (first_grant == 0)
                first_grant = tf_now_ms();
            OK(cl, redsem_permit_release(p));
        } else {
            errors++;
            fprintf(stderr, "after the kill: %s (%s)\n", redsem_err_name(rc),
                    redsem_client_errmsg(cl));
        }
        redsem_permit_free(p);
    }
    cr_assert_eq(grants, 5, "no grant within 15 s of the kill");
    fprintf(stderr, "SENTINEL failover: first grant %lld ms after the primary was killed, %d "
                    "errors surfaced\n",
            (long long)(first_grant - killed), errors);
    cr_assert_eq(errors, 0, "errors surfaced during the failover");
    int now_port = ts_sentinels_primary_port(&c);
    cr_assert(now_port > 0 && now_port != old_port, "no failover happened");
    redsem_sem_free(s);
    redsem_client_free(cl);
    stop_cluster(&c);
}

Test(sentinel, refusals_are_clear, TO)
{
    cluster c;
    start_cluster(&c);
    char err[512], url[600];
    int rc;
    /* every Sentinel down */
    snprintf(url, sizeof url, "redis+sentinel://127.0.0.1:%d,127.0.0.1:%d/mymaster",
             ts_free_port(), ts_free_port());
    int64_t t0 = tf_now_ms();
    redsem_client *cl = tf_client_try(url, 0, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_ECONN, "%s: %s", redsem_err_name(rc), err);
    cr_assert(strstr(err, "Sentinel 127.0.0.1:") != NULL && strstr(err, "mymaster") != NULL,
              "%s", err);
    cr_assert_lt(tf_now_ms() - t0, 3000);
    cr_assert_null(cl);
    /* a name no Sentinel knows */
    snprintf(url, sizeof url, "redis+sentinel://127.0.0.1:%d/nosuchmaster", c.sentinel[0].port);
    cl = tf_client_try(url, 0, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_ECONN, "%s: %s", redsem_err_name(rc), err);
    cr_assert(strstr(err, "knows no primary named 'nosuchmaster'") != NULL, "%s", err);
    /* a plain Redis given as a Sentinel */
    snprintf(url, sizeof url, "redis+sentinel://127.0.0.1:%d/mymaster", c.replica[0].port);
    cl = tf_client_try(url, 0, &rc, err, sizeof err);
    cr_assert_neq(rc, REDSEM_OK);
    cr_assert(strstr(err, "SENTINEL") != NULL || strstr(err, "sentinel") != NULL, "%s", err);
    /* a Sentinel that names a replica as the primary */
    char port[16];
    snprintf(port, sizeof port, "%d", c.replica[1].port);
    cr_assert_eq(ts_command(&c.sentinel[0], NULL, 0, "SENTINEL", "MONITOR", "fake", "127.0.0.1",
                            port, "1", NULL),
                 0);
    snprintf(url, sizeof url, "redis+sentinel://127.0.0.1:%d/fake", c.sentinel[0].port);
    t0 = tf_now_ms();
    cl = tf_client_try(url, 0, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_ECONN, "%s: %s", redsem_err_name(rc), err);
    cr_assert(strstr(err, "not the primary") != NULL, "%s", err);
    cr_assert_lt(tf_now_ms() - t0, 3000);
    stop_cluster(&c);
}



/* WAIT after grants and refreshes: with both replicas up, acquire and refresh succeed, each
 * in one round trip (the script and WAIT pipelined: 2 requests); with one replica stopped, a
 * client that requires 2 gets REDSEM_EREPLICA and the grant is given back, and a refresh gets
 * REDSEM_EREPLICA; a client that requires 1 goes on. */
Test(sentinel, wait_for_replicas, TO)
{
    cluster c;
    start_cluster(&c);
    redsem_client *two = tf_sync_client(c.url, 2, 300), *one = tf_sync_client(c.url, 1, 300);
    redsem_sem *s2 = NULL, *s1 = NULL;
    OK(two, redsem_sem_open(two, "sync", REDSEM_STRATEGY_FAIR, 2, 10000, &s2));
    OK(one, redsem_sem_open(one, "sync", REDSEM_STRATEGY_FAIR, 2, 10000, &s1));
    redsem_permit *p = NULL, *q = NULL;
    redsem_client_stats st0, st1;
    OK(two, redsem_sem_try_acquire(s2, &p)); /* warm: the script's first EVAL */
    OK(two, redsem_client_get_stats(two, &st0));
    OK(two, redsem_permit_refresh(p));
    OK(two, redsem_client_get_stats(two, &st1));
    /* the script and WAIT; and ROLE in the same write when the connection's last check is
     * more than a second old (a slow machine) */
    cr_assert(st1.requests - st0.requests == 2 || st1.requests - st0.requests == 3,
              "a synced refresh is the script and WAIT: %llu requests",
              (unsigned long long)(st1.requests - st0.requests));
    OK(two, redsem_permit_release(p));
    redsem_permit_free(p);
    p = NULL;
    OK(one, redsem_sem_try_acquire(s1, &q)); /* held through the stop below */
    ts_server_pause(&c.replica[1], true);
    EXPECT(two, REDSEM_EREPLICA, redsem_sem_try_acquire(s2, &p));
    cr_assert_null(p);
    cr_assert(strstr(redsem_client_errmsg(two), "1 of the 2 replicas") != NULL, "%s",
              redsem_client_errmsg(two));
    cr_assert_eq(tf_holders(s1), 1, "the grant that did not reach 2 replicas was not given back");
    redsem_permit *q2 = NULL;
    OK(one, redsem_sem_try_acquire(s1, &q2)); /* 1 replica is enough for this client */
    OK(one, redsem_permit_release(q2));
    redsem_permit_free(q2);
    /* a refresh that reaches too few replicas: EREPLICA, the permit is still held */
    redsem_permit *r = NULL;
    ts_server_pause(&c.replica[1], false);
    OK(two, redsem_sem_try_acquire(s2, &r));
    ts_server_pause(&c.replica[1], true);
    EXPECT(two, REDSEM_EREPLICA, redsem_permit_refresh(r));
    cr_assert(redsem_permit_held(r));
    ts_server_pause(&c.replica[1], false);
    OK(two, redsem_permit_release(r));
    OK(one, redsem_permit_release(q));
    redsem_permit_free(r);
    redsem_permit_free(q);
    redsem_sem_free(s1);
    redsem_sem_free(s2);
    redsem_client_free(one);
    redsem_client_free(two);
    stop_cluster(&c);
}

/* The CLI through Sentinel, with --sync-replicas: 2 replicas acknowledge; 3 cannot (exit 69,
 * CMD not run). */
Test(sentinel, the_cli_with_sync_replicas, TO)
{
    cluster c;
    start_cluster(&c);
    const char *bin = getenv("REDSEM_BIN");
    cr_assert_not_null(bin, "REDSEM_BIN is not set (run through meson test)");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s run --url '%s' --sync-replicas 2 --sync-timeout 500ms --limit 1 "
             "cli-sync -- true", bin, c.url);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "with 2 replicas: status %d", st);
    char marker[300];
    snprintf(marker, sizeof marker, "%s/ran", c.primary.dir);
    snprintf(cmd, sizeof cmd, "%s run --url '%s' --sync-replicas 3 --sync-timeout 100ms --limit 1 "
             "cli-sync -- touch %s 2>/dev/null", bin, c.url, marker);
    st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 69, "with 3 replicas required: status %d", st);
    cr_assert_neq(access(marker, F_OK), 0, "CMD ran although the grant was given back");
    stop_cluster(&c);
}

typedef struct failover_waiter {
    redsem_client *c;
    redsem_sem *s;
    int rc;
    char msg[256];
} failover_waiter;

static ts_server *server_on(cluster *c, int port)
{
    if (c->primary.port == port)
        return &c->primary;
    for (int i = 0; i < 2; i++)
        if (c->replica[i].port == port)
            return &c->replica[i];
    return NULL;
}

static bool is_primary(const ts_server *s, bool want)
{
    char out[2048] = "";
    if (s == NULL || ts_command(s, out, sizeof out, "INFO", "replication", NULL) != 0)
        return false;
    return strstr(out, want ? "role:master" : "role:slave") != NULL;
}

static void *wait_through_failover(void *arg)
{
    failover_waiter *w = arg;
    redsem_permit *p = NULL;
    w->rc = redsem_sem_acquire(w->s, 60000, &p);
    snprintf(w->msg, sizeof w->msg, "%s", redsem_client_errmsg(w->c));
    if (w->rc == REDSEM_OK)
        w->rc = redsem_permit_release(p);
    redsem_permit_free(p);
    return NULL;
}

/* A waiter blocked in BLPOP on the primary while demote() makes it a replica; once the old
 * primary is a replica and the Sentinels name another one that says it is a primary, the
 * holder releases (its client follows too) and the waiter must be granted there: never an
 * error, in particular not ESERVER "UNBLOCKED". */
static void waiter_through_a_demotion(void (*demote)(cluster *c, ts_server *primary))
{
    cluster c;
    start_cluster(&c);
    char err[512];
    int rc;
    redsem_client *holder = tf_client_try(c.url, 60000, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    redsem_client *waiter = tf_client_try(c.url, 60000, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    redsem_sem *hs = NULL;
    failover_waiter w = {.c = waiter};
    OK(holder, redsem_sem_open(holder, "blocked", REDSEM_STRATEGY_FAIR, 1, 60000, &hs));
    OK(waiter, redsem_sem_open(waiter, "blocked", REDSEM_STRATEGY_FAIR, 1, 60000, &w.s));
    redsem_permit *p = NULL;
    OK(holder, redsem_sem_acquire(hs, 1000, &p));
    int before = ts_sentinels_primary_port(&c);
    ts_server *primary = server_on(&c, before);
    cr_assert_not_null(primary);
    /* the grant reaches both replicas before the failover */
    cr_assert_eq(ts_command(primary, NULL, 0, "WAIT", "2", "2000", NULL), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, wait_through_failover, &w), 0);
    /* the waiter is blocked on the primary */
    char out[2048] = "";
    for (int i = 0; i < 1000 && strstr(out, "blocked_clients:1") == NULL; i++) {
        usleep(10000);
        cr_assert_eq(ts_command(primary, out, sizeof out, "INFO", "clients", NULL), 0);
    }
    cr_assert(strstr(out, "blocked_clients:1") != NULL, "the waiter is not blocked");
    int64_t t0 = tf_now_ms();
    demote(&c, primary);
    int now = -1;
    while (tf_now_ms() - t0 < 50000) {
        now = ts_sentinels_primary_port(&c);
        if (now != before && is_primary(server_on(&c, now), true) && is_primary(primary, false))
            break;
        usleep(50000);
    }
    cr_assert(now != before && is_primary(primary, false), "no failover within 50 s");
    fprintf(stderr, "old primary demoted, Sentinels name %d: %lld ms\n", now,
            (long long)(tf_now_ms() - t0));
    OK(holder, redsem_permit_release(p));
    redsem_permit_free(p);
    pthread_join(th, NULL);
    cr_assert(w.rc == REDSEM_OK || w.rc == REDSEM_EBUSY, "waiter: %s (%s)",
              redsem_err_name(w.rc), w.msg);
    cr_assert_null(strstr(w.msg, "UNBLOCKED"), "%s", w.msg);
    redsem_sem_free(w.s);
    redsem_sem_free(hs);
    redsem_client_free(waiter);
    redsem_client_free(holder);
    stop_cluster(&c);
}

static void sentinel_failover(cluster *c, ts_server *primary)
{
    (void)primary;
    cr_assert_eq(ts_command(&c->sentinel[0], NULL, 0, "SENTINEL", "FAILOVER", "mymaster", NULL),
                 0, "SENTINEL FAILOVER refused");
}

/* SENTINEL FAILOVER: the Sentinel demotes the old primary with REPLICAOF and CLIENT KILL TYPE
 * normal in one MULTI, so the waiter's connection is closed (the "-UNBLOCKED" the server
 * queued is never written): a lost connection, re-resolved. */
Test(sentinel, a_waiter_blocked_during_sentinel_failover, TO)
{
    waiter_through_a_demotion(sentinel_failover);
}

static void replicaof_failover(cluster *c, ts_server *primary)
{
    /* promote a replica, then demote the primary under it: the primary answers its blocked
     * clients "-UNBLOCKED" at once; the Sentinels then see the change and converge */
    ts_server *to = primary == &c->replica[0] ? &c->replica[1] : &c->replica[0];
    char port[16];
    snprintf(port, sizeof port, "%d", to->port);
    cr_assert_eq(ts_command(to, NULL, 0, "REPLICAOF", "NO", "ONE", NULL), 0);
    cr_assert_eq(ts_command(primary, NULL, 0, "REPLICAOF", "127.0.0.1", port, NULL), 0);
}

/* A demotion without CLIENT KILL (FAILOVER on the primary by an operator; the Sentinels then
 * converge): the blocked BLPOP is answered "-UNBLOCKED force unblock ... (MASTER -> REPLICA)".
 * The waiter re-resolves the primary through the Sentinels and waits there. */
Test(sentinel, a_waiter_cut_by_unblocked_follows_the_new_primary, TO)
{
    waiter_through_a_demotion(replicaof_failover);
}

/* Where a grant of semaphore `name` was made: 1 on `now` (the new primary), 0 on `old`, -1
 * on both or neither. */
static int granted_on_new(const ts_server *old, const ts_server *now, const char *name)
{
    char key[128], a[32] = "", b[32] = "";
    snprintf(key, sizeof key, "redsem:{%s}:meta", name);
    /* the grant's fencing counter, not the hash: the open (which records the configuration
     * only) may have run on the old primary just before the client read the announcement and
     * the acquire on the new one */
    if (ts_command(old, a, sizeof a, "HEXISTS", key, "fence", NULL) != 0 ||
        ts_command(now, b, sizeof b, "HEXISTS", key, "fence", NULL) != 0)
        return -1;
    if (strcmp(a, "0") == 0 && strcmp(b, "1") == 0)
        return 1;
    if (strcmp(a, "1") == 0 && strcmp(b, "0") == 0)
        return 0;
    return -1;
}

/* SENTINEL FAILOVER promotes a replica and announces +switch-master, but leaves the old
 * primary a writable primary until it demotes it, seconds later: a long-lived client (its
 * connection open, nothing refused, nothing closed) must follow the announcement and be
 * served by the new primary at once, not by the old one. A client acquires fresh semaphores
 * in a loop from before the failover; every acquire that starts once the announcing Sentinel
 * names the new primary must be granted there (where the keys are says which; the old primary
 * replicates nothing to the new one, nor the new to the old until its demotion). With
 * kill_first, the Sentinel the client subscribed to (the first of its URL) is stopped
 * before: the client must have subscribed again on another one, which then runs the
 * failover. */
static void planned_failover(bool kill_first)
{
    cluster c;
    start_cluster(&c);
    char err[512];
    int rc;
    redsem_client *cl = tf_client_try(c.url, 20000, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    int n = 0;
    char name[64];
    redsem_sem *s = NULL;
    redsem_permit *p = NULL;
    /* one acquire of a fresh semaphore; its name in `name` */
#define ACQUIRE_ONE()                                                                      \
    do {                                                                                   \
        snprintf(name, sizeof name, "planned-%d", n++);                                    \
        OK(cl, redsem_sem_open(cl, name, REDSEM_STRATEGY_FAIR, 1, 60000, &s));            \
        OK(cl, redsem_sem_acquire(s, 5000, &p));                                           \
        /* granted on the old primary just before the client learnt of the switch, the   \
         * release goes to the new one, which never saw that grant: ELOST */               \
        rc = redsem_permit_release(p);                                                     \
        cr_assert(rc == REDSEM_OK || rc == REDSEM_ELOST, "release: %s (%s)",               \
                  redsem_err_name(rc), redsem_client_errmsg(cl));                          \
        redsem_permit_free(p);                                                             \
        redsem_sem_free(s);                                                                \
    } while (0)
    ACQUIRE_ONE();
    int leader = 0;
    if (kill_first) {
        ts_server_stop(&c.sentinel[0]);
        leader = 1;
        /* the client notices at its next requests and subscribes on Sentinel 1 */
        for (int i = 0; i < 20; i++) {
            ACQUIRE_ONE();
            tf_sleep_ms(10);
        }
    }
    int old_port = ts_sentinels_primary_port_of(&c, leader);
    ts_server *old = server_on(&c, old_port);
    cr_assert_not_null(old);
    cr_assert_eq(ts_command(&c.sentinel[leader], NULL, 0, "SENTINEL", "FAILOVER", "mymaster",
                            NULL),
                 0, "SENTINEL FAILOVER refused");
    /* the Sentinel that runs the failover announces +switch-master, then answers with the
     * new address: an acquire that starts after the test sees it must find the announcement
     * already in the client's subscription */
    int new_port = old_port;
    int64_t t0 = tf_now_ms(), seen = 0;
    while (tf_now_ms() - t0 < 30000) {
        new_port = ts_sentinels_primary_port_of(&c, leader);
        if (new_port > 0 && new_port != old_port) {
            seen = tf_now_ms();
            break;
        }
        ACQUIRE_ONE(); /* the client keeps using the old primary meanwhile */
    }
    cr_assert(seen > 0, "no +switch-master within 30 s of SENTINEL FAILOVER");
    ts_server *now = server_on(&c, new_port);
    cr_assert_not_null(now);
    bool old_still_primary = is_primary(old, true);
    /* the client reads its subscription every few ms: a grace of 500 ms (half the target)
     * for a loaded machine */
    int on_old = 0, on_new = 0, late = 0;
    int64_t last_old = -1;
    while (tf_now_ms() - seen < 2500) {
        int64_t start = tf_now_ms();
        ACQUIRE_ONE();
        int where = granted_on_new(old, now, name);
        cr_assert_neq(where, -1, "%s: the keys are on both servers or on neither", name);
        if (where == 1) {
            on_new++;
        } else {
            on_old++;
            last_old = start - seen;
            if (start - seen > 500)
                late++;
        }
        tf_sleep_ms(10);
    }
    fprintf(stderr, "planned failover%s: after the switch, %d acquires on the new primary, %d on "
                    "the old one (the last started %lld ms after the switch; the old primary "
                    "still a primary when the switch was seen: %s)\n",
            kill_first ? " (first Sentinel stopped)" : "", on_new, on_old, (long long)last_old,
            old_still_primary ? "yes" : "no");
    cr_assert_eq(late, 0, "%d grants on the old primary more than 500 ms after the switch",
                 late);
    cr_assert_gt(on_new, 0);
#undef ACQUIRE_ONE
    redsem_client_free(cl);
    stop_cluster(&c);
}

Test(sentinel, a_planned_failover_moves_a_long_lived_client_at_once, TO)
{
    planned_failover(false);
}

Test(sentinel, the_subscription_moves_to_the_next_sentinel, TO)
{
    planned_failover(true);
}

/* ---------------------------------------------------------------- TLS (rediss+sentinel://) */

typedef struct tls_sentinel {
    char dir[256];
    char file[5][320];
    char port[2][16];
    const char *pargv[12], *sargv[12];
    ts_server primary, sentinel;
} tls_sentinel;

static const char *cert_file(tls_sentinel *e, int slot, const char *name)
{
    snprintf(e->file[slot], sizeof e->file[slot], "%s/%s", e->dir, name);
    return e->file[slot];
}

/* TLS arguments for a server: its TLS port and certificate (a file of the certs dir). */
static void tls_args(tls_sentinel *e, const char **argv, char *port, int cert_slot)
{
    int n = 0;
    argv[n++] = "--tls-port";
    argv[n++] = port;
    argv[n++] = "--tls-cert-file";
    argv[n++] = e->file[cert_slot];
    argv[n++] = "--tls-key-file";
    argv[n++] = e->file[2];
    argv[n++] = "--tls-ca-cert-file";
    argv[n++] = e->file[3];
    argv[n++] = "--tls-auth-clients";
    argv[n++] = "no";
    argv[n] = NULL;
}

/* A TLS primary with the certificate primary_cert, and one TLS Sentinel (server.crt) that
 * names it (it need not reach it: it answers with the address it was given). Certificates
 * from support/gen-certs.sh. */
static void tls_sentinel_start(tls_sentinel *e, const char *primary_cert)
{
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/redsem-stls-XXXXXX");
    cr_assert_not_null(mkdtemp(e->dir));
    const char *gen = getenv("REDSEM_GEN_CERTS");
    cr_assert_not_null(gen, "REDSEM_GEN_CERTS is not set (run through meson test)");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "%s %s", gen, e->dir);
    cr_assert_eq(system(cmd), 0, "%s failed (is the openssl command installed?)", cmd);
    cert_file(e, 0, primary_cert);
    cert_file(e, 1, "server.crt");
    cert_file(e, 2, "server.key");
    cert_file(e, 3, "ca.crt");
    int pport = ts_free_port(), sport = ts_free_port();
    cr_assert(pport > 0 && sport > 0);
    snprintf(e->port[0], sizeof e->port[0], "%d", pport);
    snprintf(e->port[1], sizeof e->port[1], "%d", sport);
    tls_args(e, e->pargv, e->port[0], 0);
    cr_assert_eq(ts_server_start(&e->primary, e->pargv, false), 0);
    /* a Sentinel that monitors the primary's TLS port, then restarted with a TLS port of its
     * own (ts_sentinel_start writes its configuration) */
    cr_assert_eq(ts_sentinel_start(&e->sentinel, "mymaster", pport, 1, 5000, 10000), 0);
    ts_server_kill(&e->sentinel);
    tls_args(e, e->sargv, e->port[1], 1);
    for (int i = 0; e->sargv[i] != NULL; i++)
        e->sentinel.extra[e->sentinel.nextra++] = e->sargv[i];
    cr_assert_eq(ts_server_restart(&e->sentinel), 0);
}

static void tls_sentinel_stop(tls_sentinel *e)
{
    ts_server_stop(&e->sentinel);
    ts_server_stop(&e->primary);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
    (void)system(cmd);
}

static int tls_client(const char *url, const char *ca, char *err, size_t errlen)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK, "%s", url);
    cr_assert_eq(redsem_options_set_tls_ca(o, ca, NULL), REDSEM_OK);
    cr_assert_eq(redsem_options_set_connect_timeout_ms(o, 2000), REDSEM_OK);
    cr_assert_eq(redsem_options_set_retry_ms(o, 0), REDSEM_OK);
    redsem_client *c = NULL;
    err[0] = '\0';
    int rc = redsem_client_new_verbose(o, &c, err, errlen);
    redsem_options_free(o);
    redsem_client_free(c);
    return rc;
}

/* A Sentinel whose certificate does not verify: REDSEM_ETLS (not ECONN) when every Sentinel
 * refused TLS, and the CLI exits 77; ECONN (retried) while another Sentinel failed for
 * another reason (down). */
Test(sentinel, a_refused_sentinel_certificate_is_etls, TO)
{
    tls_sentinel e;
    tls_sentinel_start(&e, "server.crt");
    char url[300], err[1024];
    snprintf(url, sizeof url, "rediss+sentinel://127.0.0.1:%s/mymaster", e.port[1]);
    char other[400];
    snprintf(other, sizeof other, "%s/other-ca.crt", e.dir);
    int rc = tls_client(url, other, err, sizeof err);
    cr_assert_eq(rc, REDSEM_ETLS, "%s: %s", redsem_err_name(rc), err);
    cr_assert(strstr(err, "refused") != NULL && strstr(err, "Sentinel 127.0.0.1:") != NULL,
              "%s", err);
    /* with the right CA the Sentinel answers, and the primary serves */
    rc = tls_client(url, e.file[3], err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    /* one Sentinel refused, another down: not only TLS, so ECONN */
    snprintf(url, sizeof url, "rediss+sentinel://127.0.0.1:%s,127.0.0.1:%d/mymaster", e.port[1],
             ts_free_port());
    rc = tls_client(url, other, err, sizeof err);
    cr_assert_eq(rc, REDSEM_ECONN, "%s: %s", redsem_err_name(rc), err);
    /* the CLI: 77 (a refused certificate), not 69 (unreachable) */
    const char *bin = getenv("REDSEM_BIN");
    cr_assert_not_null(bin, "REDSEM_BIN is not set (run through meson test)");
    char cmd[1500];
    snprintf(cmd, sizeof cmd,
             "%s status --url 'rediss+sentinel://127.0.0.1:%s/mymaster' --tls-ca %s x "
             ">/dev/null 2>%s/cli.err", bin, e.port[1], other, e.dir);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 77, "the CLI: status %d", st);
    tls_sentinel_stop(&e);
}

/* The Sentinel verifies, the primary it names does not (an expired certificate): ETLS, with
 * the reason. */
Test(sentinel, a_refused_primary_certificate_behind_sentinel_is_etls, TO)
{
    tls_sentinel e;
    tls_sentinel_start(&e, "expired.crt");
    char url[300], err[1024];
    snprintf(url, sizeof url, "rediss+sentinel://127.0.0.1:%s/mymaster", e.port[1]);
    int rc = tls_client(url, e.file[3], err, sizeof err);
    cr_assert_eq(rc, REDSEM_ETLS, "%s: %s", redsem_err_name(rc), err);
    cr_assert(strstr(err, "expired") != NULL, "%s", err);
    tls_sentinel_stop(&e);
}

/* ---------------------------------------------------------------- one client, many threads */

typedef struct shared_thread {
    redsem_client *c;
    int idx;
    _Atomic int *phase; /* 0 before the switch, 1 after it was seen + 500 ms, 2 stop */
    int errors;
    char msg[256];
    char after[64]; /* a semaphore acquired in phase 1 */
} shared_thread;

static void *shared_loop(void *arg)
{
    shared_thread *t = arg;
    for (int n = 0; atomic_load(t->phase) < 2; n++) {
        int phase = atomic_load(t->phase);
        char name[64];
        snprintf(name, sizeof name, "shared-%d-%d", t->idx, n);
        redsem_sem *s = NULL;
        redsem_permit *p = NULL;
        int rc = redsem_sem_open(t->c, name, REDSEM_STRATEGY_FAIR, 1, 60000, &s);
        if (rc == REDSEM_OK)
            rc = redsem_sem_acquire(s, 5000, &p);
        if (rc == REDSEM_OK) {
            rc = redsem_permit_release(p);
            if (rc == REDSEM_ELOST) /* granted on the old primary at the switch */
                rc = REDSEM_OK;
        }
        if (rc != REDSEM_OK && t->errors++ == 0)
            snprintf(t->msg, sizeof t->msg, "%s: %s", redsem_err_name(rc),
                     redsem_client_errmsg(t->c));
        if (rc == REDSEM_OK && phase == 1 && t->after[0] == '\0')
            snprintf(t->after, sizeof t->after, "%s", name);
        redsem_permit_free(p);
        redsem_sem_free(s);
    }
    return NULL;
}

/* 8 threads share one client (its lanes share one subscription) through SENTINEL FAILOVER:
 * no error, and each thread's first acquire that starts 500 ms after the switch is on the new
 * primary. (Criterion cannot start under ThreadSanitizer: CI's TSan step does not run it.) */
Test(sentinel, threads_sharing_a_client_follow_a_planned_failover, TO)
{
    cluster c;
    start_cluster(&c);
    char err[512];
    int rc;
    redsem_client *cl = tf_client_try(c.url, 20000, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    _Atomic int phase = 0;
    shared_thread t[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        t[i] = (shared_thread){.c = cl, .idx = i, .phase = &phase};
        cr_assert_eq(pthread_create(&th[i], NULL, shared_loop, &t[i]), 0);
    }
    tf_sleep_ms(500);
    int old_port = ts_sentinels_primary_port(&c);
    cr_assert_eq(ts_command(&c.sentinel[0], NULL, 0, "SENTINEL", "FAILOVER", "mymaster", NULL),
                 0, "SENTINEL FAILOVER refused");
    int new_port = old_port;
    int64_t t0 = tf_now_ms();
    while (tf_now_ms() - t0 < 30000 &&
           ((new_port = ts_sentinels_primary_port(&c)) == old_port || new_port < 0))
        tf_sleep_ms(10);
    cr_assert(new_port > 0 && new_port != old_port, "no failover within 30 s");
    tf_sleep_ms(500);
    atomic_store(&phase, 1);
    for (int i = 0; i < 200; i++) {
        bool all = true;
        for (int k = 0; k < 8; k++)
            all = all && t[k].after[0] != '\0';
        if (all)
            break;
        tf_sleep_ms(50);
    }
    atomic_store(&phase, 2);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    ts_server *old = server_on(&c, old_port), *now = server_on(&c, new_port);
    for (int i = 0; i < 8; i++) {
        cr_expect_eq(t[i].errors, 0, "thread %d: %d errors, the first %s", i, t[i].errors,
                     t[i].msg);
        cr_assert_neq(t[i].after[0], '\0', "thread %d acquired nothing after the switch", i);
        cr_expect_eq(granted_on_new(old, now, t[i].after), 1,
                     "thread %d: %s was not granted on the new primary", i, t[i].after);
    }
    redsem_client_free(cl);
    stop_cluster(&c);
}

/* Each connection to a Sentinel-named primary re-checks ROLE once its last check is older
 * than a second, in the same write as a request (one more request counted, no extra round
 * trip), and not more often. */
Test(sentinel, role_is_rechecked_every_second, TO)
{
    cluster c;
    start_cluster(&c);
    char err[512];
    int rc;
    redsem_client *cl = tf_client_try(c.url, 20000, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    redsem_client_stats a, b;
    tf_sleep_ms(1100);
    OK(cl, redsem_client_get_stats(cl, &a));
    OK(cl, redsem_client_ping(cl));
    OK(cl, redsem_client_get_stats(cl, &b));
    cr_assert_eq(b.requests - a.requests, 2, "PING after 1.1 s idle: %llu requests (ROLE and PING)",
                 (unsigned long long)(b.requests - a.requests));
    cr_assert_eq(b.connects, a.connects, "no new connection");
    int64_t t0 = tf_now_ms();
    for (int i = 0; i < 50; i++)
        OK(cl, redsem_client_ping(cl));
    int64_t secs = (tf_now_ms() - t0) / 1000;
    redsem_client_stats d;
    OK(cl, redsem_client_get_stats(cl, &d));
    cr_assert(d.requests - b.requests >= 50 && d.requests - b.requests <= 50 + 1 + (uint64_t)secs,
              "50 PINGs in %lld s: %llu requests", (long long)secs,
              (unsigned long long)(d.requests - b.requests));
    redsem_client_free(cl);
    stop_cluster(&c);
}

/* ------------------------------------------------------------ the event-loop API */

/* A poll() loop with a timer of the test's own (on the loop engine's build, the engine takes
 * the operations of a client whose loop gives a timer). */
typedef struct sloop {
    redsem_async *a;
    int fd;
    int64_t timer_at; /* ms, -1: none */
} sloop;

typedef struct sgot {
    bool done;
    int rc;
    redsem_permit *permit;
    char errmsg[512];
} sgot;

static void sl_socket(redsem_async *a, int fd, int what, void *data)
{
    (void)a;
    sloop *l = data;
    l->fd = (what & REDSEM_WATCH_REMOVE) ? -1 : fd;
}

static void sl_timer(redsem_async *a, int64_t ms, void *data)
{
    (void)a;
    sloop *l = data;
    l->timer_at = ms < 0 ? -1 : tf_now_ms() + ms;
}

static void sl_done(redsem_async *a, const redsem_result *r, void *user)
{
    (void)a;
    sgot *g = user;
    g->rc = r->rc;
    g->permit = r->permit;
    redsem_status_free(r->status); /* a status: only its outcome is looked at */
    snprintf(g->errmsg, sizeof g->errmsg, "%s", r->errmsg);
    g->done = true;
}

/* Run the loop until g is done or ms passed; whether it is done. */
static bool sl_run(sloop *l, sgot *g, int64_t ms)
{
    int64_t end = tf_now_ms() + ms;
    while (!g->done && tf_now_ms() < end) {
        tf_poll_turn(l->a, &l->fd, &l->timer_at);
    }
    return g->done;
}

static void sl_up(sloop *l, redsem_client *cl)
{
    *l = (sloop){.fd = -1, .timer_at = -1};
    cr_assert_eq(redsem_async_new(cl, &l->a), REDSEM_OK);
    cr_assert_eq(redsem_async_set_loop(l->a, sl_socket, sl_timer, l), REDSEM_OK);
}

/* The threads of this process now (/proc/self/task). */
static int thread_count(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    for (struct dirent *de; (de = readdir(d)) != NULL;)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* On the loop engine's build the threads started are none; else (workers) some. */
static void expect_threads(int before, int after)
{
    cr_expect_eq(after, before, "threads were started: %d before, %d after", before, after);
}

/* One acquire of s (named name) and its release, on the loop. */
static void loop_acquire_release_of(sloop *l, redsem_sem *s, const char *name)
{
    sgot g = {0};
    cr_assert_eq(redsem_sem_acquire_async(l->a, s, 1, 5000, sl_done, &g, NULL), REDSEM_OK);
    cr_assert(sl_run(l, &g, 30000), "%s: no callback", name);
    cr_assert_eq(g.rc, REDSEM_OK, "%s: %s: %s", name, redsem_err_name(g.rc), g.errmsg);
    sgot r = {0};
    cr_assert_eq(redsem_permit_release_async(l->a, g.permit, sl_done, &r, NULL), REDSEM_OK);
    cr_assert(sl_run(l, &r, 30000), "%s: no release callback", name);
    cr_assert(r.rc == REDSEM_OK || r.rc == REDSEM_ELOST, "%s: release: %s: %s", name,
              redsem_err_name(r.rc), r.errmsg);
    redsem_permit_free(g.permit);
}

/* The same on a fresh fair semaphore `name` (opened by the blocking API). */
static void loop_acquire_release(sloop *l, redsem_client *cl, const char *name)
{
    redsem_sem *s = NULL;
    OK(cl, redsem_sem_open(cl, name, REDSEM_STRATEGY_FAIR, 1, 60000, &s));
    loop_acquire_release_of(l, s, name);
    redsem_sem_free(s);
}

/* A Sentinel client's operations on the loop: granted on the primary with no thread
 * started, the primary's address from the client's watch at first; then, the watch's
 * Sentinel stopped (its subscription lost: the loop never subscribes again) and the loop's
 * connections killed, asked of the remaining Sentinels on the loop (dialled, asked, judged
 * without blocking), the first Sentinel of the URL down. */
Test(sentinel, the_event_loop_api_on_a_sentinel_client_starts_no_thread, TO)
{
    cluster c;
    start_cluster(&c);
    char err[512], url[600];
    int rc;
    snprintf(url, sizeof url, "redis+sentinel://127.0.0.1:%d,%s", ts_free_port(),
             c.url + strlen("redis+sentinel://"));
    redsem_client *cl = tf_client_try(url, 20000, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    int before = thread_count();
    sloop l;
    sl_up(&l, cl);
    loop_acquire_release(&l, cl, "loop-sent-0");
    redsem_sem *s = NULL; /* opened now: a blocking call would subscribe the watch again */
    OK(cl, redsem_sem_open(cl, "loop-sent-1", REDSEM_STRATEGY_FAIR, 1, 60000, &s));
    ts_server_stop(&c.sentinel[0]); /* the one the watch subscribed to */
    cr_assert_eq(ts_command(&c.primary, NULL, 0, "CLIENT", "KILL", "TYPE", "normal", NULL), 0);
    redsem_client_stats a, b;
    OK(cl, redsem_client_get_stats(cl, &a));
    loop_acquire_release_of(&l, s, "loop-sent-1");
    OK(cl, redsem_client_get_stats(cl, &b));
    redsem_sem_free(s);
    int after = thread_count();
    cr_expect_gt(b.connects, a.connects, "the loop did not connect again");
    char out[64] = "";
    cr_assert_eq(ts_command(&c.primary, out, sizeof out, "HEXISTS", "redsem:{loop-sent-1}:meta",
                            "fence", NULL),
                 0);
    cr_assert_str_eq(out, "1", "the semaphore was not granted on the primary");
    expect_threads(before, after);
    redsem_async_free(l.a);
    redsem_client_free(cl);
    stop_cluster(&c);
}

/* Every Sentinel down when the loop must find the primary again: the acquire ends with the
 * blocking resolve's code and text (what each Sentinel said, and the primary's name) once
 * its retry window ends, never granted elsewhere. */
Test(sentinel, no_sentinel_on_the_loop_reads_as_on_a_blocking_resolve, TO)
{
    cluster c;
    start_cluster(&c);
    char err[512];
    int rc;
    redsem_client *cl = tf_client_try(c.url, 500, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    sloop l;
    sl_up(&l, cl);
    loop_acquire_release(&l, cl, "loop-nos-0");
    redsem_sem *s = NULL;
    OK(cl, redsem_sem_open(cl, "loop-nos-1", REDSEM_STRATEGY_BASIC, 1, 60000, &s));
    for (int i = 0; i < 3; i++)
        ts_server_stop(&c.sentinel[i]);
    cr_assert_eq(ts_command(&c.primary, NULL, 0, "CLIENT", "KILL", "TYPE", "normal", NULL), 0);
    sgot g = {0};
    OK(cl, redsem_sem_acquire_async(l.a, s, 1, 0, sl_done, &g, NULL));
    cr_assert(sl_run(&l, &g, 30000), "no callback");
    /* EUNKNOWN: its first copy went to the connection killed (not read yet) */
    cr_assert(g.rc == REDSEM_ECONN || g.rc == REDSEM_EUNKNOWN, "%s: %s", redsem_err_name(g.rc),
              g.errmsg);
    cr_assert(strstr(g.errmsg, "Sentinel 127.0.0.1:") != NULL &&
                  strstr(g.errmsg, "(primary 'mymaster')") != NULL,
              "%s", g.errmsg);
    redsem_sem_free(s);
    redsem_async_free(l.a);
    redsem_client_free(cl);
    stop_cluster(&c);
}

/* After SENTINEL FAILOVER the next acquire on the loop reaches the new primary (its keys
 * there, not on the old one), with no thread started. */
Test(sentinel, the_event_loop_api_follows_a_sentinel_failover, TO)
{
    cluster c;
    start_cluster(&c);
    char err[512];
    int rc;
    redsem_client *cl = tf_client_try(c.url, 20000, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    int before = thread_count();
    sloop l;
    sl_up(&l, cl);
    loop_acquire_release(&l, cl, "loop-fo-0"); /* the loop's connections are open */
    int old_port = ts_sentinels_primary_port_of(&c, 0);
    ts_server *old = server_on(&c, old_port);
    cr_assert_not_null(old);
    cr_assert_eq(ts_command(&c.sentinel[0], NULL, 0, "SENTINEL", "FAILOVER", "mymaster", NULL),
                 0, "SENTINEL FAILOVER refused");
    int new_port = old_port;
    int64_t t0 = tf_now_ms();
    while (tf_now_ms() - t0 < 30000 && (new_port <= 0 || new_port == old_port)) {
        tf_sleep_ms(20);
        new_port = ts_sentinels_primary_port_of(&c, 0);
    }
    cr_assert(new_port > 0 && new_port != old_port, "no failover within 30 s");
    ts_server *now = server_on(&c, new_port);
    cr_assert_not_null(now);
    tf_sleep_ms(500); /* the announcement reaches the client's watch (a loaded machine) */
    loop_acquire_release(&l, cl, "loop-fo-1");
    cr_assert_eq(granted_on_new(old, now, "loop-fo-1"), 1,
                 "the acquire after the failover was not granted on the new primary");
    expect_threads(before, thread_count());
    redsem_async_free(l.a);
    redsem_client_free(cl);
    stop_cluster(&c);
}

/* rediss+sentinel:// on the loop: the Sentinel asked over TLS on the loop (its subscription
 * cut, the loop's connections killed), then the primary dialled over TLS, its ROLE checked;
 * granted there, no thread started. */
Test(sentinel, the_event_loop_api_asks_a_tls_sentinel, TO)
{
    tls_sentinel e;
    tls_sentinel_start(&e, "server.crt");
    char url[300];
    snprintf(url, sizeof url, "rediss+sentinel://127.0.0.1:%s/mymaster", e.port[1]);
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK, "%s", url);
    cr_assert_eq(redsem_options_set_tls_ca(o, e.file[3], NULL), REDSEM_OK);
    cr_assert_eq(redsem_options_set_retry_ms(o, 5000), REDSEM_OK);
    redsem_client *cl = NULL;
    char err[512] = "";
    int rc = redsem_client_new_verbose(o, &cl, err, sizeof err);
    redsem_options_free(o);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    int before = thread_count();
    sloop l;
    sl_up(&l, cl);
    loop_acquire_release(&l, cl, "loop-tls-0");
    redsem_sem *s = NULL;
    OK(cl, redsem_sem_open(cl, "loop-tls-1", REDSEM_STRATEGY_FAIR, 1, 60000, &s));
    cr_assert_eq(ts_command(&e.sentinel, NULL, 0, "CLIENT", "KILL", "TYPE", "pubsub", NULL), 0);
    cr_assert_eq(ts_command(&e.primary, NULL, 0, "CLIENT", "KILL", "TYPE", "normal", NULL), 0);
    redsem_client_stats a, b;
    OK(cl, redsem_client_get_stats(cl, &a));
    loop_acquire_release_of(&l, s, "loop-tls-1");
    OK(cl, redsem_client_get_stats(cl, &b));
    cr_expect_gt(b.connects, a.connects, "the loop did not connect again");
    expect_threads(before, thread_count());
    redsem_sem_free(s);
    redsem_async_free(l.a);
    redsem_client_free(cl);
    tls_sentinel_stop(&e);
}

/* The primary demoted under the loop's open connection, no connection closed (REPLICAOF by
 * an operator; the Sentinels converge later): the next acquire on the loop is answered
 * READONLY there (nothing applied), gives the connection up and is resent, resolving again
 * (the old address refused by ROLE until the Sentinels name the new primary), within its
 * retry window: granted on the new primary, never an error. */
Test(sentinel, the_event_loop_api_follows_a_demotion_answered_readonly, TO)
{
    cluster c;
    start_cluster(&c);
    char err[512];
    int rc;
    redsem_client *cl = tf_client_try(c.url, 60000, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    sloop l;
    sl_up(&l, cl);
    loop_acquire_release(&l, cl, "loop-ro-0"); /* the loop's connection is open */
    redsem_sem *s = NULL;
    OK(cl, redsem_sem_open(cl, "loop-ro-1", REDSEM_STRATEGY_BASIC, 1, 60000, &s));
    int old_port = ts_sentinels_primary_port(&c);
    ts_server *old = server_on(&c, old_port);
    cr_assert_not_null(old);
    replicaof_failover(&c, old);
    cr_assert(is_primary(old, false), "the primary was not demoted");
    redsem_client_stats a, b;
    OK(cl, redsem_client_get_stats(cl, &a));
    loop_acquire_release_of(&l, s, "loop-ro-1");
    OK(cl, redsem_client_get_stats(cl, &b));
    cr_expect_gt(b.retries, a.retries, "no resend");
    int new_port = ts_sentinels_primary_port(&c);
    ts_server *now = server_on(&c, new_port);
    cr_assert(now != NULL && now != old, "the Sentinels name no new primary");
    char out[64] = "";
    cr_assert_eq(ts_command(now, out, sizeof out, "HEXISTS", "redsem:{loop-ro-1}:meta", "fence",
                            NULL),
                 0);
    cr_assert_str_eq(out, "1", "not granted on the new primary");
    redsem_sem_free(s);
    redsem_async_free(l.a);
    redsem_client_free(cl);
    stop_cluster(&c);
}

/* A status on the loop, waited for. */
static void loop_status(sloop *l, redsem_sem *s)
{
    sgot g = {0};
    cr_assert_eq(redsem_sem_status_async(l->a, s, 4, sl_done, &g, NULL), REDSEM_OK);
    cr_assert(sl_run(l, &g, 30000), "no status callback");
    cr_assert_eq(g.rc, REDSEM_OK, "%s: %s", redsem_err_name(g.rc), g.errmsg);
}

/* On the loop too, the primary's ROLE is re-checked on an open connection once the last
 * check is more than a second old, ahead of a request in the same write (one more request
 * counted, no new connection), and not more often. */
Test(sentinel, role_is_rechecked_every_second_on_the_loop, TO)
{
    cluster c;
    start_cluster(&c);
    char err[512];
    int rc;
    redsem_client *cl = tf_client_try(c.url, 20000, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    sloop l;
    sl_up(&l, cl);
    redsem_sem *s = NULL;
    OK(cl, redsem_sem_open(cl, "loop-role", REDSEM_STRATEGY_BASIC, 1, 60000, &s));
    loop_status(&l, s); /* the loop's connection is open */
    redsem_client_stats a, b, d;
    tf_sleep_ms(1100);
    OK(cl, redsem_client_get_stats(cl, &a));
    loop_status(&l, s);
    OK(cl, redsem_client_get_stats(cl, &b));
    cr_assert_eq(b.requests - a.requests, 2, "a status after 1.1 s idle: %llu requests",
                 (unsigned long long)(b.requests - a.requests));
    cr_assert_eq(b.connects, a.connects, "no new connection");
    int64_t t0 = tf_now_ms();
    for (int i = 0; i < 20; i++)
        loop_status(&l, s);
    int64_t secs = (tf_now_ms() - t0) / 1000;
    OK(cl, redsem_client_get_stats(cl, &d));
    cr_assert(d.requests - b.requests >= 20 && d.requests - b.requests <= 20 + 1 + (uint64_t)secs,
              "20 statuses in %lld s: %llu requests", (long long)secs,
              (unsigned long long)(d.requests - b.requests));
    redsem_sem_free(s);
    redsem_async_free(l.a);
    redsem_client_free(cl);
    stop_cluster(&c);
}
