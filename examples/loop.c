/* loop: a libuv server loop that caps its concurrent calls to an upstream service with a
 * redsem semaphore, through the event-loop API (nothing in it ever blocks the loop).
 *
 *   loop [URL [LIMIT [REQUESTS]]]     (URL default: $REDSEM_URL or redis://127.0.0.1:6379,
 *                                      e.g. unix:///run/redis/redis.sock; LIMIT default 4,
 *                                      REQUESTS default 200)
 *
 * Requests arrive on a timer, a burst every millisecond. Each one acquires a permit of the
 * semaphore "loop-example-<LIMIT>" (at most LIMIT holders across every process that uses it),
 * "calls upstream" (a uv timer of 2-6 ms stands for the call), and releases the permit. At
 * the end it prints how many upstream calls ran at once at most, the grants and the errors.
 * Exit status: 0 when every request was served and never more than LIMIT calls ran at once;
 * 1 when the cap was broken; 2 on errors. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include <redsem/redsem.h>
#include <redsem/adapters/libuv.h>

#define BURST 8            /* requests arriving per millisecond */
#define WAIT_MS 30000      /* how long a request may wait for its permit */
#define LEASE_MS 10000     /* a permit's lease: frees it if this process dies holding it */

/* The server's state: counters only the loop's thread touches (callbacks run there). */
static struct {
    redsem_async *async;
    redsem_sem *upstream;   /* the semaphore that caps the upstream calls */
    int requests, started, finished;
    int in_flight, max_in_flight; /* upstream calls running now, and at most */
    int grants, errors;
    uv_timer_t arrivals;
} app;

/* One request in flight: its permit and the timer that plays the upstream call. */
typedef struct request {
    redsem_permit *permit;
    uv_timer_t upstream_call;
} request;

static void request_closed(uv_handle_t *h) { free(h->data); }

/* A request is over (served or failed); r may be NULL (one that could not start). */
static void finish(request *r)
{
    if (r != NULL)
        uv_close((uv_handle_t *)&r->upstream_call, request_closed);
    if (++app.finished == app.requests)
        uv_stop(uv_default_loop()); /* all served: main() frees redsem outside any callback */
}

static void on_released(redsem_async *a, const redsem_result *res, void *user)
{
    request *r = user;
    (void)a;
    if (res->rc != REDSEM_OK) { /* e.g. REDSEM_ELOST: the lease ended first */
        fprintf(stderr, "loop: release: %s: %s\n", redsem_err_name(res->rc), res->errmsg);
        app.errors++;
    }
    redsem_permit_free(r->permit);
    finish(r);
}

/* The upstream call is over: give the permit back, without blocking the loop. */
static void on_upstream_done(uv_timer_t *t)
{
    request *r = t->data;
    app.in_flight--;
    int rc = redsem_permit_release_async(app.async, r->permit, on_released, r, NULL);
    if (rc != REDSEM_OK) {
        fprintf(stderr, "loop: release not started: %s\n", redsem_err_name(rc));
        app.errors++;
        redsem_permit_free(r->permit); /* its lease frees it on the server */
        finish(r);
    }
}

/* The acquire completed: with a permit, make the upstream call. */
static void on_permit(redsem_async *a, const redsem_result *res, void *user)
{
    request *r = user;
    (void)a;
    if (res->rc != REDSEM_OK) { /* REDSEM_EBUSY: no permit within WAIT_MS; or a fault */
        fprintf(stderr, "loop: acquire: %s: %s\n", redsem_err_name(res->rc), res->errmsg);
        app.errors++;
        finish(r);
        return;
    }
    r->permit = res->permit; /* ours to free */
    app.grants++;
    if (++app.in_flight > app.max_in_flight)
        app.max_in_flight = app.in_flight;
    uv_timer_start(&r->upstream_call, on_upstream_done, 2 + (uint64_t)(rand() % 5), 0);
}

