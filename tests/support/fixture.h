/* Criterion fixture: one private redis-server per test binary, started before all tests by
 * the runner (criterion forks each test from it) and stopped after. Tests get its URL from
 * tf_url() and use unique names from tf_name(), so parallel tests never share keys. */
#ifndef REDSEM_TEST_FIXTURE_H
#define REDSEM_TEST_FIXTURE_H

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/wait.h>

#include <hiredis/hiredis.h>

#include <redsem/redsem.h>

#include "server.h"

const char *tf_url(void);   /* unix:// URL of the suite's server */
const char *tf_sock(void);  /* its socket path */
/* A unique semaphore/lock name for this test process: "<base>-<pid>-<n>". */
const char *tf_name(const char *base);
/* A client connected to the suite's server, with the given retry window (ms, -1 default). */
/* a client of any server; retry_ms < 0 and cmd_timeout_ms <= 0 keep the defaults */
redsem_client *tf_client_for(const char *url, int64_t retry_ms, int64_t cmd_timeout_ms);
redsem_client *tf_client_retry(int64_t retry_ms);
/* A client of url with a 1 s connect timeout (retry_ms < 0: the default window), without
 * asserting success: the status in *rc_out, the reason in err; NULL on failure. */
redsem_client *tf_client_try(const char *url, int64_t retry_ms, int *rc_out, char *err,
                             size_t errlen);
redsem_client *tf_client(void);
/* The suite's server as a ts_server (for ts_command). */
const ts_server *tf_server(void);
int64_t tf_now_ms(void);
/* Waiters of sem on the server now (redsem_sem_status()). */
size_t tf_waiters(redsem_sem *sem);
void tf_sleep_ms(int64_t ms);

/* A server restarted from another thread: tf_restart_later(r) (a pthread start routine)
 * restarts r->srv after 300 ms (rc: ts_server_restart's), sets restarted, then stays alive
 * until done is set (the server dies with the thread that started it). */
typedef struct tf_restarter {
    ts_server *srv;
    atomic_int done;
    atomic_int restarted;
    int rc;
} tf_restarter;
void *tf_restart_later(void *arg);

/* Start srv: a server of its own with an AOF of 5,000 keys loaded slowly after a restart
 * (key-load-delay: the load lasts about 1.5 s, answering LOADING meanwhile). */
void tf_slow_loading_server(ts_server *srv);
/* The ids of this process's threads (/proc/self/task), at most cap; how many. */
int tf_thread_ids(long *ids, int cap);
/* A client of url that waits for `replicas` replicas (sync_replicas, timeout_ms). */
redsem_client *tf_sync_client(const char *url, int replicas, int64_t timeout_ms);
/* Holders of sem on the server now; (size_t)-1 if its status cannot be read. */
size_t tf_holders(redsem_sem *sem);
/* One turn of a poll() loop of a test's own on a redsem_async's one descriptor (*fd, -1:
 * none) and its timer (*timer_at, tf_now_ms()'s clock, -1: none): waits at most 5 ms (or
 * until the timer), then reports what is due to a. */
void tf_poll_turn(redsem_async *a, const int *fd, int64_t *timer_at);

/* Assert that expr returned want; on failure print the name and the client's message. */
void tf_expect(redsem_client *c, int got, int want, const char *expr, const char *file,
               int line);
#define EXPECT(c, want, expr) tf_expect((c), (expr), (want), #expr, __FILE__, __LINE__)
#define OK(c, expr) EXPECT(c, REDSEM_OK, expr)

/* One test per strategy: STRATEGY_TEST(suite, name) { ... uses `strategy` ... } */
#define STRATEGY_TEST(suite, name, ...)                                                        \
    static void suite##_##name##_body(redsem_strategy strategy);                              \
    Test(suite, name##_basic, __VA_ARGS__) { suite##_##name##_body(REDSEM_STRATEGY_BASIC); }  \
    Test(suite, name##_fair, __VA_ARGS__) { suite##_##name##_body(REDSEM_STRATEGY_FAIR); }    \
    Test(suite, name##_locked, __VA_ARGS__) { suite##_##name##_body(REDSEM_STRATEGY_LOCKED); } \
    static void suite##_##name##_body(redsem_strategy strategy)

#endif
