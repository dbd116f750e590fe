/* The minimal ACL of docs/guarantees.md ("The minimal ACL"), read from the document itself
 * (REDSEM_GUARANTEES) and applied as written to a user of a private redis-server: every
 * operation of the library and of the CLI works as that user, and the server's ACL LOG
 * records no refusal at all (not even those redsem tolerates, as TIME or the control list's
 * LPUSH). Without one command the scripts call, the refusal inside the script is
 * REDSEM_EPERM (CLI: exit 77), not REDSEM_ESERVER (76). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "harness.h"

#define TO .timeout = 180

static void teardown(void)
{
    cli_cleanup();
}

TestSuite(acl, .fini = teardown);

/* The documented ACL line: "ACL SETUSER redsem on >PASSWORD ...", split into words. */
static int doc_acl(char *line, size_t cap, const char **argv, int max)
{
    const char *path = getenv("REDSEM_GUARANTEES");
    cr_assert(path != NULL, "REDSEM_GUARANTEES is not set (run the tests with meson test)");
    char *doc = cli_slurp(path);
    cr_assert(doc != NULL, "cannot read %s", path);
    const char *at = strstr(doc, "\nACL SETUSER redsem ");
    cr_assert(at != NULL, "no line 'ACL SETUSER redsem ...' in %s", path);
    at++;
    size_t len = strcspn(at, "\n");
    cr_assert_lt(len, cap);
    memcpy(line, at, len);
    line[len] = '\0';
    free(doc);
    int n = 0;
    for (char *save = NULL, *w = strtok_r(line, " ", &save); w != NULL;
         w = strtok_r(NULL, " ", &save)) {
        cr_assert_lt(n, max);
        argv[n++] = strcmp(w, ">PASSWORD") == 0 ? ">pw" : w;
    }
    return n;
}

static void command_argv(const ts_server *srv, int argc, const char **argv, char *out,
                         size_t outlen)
{
    redisContext *rc = redisConnectUnix(srv->sock);
    cr_assert(rc != NULL && !rc->err);
    redisReply *r = redisCommandArgv(rc, argc, argv, NULL);
    cr_assert(r != NULL);
    cr_assert(r->type != REDIS_REPLY_ERROR, "%s: %s", argv[0], r->str);
    if (out != NULL)
        snprintf(out, outlen, "%s", r->type == REDIS_REPLY_STATUS ? r->str : "");
    freeReplyObject(r);
    redisFree(rc);
}

/* Start a server, make the user "redsem" with the documented ACL plus `extra` (NULL or a
 * NULL-terminated list of rules, e.g. "+select" or "-hset"), and reset the ACL log. */
static void start_with_user(ts_server *srv, const char *const *extra)
{
    cr_assert_eq(ts_server_start(srv, NULL, false), 0, "cannot start redis-server");
    char line[2048];
    const char *argv[128];
    int argc = doc_acl(line, sizeof line, argv, 120);
    for (; extra != NULL && *extra != NULL; extra++)
        argv[argc++] = *extra;
    command_argv(srv, argc, argv, NULL, 0);
    const char *reset[] = {"ACL", "LOG", "RESET"};
    command_argv(srv, 3, reset, NULL, 0);
}

/* The refusals in the server's ACL log: 0 expected. The log's entries in text. */
static size_t acl_log(const ts_server *srv, char *text, size_t cap)
{
    redisContext *rc = redisConnectUnix(srv->sock);
    cr_assert(rc != NULL && !rc->err);
    redisReply *r = redisCommand(rc, "ACL LOG");
    cr_assert(r != NULL && r->type == REDIS_REPLY_ARRAY);
    size_t n = r->elements, used = 0;
    text[0] = '\0';
    for (size_t i = 0; i < n && used + 1 < cap; i++) {
        const redisReply *e = r->element[i];
        for (size_t k = 0; k + 1 < e->elements && used + 1 < cap; k += 2)
            if (e->element[k + 1]->type == REDIS_REPLY_STRING)
                used += (size_t)snprintf(text + used, cap - used, "%s=%s ", e->element[k]->str,
                                         e->element[k + 1]->str);
        if (used + 1 < cap)
            used += (size_t)snprintf(text + used, cap - used, "| ");
    }
    freeReplyObject(r);
    redisFree(rc);
    return n;
}

static redsem_client *client_as(const ts_server *srv, const char *query)
{
    char url[600], err[512] = "";
    snprintf(url, sizeof url, "unix://redsem:pw@%s%s", srv->sock, query ? query : "");
    int rc;
    redsem_client *c = tf_client_try(url, -1, &rc, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "connect as the ACL user: %s: %s", redsem_err_name(rc), err);
    return c;
}

