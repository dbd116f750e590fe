/* A Sentinel-managed primary (redis+sentinel://): one primary, two replicas and three
 * Sentinels on loopback, all started here (redis-server CONF --sentinel is what Debian's
 * redis-sentinel runs), with short down-after and failover timeouts. Using it, a failover
 * under a client, and the clear refusals. The failover under contended load, with counts, is
 * in the fault suite. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define TO .timeout = 120

typedef struct cluster {
    ts_server primary, replica[2], sentinel[3];
    char replicaof[2][32];
    const char *rargv[2][4];
    char url[512];
} cluster;

static int info_int(const ts_server *s, const char *section, const char *field)
{
    char out[8192] = "";
    if (ts_command(s, out, sizeof out, "INFO", section, NULL) != 0)
        return -1;
    const char *p = strstr(out, field);
    return p ? atoi(p + strlen(field) + 1) : -1;
}

static bool replicas_connected(const ts_server *primary)
{
    return info_int(primary, "replication", "connected_slaves") == 2;
}

/* A Sentinel that knows both replicas and both other Sentinels can fail the primary over. */
static bool sentinel_ready(const ts_server *s)
{
    char out[4096] = "";
    if (ts_command(s, out, sizeof out, "INFO", "sentinel", NULL) != 0)
        return false;
    return strstr(out, "slaves=2,sentinels=3") != NULL;
}

static bool wait_until(bool (*cond)(const ts_server *), const ts_server *s, int ms)
{
    int64_t until = tf_now_ms() + ms;
    while (!cond(s)) {
        if (tf_now_ms() >= until)
            return false;
        tf_sleep_ms(50);
    }
    return true;
}

static void start_cluster(cluster *c)
{
    memset(c, 0, sizeof *c);
    cr_assert_eq(ts_server_start(&c->primary, NULL, true), 0);
    for (int i = 0; i < 2; i++) {
        snprintf(c->replicaof[i], sizeof c->replicaof[i], "%d", c->primary.port);
        c->rargv[i][0] = "--replicaof";
        c->rargv[i][1] = "127.0.0.1";
        c->rargv[i][2] = c->replicaof[i];
        c->rargv[i][3] = NULL;
        cr_assert_eq(ts_server_start(&c->replica[i], c->rargv[i], true), 0);
    }
    cr_assert(wait_until(replicas_connected, &c->primary, 10000), "the replicas never connected");
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ts_sentinel_start(&c->sentinel[i], "mymaster", c->primary.port, 2, 500,
                                       2000),
                     0);
    /* every Sentinel has found both replicas and the other Sentinels */
    for (int i = 0; i < 3; i++)
        cr_assert(wait_until(sentinel_ready, &c->sentinel[i], 15000),
                  "Sentinel %d never saw both replicas and both other Sentinels", i);
    snprintf(c->url, sizeof c->url,
             "redis+sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/mymaster",
             c->sentinel[0].port, c->sentinel[1].port, c->sentinel[2].port);
}

static void stop_cluster(cluster *c)
{
    for (int i = 0; i < 3; i++)
        ts_server_stop(&c->sentinel[i]);
    for (int i = 0; i < 2; i++)
        ts_server_stop(&c->replica[i]);
    ts_server_stop(&c->primary);
}

static redsem_client *client_of(const char *url, int64_t retry_ms, int *rc_out, char *err,
                                size_t errlen)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK, "%s", url);
    if (retry_ms >= 0)
        cr_assert_eq(redsem_options_set_retry_ms(o, retry_ms), REDSEM_OK);
    cr_assert_eq(redsem_options_set_connect_timeout_ms(o, 1000), REDSEM_OK);
    redsem_client *c = NULL;
    *rc_out = redsem_client_new_verbose(o, &c, err, errlen);
    redsem_options_free(o);
    return c;
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
    redsem_client *cl = client_of(url, -1, &rc, err, sizeof err);
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
    redsem_client *cl = client_of(c.url, 20000, &rc, err, sizeof err);
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
    char out[64] = "";
    cr_assert_eq(ts_command(&c.sentinel[0], out, sizeof out, "SENTINEL", "get-master-addr-by-name",
                            "mymaster", NULL),
                 0);
    cr_assert_neq(atoi(out), old_port, "no failover happened");
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
    redsem_client *cl = client_of(url, 0, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_ECONN, "%s: %s", redsem_err_name(rc), err);
    cr_assert(strstr(err, "Sentinel 127.0.0.1:") != NULL && strstr(err, "mymaster") != NULL,
              "%s", err);
    cr_assert_lt(tf_now_ms() - t0, 3000);
    cr_assert_null(cl);
    /* a name no Sentinel knows */
    snprintf(url, sizeof url, "redis+sentinel://127.0.0.1:%d/nosuchmaster", c.sentinel[0].port);
    cl = client_of(url, 0, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_ECONN, "%s: %s", redsem_err_name(rc), err);
    cr_assert(strstr(err, "knows no primary named 'nosuchmaster'") != NULL, "%s", err);
    /* a plain Redis given as a Sentinel */
    snprintf(url, sizeof url, "redis+sentinel://127.0.0.1:%d/mymaster", c.replica[0].port);
    cl = client_of(url, 0, &rc, err, sizeof err);
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
    cl = client_of(url, 0, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_ECONN, "%s: %s", redsem_err_name(rc), err);
    cr_assert(strstr(err, "not the primary") != NULL, "%s", err);
    cr_assert_lt(tf_now_ms() - t0, 3000);
    stop_cluster(&c);
}
