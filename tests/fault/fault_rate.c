/* Scenario 16, a rate limit under faults: 8 clients (4 direct on the unix socket, 4 through
 * the fault proxy on TCP) ask one rate of N = 4 per W = 500 ms without pause, each with a
 * 300 ms command timeout and a 500 ms retry window, while the runner, in two rounds, SIGSTOPs
 * redis-server for 1.5 s, runs DEBUG SLEEP 1, blackholes the proxy for 1.5 s, drops the
 * replies to the proxied clients for 0.5 s and closes their connections for 0.3 s.
 *
 * Checked on the server's clock only: every grant the clients saw (granted_us from the
 * replies; an EUNKNOWN is asked again with the same id until the answer is definite, which
 * returns the grant it may have made) and every grant a monitor saw in the rate's log (ZRANGE
 * of the grants every 20 ms on its own connection, so that a grant whose reply was lost still
 * counts) go into one sweep: no half-open window of W holds more than N. Callers see only
 * the codes redsem_rate_acquire() documents for faults (OK, EBUSY, EUNKNOWN, ECONN,
 * ETIMEDOUT); tokens of distinct grants are distinct; grants resume after every fault. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define N 4
#define W_MS 500
#define CMD_TIMEOUT_MS 300
#define RETRY_MS 500
#define CLIENTS 8
#define MAX_GRANTS 20000

typedef struct grant {
    char id[REDSEM_ID_BUFSIZE];
    int64_t us;
    uint64_t token; /* 0: seen by the monitor only */
    bool monitor;   /* seen by the monitor */
} grant;

typedef struct shared {
    pthread_mutex_t mu;
    grant g[MAX_GRANTS];
    size_t n;
    int64_t last_grant_ns; /* our clock, to see grants resume */
    size_t codes[64];      /* by -rc */
    size_t unresolved;     /* EUNKNOWN still unknown after the retries */
    size_t retried_unknown;
    _Atomic int stop;
} shared;

static void add_grant(shared *sh, const char *id, int64_t us, uint64_t token)
{
    pthread_mutex_lock(&sh->mu);
    size_t i;
    for (i = 0; i < sh->n; i++)
        if (sh->g[i].us == us && strcmp(sh->g[i].id, id) == 0)
            break;
    if (i == sh->n && sh->n < MAX_GRANTS) {
        snprintf(sh->g[i].id, sizeof sh->g[i].id, "%s", id);
        sh->g[i].us = us;
        sh->n++;
    }
    if (i < sh->n && token == 0)
        sh->g[i].monitor = true;
    if (i < sh->n && token != 0) {
        sh->g[i].token = token;
        sh->last_grant_ns = fw_now_ns();
    }
    pthread_mutex_unlock(&sh->mu);
}

static void count_code(shared *sh, int rc)
{
    pthread_mutex_lock(&sh->mu);
    if (-rc >= 0 && -rc < 64)
        sh->codes[-rc]++;
    pthread_mutex_unlock(&sh->mu);
}

typedef struct client_arg {
    shared *sh;
    redsem_client *c;
    redsem_rate *rate;
} client_arg;

static void *client_main(void *arg)
{
    client_arg *a = arg;
    while (!atomic_load(&a->sh->stop)) {
        redsem_rate_grant g;
        int rc = redsem_rate_acquire(a->rate, 1000, &g);
        count_code(a->sh, rc);
        if (rc == REDSEM_EUNKNOWN) {
            /* the same id again: returns the grant if one was made (within W), else decides
             * now; a few tries while the fault lasts */
            char id[REDSEM_ID_BUFSIZE];
            memcpy(id, g.id, sizeof id);
            pthread_mutex_lock(&a->sh->mu);
            a->sh->retried_unknown++;
            pthread_mutex_unlock(&a->sh->mu);
            for (int k = 0; k < 20 && rc != REDSEM_OK && rc != REDSEM_EBUSY; k++) {
                rc = redsem_rate_acquire_as(a->rate, id, 200, &g);
                count_code(a->sh, rc);
                if (rc != REDSEM_OK && rc != REDSEM_EBUSY)
                    fw_sleep_ns(50 * 1000000LL);
            }
            if (rc != REDSEM_OK && rc != REDSEM_EBUSY) {
                pthread_mutex_lock(&a->sh->mu);
                a->sh->unresolved++;
                pthread_mutex_unlock(&a->sh->mu);
            }
        }
        if (rc == REDSEM_OK)
            add_grant(a->sh, g.id, g.granted_us, g.token);
        else if (rc == REDSEM_ECONN || rc == REDSEM_ETIMEDOUT)
            fw_sleep_ns(20 * 1000000LL); /* the fault lasts: do not spin */
    }
    return NULL;
}