/* A queued acquire in another thread, granted when the main thread releases. */
typedef struct waiter {
    redsem_sem *sem;
    redsem_lock *lock;
    redsem_permit *p;
    int rc;
} waiter;

static void *wait_for_permit(void *arg)
{
    waiter *w = arg;
    w->rc = w->sem != NULL ? redsem_sem_acquire(w->sem, 10000, &w->p)
                           : redsem_lock_acquire(w->lock, 10000, &w->p);
    return NULL;
}

/* A holder p, a waiter queued behind it (on client c2) that is granted at p's release. */
static void queued_grant(redsem_client *c, redsem_permit *p, redsem_client *c2,
                         redsem_sem *s2, redsem_lock *l2)
{
    waiter w = {.sem = s2, .lock = l2};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, wait_for_permit, &w), 0);
    tf_sleep_ms(200); /* queued (or polling) by now; not asserted */
    OK(c, redsem_permit_release(p));
    pthread_join(t, NULL);
    EXPECT(c2, REDSEM_OK, w.rc);
    OK(c2, redsem_permit_refresh(w.p));
    OK(c2, redsem_permit_release(w.p));
    redsem_permit_free(w.p);
}

static void every_strategy(redsem_client *c, redsem_client *c2)
{
    for (int k = REDSEM_STRATEGY_BASIC; k <= REDSEM_STRATEGY_LOCKED; k++) {
        const char *name = tf_name("acl");
        redsem_sem *s = NULL, *s2 = NULL;
        OK(c, redsem_sem_open(c, name, (redsem_strategy)k, 2, 5000, &s));
        OK(c2, redsem_sem_open(c2, name, (redsem_strategy)k, 2, 5000, &s2));
        redsem_permit *p = NULL, *q = NULL, *r = NULL;
        OK(c, redsem_sem_try_acquire(s, &p));
        OK(c, redsem_sem_acquire(s, 1000, &q));
        EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(s, &r));
        OK(c, redsem_permit_refresh(p));
        redsem_status *st = NULL;
        OK(c, redsem_sem_status(s, 10, &st));
        cr_expect_eq(redsem_status_holder_count(st), 2);
        redsem_status_free(st);
        OK(c, redsem_sem_inspect(c, name, 10, &st));
        redsem_status_free(st);
        /* adopt the holder q by its id, and release it through the adopted permit */
        redsem_permit *a = NULL;
        OK(c2, redsem_sem_adopt(s2, redsem_permit_id(q), &a));
        OK(c2, redsem_permit_release(a));
        redsem_permit_free(a);
        redsem_permit_free(q);
        /* a waiter queued behind a full semaphore, granted at a release */
        OK(c, redsem_sem_try_acquire(s, &q));
        queued_grant(c, q, c2, s2, NULL);
        redsem_permit_free(q);
        OK(c, redsem_permit_release(p));
        redsem_permit_free(p);
        /* weighted: both permits at once; set_limit */
        OK(c, redsem_sem_acquire_n(s, 2, 1000, &p));
        cr_expect_eq(redsem_permit_weight(p), 2);
        OK(c, redsem_permit_release(p));
        redsem_permit_free(p);
        OK(c, redsem_sem_set_limit(s, 3));
        OK(c, redsem_sem_set_limit(s, 2));
        redsem_sem_free(s);
        redsem_sem_free(s2);
    }
}

static void the_lock(redsem_client *c, redsem_client *c2)
{
    const char *name = tf_name("acl-lock");
    redsem_lock *l = NULL, *l2 = NULL;
    OK(c, redsem_lock_open(c, name, 5000, &l));
    OK(c2, redsem_lock_open(c2, name, 5000, &l2));
    redsem_permit *p = NULL, *q = NULL;
    OK(c, redsem_lock_try_acquire(l, &p));
    EXPECT(c2, REDSEM_EBUSY, redsem_lock_try_acquire(l2, &q));
    OK(c, redsem_permit_refresh(p));
    redsem_status *st = NULL;
    OK(c, redsem_lock_status(l, 10, &st));
    redsem_status_free(st);
    queued_grant(c, p, c2, NULL, l2);
    redsem_permit_free(p);
    OK(c, redsem_lock_acquire(l, 1000, &p));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_lock_free(l);
    redsem_lock_free(l2);
}

static void a_rate(redsem_client *c)
{
    const char *name = tf_name("acl-rate");
    redsem_rate *r = NULL;
    OK(c, redsem_rate_open(c, name, 2, 300, &r));
    redsem_rate_grant g;
    OK(c, redsem_rate_try_acquire(r, &g));
    OK(c, redsem_rate_try_acquire(r, &g));
    EXPECT(c, REDSEM_EBUSY, redsem_rate_try_acquire(r, &g));
    OK(c, redsem_rate_acquire(r, 5000, &g)); /* waits for the window */
    redsem_rate_info info;
    OK(c, redsem_rate_status(r, &info));
    redsem_rate_free(r);
}

