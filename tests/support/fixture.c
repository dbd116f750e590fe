/* Criterion fixture: see fixture.h. */
#include "fixture.h"

#include <criterion/hooks.h>
#include <dirent.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static ts_server suite_server;
static int owns_server;

ReportHook(PRE_ALL)(struct criterion_test_set *tests)
{
    (void)tests;
    if (getenv("REDSEM_TEST_SOCK") != NULL)
        return; /* an outer runner gave us a server */
    int rc = ts_server_start(&suite_server, NULL, true);
    if (rc == 77) {
        fprintf(stderr, "SKIP: redis-server is not installed (apt-get install redis-server)\n");
        exit(77);
    }
    if (rc != 0) {
        fprintf(stderr, "cannot start redis-server\n");
        exit(1);
    }
    owns_server = 1;
    setenv("REDSEM_TEST_SOCK", suite_server.sock, 1);
    setenv("REDSEM_TEST_URL", suite_server.url, 1);
    char port[16];
    snprintf(port, sizeof port, "%d", suite_server.port);
    setenv("REDSEM_TEST_PORT", port, 1);
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    (void)stats;
    if (owns_server)
        ts_server_stop(&suite_server);
}

const char *tf_url(void)
{
    const char *u = getenv("REDSEM_TEST_URL");
    cr_assert(u != NULL, "REDSEM_TEST_URL not set");
    return u;
}

const char *tf_sock(void)
{
    return getenv("REDSEM_TEST_SOCK");
}

const ts_server *tf_server(void)
{
    static ts_server view;
    memset(&view, 0, sizeof view);
    snprintf(view.sock, sizeof view.sock, "%s", tf_sock());
    snprintf(view.url, sizeof view.url, "%s", tf_url());
    const char *port = getenv("REDSEM_TEST_PORT");
    view.port = port ? atoi(port) : 0;
    return &view;
}

const char *tf_name(const char *base)
{
    static char buf[8][128];
    static int n;
    char *b = buf[n % 8];
    snprintf(b, sizeof buf[0], "%s-%ld-%d", base, (long)getpid(), n);
    n++;
    return b;
}

redsem_client *tf_client_for(const char *url, int64_t retry_ms, int64_t cmd_timeout_ms)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
    if (retry_ms >= 0)
        cr_assert_eq(redsem_options_set_retry_ms(o, retry_ms), REDSEM_OK);
    if (cmd_timeout_ms > 0)
        cr_assert_eq(redsem_options_set_command_timeout_ms(o, cmd_timeout_ms), REDSEM_OK);
    redsem_client *c = NULL;
    char err[256] = "";
    int rc = redsem_client_new_verbose(o, &c, err, sizeof err);
    redsem_options_free(o);
    cr_assert_eq(rc, REDSEM_OK, "connect %s: %s %s", url, redsem_err_name(rc), err);
    return c;
}

redsem_client *tf_client_try(const char *url, int64_t retry_ms, int *rc_out, char *err,
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

redsem_client *tf_client_retry(int64_t retry_ms)
{
    return tf_client_for(tf_url(), retry_ms, 0);
}

redsem_client *tf_client(void)
{
    return tf_client_retry(-1);
}

int64_t tf_now_ms(void)
{
    return redsem_monotonic_ms();
}

void tf_sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

void tf_expect(redsem_client *c, int got, int want, const char *expr, const char *file, int line)
{
    cr_assert_eq(got, want, "%s:%d: %s returned %s, expected %s (%s)", file, line, expr,
                 redsem_err_name(got), redsem_err_name(want), c ? redsem_client_errmsg(c) : "");
}

size_t tf_waiters(redsem_sem *sem)
{
    redsem_status *st = NULL;
    cr_assert_eq(redsem_sem_status(sem, 0, &st), REDSEM_OK);
    size_t n = redsem_status_waiter_count(st);
    redsem_status_free(st);
    return n;
}

void *tf_restart_later(void *arg)
{
    tf_restarter *r = arg;
    usleep(300000);
    r->rc = ts_server_restart(r->srv);
    atomic_store(&r->restarted, 1);
    while (!atomic_load(&r->done))
        usleep(10000);
    return NULL;
}

int tf_thread_ids(long *ids, int cap)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    for (struct dirent *de; (de = readdir(d)) != NULL && n < cap;)
        if (de->d_name[0] != '.')
            ids[n++] = atol(de->d_name);
    closedir(d);
    return n;
}

redsem_client *tf_sync_client(const char *url, int replicas, int64_t timeout_ms)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK);
    cr_assert_eq(redsem_options_set_sync_replicas(o, replicas, timeout_ms), REDSEM_OK);
    redsem_client *c = NULL;
    char err[512];
    int rc = redsem_client_new_verbose(o, &c, err, sizeof err);
    redsem_options_free(o);
    cr_assert_eq(rc, REDSEM_OK, "%s", err);
    return c;
}

size_t tf_holders(redsem_sem *sem)
{
    redsem_status *st = NULL;
    if (redsem_sem_status(sem, 0, &st) != REDSEM_OK)
        return (size_t)-1;
    size_t n = redsem_status_holder_count(st);
    redsem_status_free(st);
    return n;
}

void tf_poll_turn(redsem_async *a, const int *fd, int64_t *timer_at)
{
    int64_t wait = 5;
    if (*timer_at >= 0 && *timer_at - tf_now_ms() < wait)
        wait = *timer_at - tf_now_ms();
    struct pollfd p = {*fd, POLLIN, 0};
    int n = poll(&p, *fd >= 0 ? 1 : 0, wait > 0 ? (int)wait : 0);
    if (n > 0 && (p.revents & POLLIN))
        (void)redsem_async_action(a, *fd, REDSEM_WATCH_IN);
    if (*timer_at >= 0 && tf_now_ms() >= *timer_at) {
        *timer_at = -1;
        (void)redsem_async_action(a, -1, 0);
    }
}

void tf_slow_loading_server(ts_server *srv)
{
    /* appendfsync always: every write is in the AOF before its reply. Under everysec Redis
     * may put off the AOF write (up to 2 s, while a background fsync runs) and still reply,
     * so the SIGKILL right after a grant could lose it: test_faults' refresh got
     * REDSEM_ELOST in 2 of 40 runs with both cores busy */
    const char *args[] = {"--appendonly", "yes", "--appendfsync", "always",
                          "--key-load-delay", "300",
                          "--loading-process-events-interval-bytes", "1024", NULL};
    cr_assert_eq(ts_server_start(srv, args, false), 0);
    char out[64];
    cr_assert_eq(ts_command(srv, out, sizeof out, "EVAL",
                            "for i=1,5000 do redis.call('SET','k'..i,'v') end return 1", "0",
                            NULL),
                 0, "%s", out);
}