typedef struct monitor_arg {
    shared *sh;
    fh_run *r;
    char key[300];
} monitor_arg;

/* The rate's log of grants (zset id -> server us) on its own connection, every 20 ms. */
static void *monitor_main(void *arg)
{
    monitor_arg *m = arg;
    redisContext *rc = NULL;
    while (!atomic_load(&m->sh->stop)) {
        if (rc == NULL)
            rc = fh_redis(m->r);
        redisReply *rep = rc ? redisCommand(rc, "ZRANGE %s 0 -1 WITHSCORES", m->key) : NULL;
        if (rep == NULL) {
            if (rc)
                redisFree(rc);
            rc = NULL;
        } else {
            if (rep->type == REDIS_REPLY_ARRAY)
                for (size_t i = 0; i + 1 < rep->elements; i += 2)
                    add_grant(m->sh, rep->element[i]->str,
                              strtoll(rep->element[i + 1]->str, NULL, 10), 0);
            freeReplyObject(rep);
        }
        fw_sleep_ns(20 * 1000000LL);
    }
    if (rc)
        redisFree(rc);
    return NULL;
}

static void *sleeper(void *arg)
{
    ts_command(arg, NULL, 0, "DEBUG", "SLEEP", "1", NULL);
    return NULL;
}

static int cmp_us(const void *a, const void *b)
{
    int64_t x = ((const grant *)a)->us, y = ((const grant *)b)->us;
    return (x > y) - (x < y);
}