/* A request arrives: ask for a permit; the loop goes on serving others meanwhile. */
static void on_request(void)
{
    request *r = calloc(1, sizeof *r);
    if (r == NULL) {
        app.errors++;
        finish(NULL);
        return;
    }
    uv_timer_init(uv_default_loop(), &r->upstream_call);
    r->upstream_call.data = r;
    int rc = redsem_sem_acquire_async(app.async, app.upstream, 1, WAIT_MS, on_permit, r, NULL);
    if (rc != REDSEM_OK) {
        fprintf(stderr, "loop: acquire not started: %s\n", redsem_err_name(rc));
        app.errors++;
        finish(r);
    }
}

static void on_arrivals(uv_timer_t *t)
{
    for (int i = 0; i < BURST && app.started < app.requests; i++, app.started++)
        on_request();
    if (app.started == app.requests)
        uv_timer_stop(t);
}

static int usage(FILE *out, int status)
{
    fprintf(out, "usage: loop [URL [LIMIT [REQUESTS]]]\n"
                 "Serve REQUESTS simulated requests (default 200) on a libuv loop, each calling\n"
                 "upstream under a redsem semaphore of LIMIT permits (default 4), and check\n"
                 "that at most LIMIT upstream calls ever ran at once.\n"
                 "URL: redis://, rediss://, unix://, redis+sentinel://, redis+cluster://\n"
                 "(default: $REDSEM_URL, else %s).\n"
                 "Exit status: 0 cap held, 1 cap broken, 2 errors.\n",
            REDSEM_DEFAULT_URL);
    return status;
}

static int die(const char *what, redsem_client *c, int rc)
{
    fprintf(stderr, "loop: %s: %s: %s\n", what, redsem_err_name(rc),
            c ? redsem_client_errmsg(c) : "");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
        return usage(stdout, 0);
    const char *url = argc > 1 ? argv[1] : getenv("REDSEM_URL");
    long limit = argc > 2 ? strtol(argv[2], NULL, 10) : 4;
    long requests = argc > 3 ? strtol(argv[3], NULL, 10) : 200;
    if (argc > 4 || limit < 1 || limit > REDSEM_LIMIT_MAX || requests < 1 || requests > 1000000)
        return usage(stderr, 2);
    if (url == NULL || *url == '\0')
        url = REDSEM_DEFAULT_URL;

    /* The client and the semaphore: blocking calls, made before the loop runs. */
    redsem_client *c = NULL;
    int rc = redsem_client_connect(url, &c);
    if (rc != REDSEM_OK)
        return die("connect", c, rc);
    char name[64];
    snprintf(name, sizeof name, "loop-example-%ld", limit);
    rc = redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, (uint32_t)limit, LEASE_MS, &app.upstream);
    if (rc != REDSEM_OK)
        return die("open", c, rc);

    /* The event-loop API on libuv's default loop: two lines. */
    uv_loop_t *loop = uv_default_loop();
    if ((rc = redsem_async_new(c, &app.async)) != REDSEM_OK ||
        (rc = redsem_uv_attach(app.async, loop)) != REDSEM_OK)
        return die("event-loop API", c, rc);

    app.requests = (int)requests;
    uv_timer_init(loop, &app.arrivals);
    uv_timer_start(&app.arrivals, on_arrivals, 0, 1);
    uv_run(loop, UV_RUN_DEFAULT); /* until the last request is finished (uv_stop) */

    /* Shut down: free the async API outside its callbacks, then let the loop close the
     * adapter's handles and ours. */
    redsem_async_free(app.async);
    uv_close((uv_handle_t *)&app.arrivals, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    redsem_sem_free(app.upstream);
    redsem_client_free(c);

    int held = app.max_in_flight <= limit;
    printf("loop: %d requests, limit %ld: at most %d upstream calls at once (%s), "
           "%d grants, %d errors\n",
           app.requests, limit, app.max_in_flight, held ? "cap held" : "CAP BROKEN",
           app.grants, app.errors);
    return !held ? 1 : app.errors ? 2 : 0;
}