/* The CLI as the ACL user: run, acquire, status; every one exits 0. */
static void the_cli(const char *url)
{
    const char *name = tf_name("acl-cli");
    cli_proc p;
    int code = CLI(&p, NULL, "run", "--url", url, name, "--", "true");
    cr_expect_eq(code, 0, "run exited %d: %s", code, p.err);
    cli_proc_free(&p);
    code = CLI(&p, NULL, "acquire", "--url", url, "--wait", "1s", name);
    cr_expect_eq(code, 0, "acquire exited %d: %s", code, p.err);
    cli_proc_free(&p);
    code = CLI(&p, NULL, "status", "--url", url, name);
    cr_expect_eq(code, 0, "status exited %d: %s", code, p.err);
    cli_proc_free(&p);
    code = CLI(&p, NULL, "lock", "--url", url, name, "--", "true");
    cr_expect_eq(code, 0, "lock exited %d: %s", code, p.err);
    cli_proc_free(&p);
}

Test(acl, documented_acl_runs_everything, TO)
{
    ts_server srv;
    static const char *const extra[] = {"+select", NULL}; /* the /db client below */
    start_with_user(&srv, extra);
    redsem_client *c = client_as(&srv, NULL), *c2 = client_as(&srv, NULL);
    every_strategy(c, c2);
    the_lock(c, c2);
    a_rate(c);
    OK(c, redsem_client_ping(c));
    redsem_client_free(c);
    redsem_client_free(c2);
    /* a database other than 0 (SELECT) */
    c = client_as(&srv, "?db=3");
    c2 = client_as(&srv, "?db=3");
    every_strategy(c, c2);
    redsem_client_free(c);
    redsem_client_free(c2);
    char url[600];
    snprintf(url, sizeof url, "unix://redsem:pw@%s", srv.sock);
    the_cli(url);
    char log[4096];
    size_t n = acl_log(&srv, log, sizeof log);
    cr_expect_eq(n, 0, "%zu refusals in the ACL log: %s", n, log);
    ts_server_stop(&srv);
}

/* The documented line alone, without +select: a /db URL is refused at connect, clearly. */
Test(acl, db_needs_select, TO)
{
    ts_server srv;
    start_with_user(&srv, NULL);
    char url[600], err[512] = "";
    snprintf(url, sizeof url, "unix://redsem:pw@%s?db=3", srv.sock);
    int rc;
    redsem_client *c = tf_client_try(url, -1, &rc, err, sizeof err);
    cr_expect_null(c);
    cr_expect_eq(rc, REDSEM_EPERM, "%s: %s", redsem_err_name(rc), err);
    cr_expect(strstr(err, "NOPERM") != NULL && strstr(err, "select") != NULL, "%s", err);
    ts_server_stop(&srv);
}

/* One command the scripts call taken away: the refusal inside the script is REDSEM_EPERM
 * with Redis' text, and the CLI exits 77. */
Test(acl, refused_inside_a_script_is_eperm, TO)
{
    ts_server srv;
    static const char *const extra[] = {"-zadd", NULL};
    start_with_user(&srv, extra);
    redsem_client *c = client_as(&srv, NULL);
    for (int k = REDSEM_STRATEGY_BASIC; k <= REDSEM_STRATEGY_LOCKED; k++) {
        redsem_sem *s = NULL;
        OK(c, redsem_sem_open(c, tf_name("acl-no"), (redsem_strategy)k, 1, 5000, &s));
        redsem_permit *p = NULL;
        EXPECT(c, REDSEM_EPERM, redsem_sem_try_acquire(s, &p));
        const char *msg = redsem_client_errmsg(c);
        cr_expect(strstr(msg, "script") != NULL && (strstr(msg, "zadd") != NULL ||
                                                    strstr(msg, "can't run") != NULL),
                  "%s: %s", redsem_strategy_name(k), msg);
        redsem_sem_free(s);
    }
    redsem_client_free(c);
    char url[600];
    snprintf(url, sizeof url, "unix://redsem:pw@%s", srv.sock);
    cli_proc p;
    int code = CLI(&p, NULL, "acquire", "--url", url, "--wait", "0", tf_name("acl-no-cli"));
    cr_expect_eq(code, 77, "acquire exited %d: %s", code, p.err);
    cr_expect(strstr(p.err, "script") != NULL, "%s", p.err);
    cli_proc_free(&p);
    char log[4096];
    cr_expect_gt(acl_log(&srv, log, sizeof log), 0, "the refusals are in the ACL log");
    ts_server_stop(&srv);
}