static int cmp_token(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Wait up to ms for a grant seen by a client after t (our clock); the ms it took, or -1. */
static int64_t wait_grant_after(shared *sh, int64_t t, int64_t ms)
{
    while (fw_now_ns() - t < ms * 1000000LL) {
        pthread_mutex_lock(&sh->mu);
        int64_t last = sh->last_grant_ns;
        pthread_mutex_unlock(&sh->mu);
        if (last > t)
            return (last - t) / 1000000;
        fw_sleep_ns(10 * 1000000LL);
    }
    return -1;
}

Test(rate, grants_stay_within_the_rate_through_pauses_and_cuts, .timeout = 120)
{
    fh_run r;
    fh_setup(&r, "rate", FW_FAIR, N, 1000, NULL, true);
    cr_assert_gt(r.srv.port, 0);
    fp_proxy *px = fp_proxy_start(r.srv.port);
    cr_assert_not_null(px);
    char purl[64];
    snprintf(purl, sizeof purl, "redis://127.0.0.1:%d", fp_proxy_port(px));
    shared *sh = calloc(1, sizeof *sh);
    cr_assert_not_null(sh);
    pthread_mutex_init(&sh->mu, NULL);

    client_arg ca[CLIENTS];
    pthread_t th[CLIENTS], mon;
    for (int i = 0; i < CLIENTS; i++) {
        ca[i].sh = sh;
        ca[i].c = fh_client(i % 2 ? purl : r.srv.url, RETRY_MS, CMD_TIMEOUT_MS);
        cr_assert_eq(redsem_rate_open(ca[i].c, r.name, N, W_MS, &ca[i].rate), REDSEM_OK, "%s",
                     redsem_client_errmsg(ca[i].c));
    }
    monitor_arg ma = {.sh = sh, .r = &r};
    snprintf(ma.key, sizeof ma.key, "redsem:{%s}:rate:grants", r.name);
    cr_assert_eq(pthread_create(&mon, NULL, monitor_main, &ma), 0);
    for (int i = 0; i < CLIENTS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, client_main, &ca[i]), 0);

    int64_t worst_resume = 0;
    static const char *const faults[] = {"SIGSTOP 1.5 s", "DEBUG SLEEP 1", "blackhole 1.5 s",
                                         "drop replies 0.5 s", "close 0.3 s"};
    for (int round = 0; round < 2; round++) {
        for (int f = 0; f < 5; f++) {
            fw_sleep_ns(1500 * 1000000LL); /* grants flow */
            fh_fault(&r, faults[f], true);
            pthread_t t;
            switch (f) {
            case 0:
                ts_server_pause(&r.srv, true);
                fw_sleep_ns(1500 * 1000000LL);
                ts_server_pause(&r.srv, false);
                break;
            case 1:
                cr_assert_eq(pthread_create(&t, NULL, sleeper, &r.srv), 0);
                pthread_join(t, NULL);
                break;
            case 2:
                fp_proxy_set_mode(px, FP_BLACKHOLE);
                fw_sleep_ns(1500 * 1000000LL);
                fp_proxy_set_mode(px, FP_PASS);
                break;
            case 3:
                fp_proxy_set_mode(px, FP_DROP_REPLIES);
                fw_sleep_ns(500 * 1000000LL);
                fp_proxy_set_mode(px, FP_PASS);
                break;
            default:
                fp_proxy_set_mode(px, FP_CLOSE);
                fw_sleep_ns(300 * 1000000LL);
                fp_proxy_set_mode(px, FP_PASS);
                break;
            }
            fh_fault(&r, faults[f], false);
            int64_t t_end = fw_now_ns();
            int64_t resume = wait_grant_after(sh, t_end, 5000);
            cr_expect_geq(resume, 0, "round %d: no grant within 5 s after %s", round,
                          faults[f]);
            if (resume > worst_resume)
                worst_resume = resume;
        }
    }
    fw_sleep_ns(1000 * 1000000LL);
    atomic_store(&sh->stop, 1);
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(th[i], NULL);
    pthread_join(mon, NULL);

    /* the sweep over every grant time, server clock */
    qsort(sh->g, sh->n, sizeof sh->g[0], cmp_us);
    size_t count = sh->n, by_clients = 0, by_monitor = 0, most = 0, violations = 0;
    for (size_t i = 0, j = 0; i < count; i++) {
        by_clients += sh->g[i].token != 0;
        by_monitor += sh->g[i].monitor;
        while (sh->g[i].us - sh->g[j].us >= (int64_t)W_MS * 1000)
            j++;
        if (i - j + 1 > most)
            most = i - j + 1;
        if (i >= N && sh->g[i].us - sh->g[i - N].us < (int64_t)W_MS * 1000) {
            if (violations++ < 5)
                fprintf(stderr, "VIOLATION: grants %zu and %zu are %lld us apart\n", i - N, i,
                        (long long)(sh->g[i].us - sh->g[i - N].us));
        }
    }
    uint64_t *tok = calloc(count + 1, sizeof *tok);
    size_t nt = 0, dup_tokens = 0;
    for (size_t i = 0; i < count; i++)
        if (sh->g[i].token != 0)
            tok[nt++] = sh->g[i].token;
    qsort(tok, nt, sizeof *tok, cmp_token);
    for (size_t i = 1; i < nt; i++)
        dup_tokens += tok[i] == tok[i - 1];
    free(tok);

    size_t others = 0;
    char codes[512] = "";
    for (int k = 0; k < 64; k++) {
        if (sh->codes[k] == 0)
            continue;
        int rc = -k;
        size_t len = strlen(codes);
        snprintf(codes + len, sizeof codes - len, " %s %zu", redsem_err_name(rc), sh->codes[k]);
        if (rc != REDSEM_OK && rc != REDSEM_EBUSY && rc != REDSEM_EUNKNOWN &&
            rc != REDSEM_ECONN && rc != REDSEM_ETIMEDOUT)
            others += sh->codes[k];
    }
    fprintf(stderr,
            "SCENARIO 16 rate: %d clients on %d per %d ms, 2 rounds of SIGSTOP, DEBUG SLEEP, "
            "blackhole, dropped replies, closed connections: %zu grants (%zu seen by clients, "
            "%zu by the monitor, %zu by it only), busiest window %zu (bound %d), %zu violations, %zu "
            "duplicate tokens; codes:%s; EUNKNOWN retried %zu, unresolved %zu; grants resumed "
            "at worst %lld ms after a fault ended\n",
            CLIENTS, N, W_MS, count, by_clients, by_monitor, count - by_clients, most, N, violations,
            dup_tokens, codes, sh->retried_unknown, sh->unresolved, (long long)worst_resume);
    cr_expect_lt(count, (size_t)MAX_GRANTS, "the grant log overflowed");
    cr_expect_eq(violations, 0, "%zu windows of %d ms held more than %d grants", violations,
                 W_MS, N);
    cr_expect_leq(most, (size_t)N);
    cr_expect_eq(dup_tokens, 0);
    cr_expect_eq(others, 0, "undocumented codes:%s", codes);
    cr_expect_gt(by_clients, (size_t)(2 * N), "only %zu grants", by_clients);
    cr_expect_gt(by_monitor, by_clients / 2, "the monitor saw %zu of %zu grants", by_monitor,
                 by_clients);

    for (int i = 0; i < CLIENTS; i++) {
        redsem_rate_free(ca[i].rate);
        redsem_client_free(ca[i].c);
    }
    fp_proxy_stop(px);
    free(sh);
    fh_teardown(&r);
}
