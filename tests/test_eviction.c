/* A server that may evict keys is refused (docs/guarantees.md, "Eviction of the keys"):
 * maxmemory set with any maxmemory-policy but noeviction fails redsem_client_new() with
 * REDSEM_EEVICTION, on the first connection and on a reconnect, directly, through Sentinel
 * and on a Redis Cluster node's first use, unless redsem_options_set_allow_eviction() is set; noeviction and maxmemory 0
 * are accepted. Each test starts the servers it needs (the suite's own server has no
 * maxmemory). The CLI's --allow-eviction and exit 78: tests/cli/test_cli.c. */
#include <stdio.h>
#include <string.h>

#include "cluster.h"
#include "fixture.h"
#include "sentinel.h"

#define TO .timeout = 120

/* A private server started with these maxmemory settings (NULL: not set). */
static void start(ts_server *srv, const char *maxmemory, const char *policy)
{
    static const char *args[6];
    int n = 0;
    if (maxmemory != NULL) {
        args[n++] = "--maxmemory";
        args[n++] = maxmemory;
    }
    if (policy != NULL) {
        args[n++] = "--maxmemory-policy";
        args[n++] = policy;
    }
    args[n] = NULL;
    cr_assert_eq(ts_server_start(srv, args, false), 0, "cannot start redis-server");
}

/* redsem_client_new_verbose() on url, with or without allow_eviction: its status, its
 * message in err, and the client on success (else NULL). */
static int connect_to(const char *url, bool allow, redsem_client **ret, char *err, size_t len)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
    if (allow)
        cr_assert_eq(redsem_options_set_allow_eviction(o, true), REDSEM_OK);
    err[0] = '\0';
    *ret = NULL;
    int rc = redsem_client_new_verbose(o, ret, err, len);
    redsem_options_free(o);
    return rc;
}

/* Every strategy and the lock work on c: open, acquire, release. */
static void use(redsem_client *c)
{
    for (int k = 0; k < 4; k++) {
        const char *name = tf_name("evict");
        redsem_sem *s = NULL;
        redsem_lock *l = NULL;
        redsem_permit *p = NULL;
        if (k < 3) {
            OK(c, redsem_sem_open(c, name, (redsem_strategy)(k + 1), 1, 5000, &s));
            OK(c, redsem_sem_try_acquire(s, &p));
        } else {
            OK(c, redsem_lock_open(c, name, 5000, &l));
            OK(c, redsem_lock_try_acquire(l, &p));
        }
        OK(c, redsem_permit_release(p));
        redsem_permit_free(p);
        redsem_sem_free(s);
        redsem_lock_free(l);
    }
}

static void refused(const char *policy)
{
    ts_server srv;
    start(&srv, "100mb", policy);
    redsem_client *c = NULL;
    char err[512];
    int rc = connect_to(srv.url, false, &c, err, sizeof err);
    cr_expect_eq(rc, REDSEM_EEVICTION, "%s: %s: %s", policy, redsem_err_name(rc), err);
    cr_expect_null(c);
    cr_expect(strstr(err, policy) != NULL, "the message names the policy: %s", err);
    cr_expect(strstr(err, "redsem_options_set_allow_eviction") != NULL &&
                  strstr(err, "--allow-eviction") != NULL,
              "the message names the opt-in: %s", err);
    cr_expect(redsem_is_fault(REDSEM_EEVICTION));
    cr_expect_str_eq(redsem_err_name(REDSEM_EEVICTION), "REDSEM_EEVICTION");

    /* the opt-in: accepted, and no INFO memory is sent (TIME is the only request) */
    rc = connect_to(srv.url, true, &c, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s with allow_eviction: %s: %s", policy, redsem_err_name(rc),
                 err);
    redsem_client_stats st;
    OK(c, redsem_client_get_stats(c, &st));
    cr_expect_eq(st.requests, 1, "%llu requests at connect", (unsigned long long)st.requests);
    use(c);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

Test(eviction, allow_eviction_null_options)
{
    cr_expect_eq(redsem_options_set_allow_eviction(NULL, true), REDSEM_EINVAL);
    cr_expect_eq(redsem_options_set_allow_eviction(NULL, false), REDSEM_EINVAL);
}

Test(eviction, volatile_lru_is_refused, TO) { refused("volatile-lru"); }
Test(eviction, allkeys_lru_is_refused, TO) { refused("allkeys-lru"); }
Test(eviction, volatile_ttl_is_refused, TO) { refused("volatile-ttl"); }

static void accepted(const char *maxmemory, const char *policy)
{
    ts_server srv;
    start(&srv, maxmemory, policy);
    redsem_client *c = NULL;
    char err[512];
    int rc = connect_to(srv.url, false, &c, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "maxmemory %s, %s: %s: %s", maxmemory, policy,
                 redsem_err_name(rc), err);
    redsem_client_stats st;
    OK(c, redsem_client_get_stats(c, &st));
    cr_expect_eq(st.requests, 2, "%llu requests at connect (TIME, INFO memory)",
                 (unsigned long long)st.requests);
    use(c);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

Test(eviction, noeviction_is_accepted, TO) { accepted("100mb", "noeviction"); }
Test(eviction, maxmemory_0_is_accepted, TO) { accepted("0", "volatile-lru"); }

/* Every new connection checks: a policy changed under a connected client is refused at its
 * next reconnect (here after CLIENT KILL), not before. */
Test(eviction, reconnect_checks_again, TO)
{
    ts_server srv;
    start(&srv, "100mb", "noeviction");
    redsem_client *c = NULL;
    char err[512];
    int rc = connect_to(srv.url, false, &c, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    OK(c, redsem_client_ping(c));
    char reply[256];
    cr_assert_eq(ts_command(&srv, reply, sizeof reply, "CONFIG", "SET", "maxmemory-policy",
                            "volatile-lru", NULL),
                 0, "%s", reply);
    OK(c, redsem_client_ping(c)); /* the open connection is not checked again */
    cr_assert_eq(ts_command(&srv, reply, sizeof reply, "CLIENT", "KILL", "TYPE", "normal",
                            "SKIPME", "yes", NULL),
                 0, "%s", reply);
    EXPECT(c, REDSEM_EEVICTION, redsem_client_ping(c));
    cr_expect(strstr(redsem_client_errmsg(c), "volatile-lru") != NULL, "%s",
              redsem_client_errmsg(c));
    redsem_sem *s = NULL;
    EXPECT(c, REDSEM_EEVICTION, redsem_sem_open(c, tf_name("evict"), REDSEM_STRATEGY_FAIR, 1,
                                                5000, &s));
    cr_assert_eq(ts_command(&srv, reply, sizeof reply, "CONFIG", "SET", "maxmemory-policy",
                            "noeviction", NULL),
                 0, "%s", reply);
    OK(c, redsem_client_ping(c));
    use(c);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

/* An ACL user without INFO: the connect fails with REDSEM_EPERM and says what to do. */
Test(eviction, info_refused_by_acl, TO)
{
    ts_server srv;
    start(&srv, NULL, NULL);
    char reply[256];
    cr_assert_eq(ts_command(&srv, reply, sizeof reply, "ACL", "SETUSER", "noinfo", "on", ">pw",
                            "~*", "+@all", "-info", NULL),
                 0, "%s", reply);
    char url[512];
    snprintf(url, sizeof url, "unix://noinfo:pw@%s", srv.sock);
    redsem_client *c = NULL;
    char err[512];
    int rc = connect_to(url, false, &c, err, sizeof err);
    cr_expect_eq(rc, REDSEM_EPERM, "%s: %s", redsem_err_name(rc), err);
    cr_expect(strstr(err, "NOPERM") != NULL && strstr(err, "allow eviction") != NULL, "%s",
              err);
    rc = connect_to(url, true, &c, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    use(c);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

/* Through Sentinel: the primary that the Sentinels name is the one checked. */
Test(eviction, sentinel_primary_is_checked, .timeout = 180)
{
    ts_sentinels st;
    cr_assert_eq(ts_sentinels_start(&st), 0, "could not start the Sentinel setup");
    char err[512];
    redsem_client *c = NULL;
    int rc = connect_to(st.url, false, &c, err, sizeof err);
    cr_expect_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    redsem_client_free(c);
    char reply[256];
    cr_assert_eq(ts_command(&st.primary, reply, sizeof reply, "CONFIG", "SET", "maxmemory",
                            "100mb", NULL),
                 0, "%s", reply);
    cr_assert_eq(ts_command(&st.primary, reply, sizeof reply, "CONFIG", "SET",
                            "maxmemory-policy", "allkeys-lfu", NULL),
                 0, "%s", reply);
    rc = connect_to(st.url, false, &c, err, sizeof err);
    cr_expect_eq(rc, REDSEM_EEVICTION, "%s: %s", redsem_err_name(rc), err);
    char port[16];
    snprintf(port, sizeof port, ":%d ", st.primary.port);
    cr_expect(strstr(err, port) != NULL && strstr(err, "allkeys-lfu") != NULL,
              "names the primary (%s) and its policy: %s", port, err);
    rc = connect_to(st.url, true, &c, err, sizeof err);
    cr_expect_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    redsem_client_free(c);
    ts_sentinels_stop(&st);
}

/* A Redis Cluster: each node is checked when it is first connected; a name served by a
 * primary that may evict is refused, the others work. */
Test(eviction, cluster_node_is_checked_on_first_use, .timeout = 180)
{
    ts_cluster cl;
    cr_assert_eq(ts_cluster_start(&cl, 2, 0), 0, "could not start the cluster");
    char reply[256];
    /* node 1 may evict; the seed asked first (node 0) does not */
    cr_assert_eq(ts_command(&cl.node[1], reply, sizeof reply, "CONFIG", "SET", "maxmemory",
                            "100mb", NULL),
                 0, "%s", reply);
    cr_assert_eq(ts_command(&cl.node[1], reply, sizeof reply, "CONFIG", "SET",
                            "maxmemory-policy", "volatile-lfu", NULL),
                 0, "%s", reply);
    char err[512];
    redsem_client *c = NULL;
    int rc = connect_to(cl.url, false, &c, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    int ok = 0, refused_n = 0, other = 0;
    for (int i = 0; i < 20; i++) {
        char name[32];
        snprintf(name, sizeof name, "ev-%d", i);
        redsem_sem *s = NULL;
        rc = redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, 1, 5000, &s);
        if (rc == REDSEM_OK)
            ok++;
        else if (rc == REDSEM_EEVICTION && strstr(redsem_client_errmsg(c), "volatile-lfu"))
            refused_n++;
        else
            other++;
        if (rc != REDSEM_OK && rc != REDSEM_EEVICTION)
            fprintf(stderr, "%s: %s: %s\n", name, redsem_err_name(rc), redsem_client_errmsg(c));
        redsem_sem_free(s);
    }
    cr_expect(ok > 0 && refused_n > 0 && other == 0,
              "20 names over 2 primaries: %d opened, %d refused, %d other", ok, refused_n, other);
    redsem_client_free(c);
    /* with the opt-in every name works */
    rc = connect_to(cl.url, true, &c, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "%s: %s", redsem_err_name(rc), err);
    for (int i = 0; i < 20; i++) {
        char name[32];
        snprintf(name, sizeof name, "ev-%d", i);
        redsem_sem *s = NULL;
        OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, 1, 5000, &s));
        redsem_sem_free(s);
    }
    redsem_client_free(c);
    ts_cluster_stop(&cl);
}
