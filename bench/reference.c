/* redsem-bench - the book's semaphores, as references to measure redsem's fair and locked by.
 *
 * Redis in Action's fair semaphore (6.3.2-6.3.3) and its lock-guarded variant (6.3.4), the
 * algorithm as published: a ticket counter, an owner set (identifier -> ticket) and a timeout
 * set (identifier -> the client's clock at acquire); every acquire removes the expired
 * timeouts (ZREMRANGEBYSCORE), rebuilds the owner set as its intersection with the timeout
 * set (ZINTERSTORE, WEIGHTS 1 0), draws a ticket (INCR), joins both sets, and is granted iff
 * its ZRANK in the owner set is below the limit, else it leaves both. The book sends these
 * commands in two pipelines; here each step is one script (the .lua files of
 * bench/reference/, embedded at build time), atomic as redsem's are, on a raw hiredis
 * connection. The locked variant takes the guard `lock:<sem>` first (SET NX PX; retried
 * every 1 ms for up to 10 ms, the book's acquire_timeout=.01), does the fair acquire, then
 * releases the guard (compare-and-delete).
 *
 * The book's acquire never waits: it returns at once. A "blocking" acquire here polls: it
 * tries again 1 ms after each refusal (the book's lock loop sleeps 1 ms between tries), with
 * a fresh identifier and so a fresh ticket each time, as a caller of the book's function
 * would. These are NOT strategies of the library; they exist to be measured beside it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "bench.h"
#include "lua_scripts.h" /* generated from bench/reference/ by tools/embed-lua.c */

#define GUARD_TRY_MS 10      /* the book's acquire_timeout=.01 around its lock */
#define GUARD_LEASE "10000"  /* acquire_lock_with_timeout()'s lock_timeout=10 (s), in ms */
#define POLL_NS 1000000LL    /* 1 ms between two attempts of a polling acquire */

struct bench_ref {
    redisContext *c;
    int kind; /* BENCH_BOOK_FAIR or BENCH_BOOK_LOCKED */
    bool floor;
    char floor_sha[41];
    char key[4][640]; /* timeout set, owner set, counter, guard */
    char id[REDSEM_ID_BUFSIZE];       /* the identifier of the permit held or being tried */
    char guard_id[REDSEM_ID_BUFSIZE]; /* the guard's identifier (another uuid in the book) */
    char limit[24], timeout[32];
    uint64_t requests;
};

const char *bench_ref_sha(int script)
{
    switch (script) {
    case BENCH_REF_ACQUIRE:
        return redsem__script_defs[REDSEM__SCRIPT_BOOK_FAIR_ACQUIRE].sha;
    case BENCH_REF_RELEASE:
        return redsem__script_defs[REDSEM__SCRIPT_BOOK_FAIR_RELEASE].sha;
    default:
        return redsem__script_defs[REDSEM__SCRIPT_BOOK_GUARD_RELEASE].sha;
    }
}

static const redsem__script_def *script_def(int script)
{
    return &redsem__script_defs[script == BENCH_REF_ACQUIRE   ? REDSEM__SCRIPT_BOOK_FAIR_ACQUIRE
                                : script == BENCH_REF_RELEASE ? REDSEM__SCRIPT_BOOK_FAIR_RELEASE
                                                              : REDSEM__SCRIPT_BOOK_GUARD_RELEASE];
}

/* SCRIPT LOAD every reference script (and "return 1" for a floor) on c. */
static void load_scripts(redisContext *c, char floor_sha[41])
{
    for (int s = 0; s < 3; s++) {
        const redsem__script_def *d = script_def(s);
        redisReply *r = redisCommand(c, "SCRIPT LOAD %b", d->text, d->len);
        if (r == NULL || r->type != REDIS_REPLY_STRING || strcmp(r->str, d->sha) != 0)
            bench_die("reference: SCRIPT LOAD %s failed: %s", d->name,
                      r && r->str ? r->str : c->errstr);
        freeReplyObject(r);
    }
    if (floor_sha != NULL) {
        redisReply *r = redisCommand(c, "SCRIPT LOAD %s", "return 1");
        if (r == NULL || r->type != REDIS_REPLY_STRING || r->len != 40)
            bench_die("reference: SCRIPT LOAD failed: %s", r && r->str ? r->str : c->errstr);
        memcpy(floor_sha, r->str, 41);
        freeReplyObject(r);
    }
}

void bench_ref_keys(const bench_ctx *ctx, const char *name, char key[4][640])
{
    /* the book's semname, semname:owner, semname:counter and lock:semname, under the run's
     * prefix and the semaphore's hash tag (bench_cleanup removes them by that prefix) */
    static const char *const suffix[4] = {":book", ":book:owner", ":book:counter", ":book:lock"};
    for (int i = 0; i < 4; i++)
        snprintf(key[i], 640, "%s{%s}%s", ctx->prefix, name, suffix[i]);
}

bench_ref *bench_ref_new(const bench_ctx *ctx, int kind, const char *name, uint32_t limit,
                         double timeout_s, bool floor)
{
    bench_ref *r = calloc(1, sizeof *r);
    if (r == NULL)
        bench_die("out of memory");
    r->c = bench_raw_connect(ctx);
    r->kind = kind;
    r->floor = floor;
    load_scripts(r->c, r->floor_sha);
    bench_ref_keys(ctx, name, r->key);
    snprintf(r->limit, sizeof r->limit, "%u", limit);
    snprintf(r->timeout, sizeof r->timeout, "%.3f", timeout_s);
    return r;
}

void bench_ref_free(bench_ref *r)
{
    if (r == NULL)
        return;
    redisFree(r->c);
    free(r);
}

uint64_t bench_ref_requests(const bench_ref *r)
{
    return r->requests;
}

/* The book's time.time(). */
static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One EVALSHA (the floor's "return 1" in floor mode) of script s with n KEYS then ARGV. */
static redisReply *evalsha(bench_ref *r, int s, int nkeys, const char *const *keys, int nargs,
                           const char *const *args)
{
    const char *argv[16];
    size_t len[16];
    char nk[8];
    snprintf(nk, sizeof nk, "%d", nkeys);
    int argc = 0;
    argv[argc++] = "EVALSHA";
    argv[argc++] = r->floor ? r->floor_sha : bench_ref_sha(s);
    argv[argc++] = nk;
    for (int i = 0; i < nkeys; i++)
        argv[argc++] = keys[i];
    for (int i = 0; i < nargs; i++)
        argv[argc++] = args[i];
    for (int i = 0; i < argc; i++)
        len[i] = strlen(argv[i]);
    r->requests++;
    redisReply *rep = redisCommandArgv(r->c, argc, argv, len);
    if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "redsem-bench: reference: %s\n",
                rep ? rep->str : r->c->errstr[0] ? r->c->errstr : "no reply");
        if (rep)
            freeReplyObject(rep);
        return NULL;
    }
    return rep;
}

/* The guard: SET lock:<sem> id NX PX 10000 (the floor: EVALSHA of "return 1" with 1 key and
 * the same 4 arguments). 1 taken, 0 busy, -1 error. */
static int guard_try(bench_ref *r)
{
    const char *argv[8];
    int argc = 0;
    if (r->floor) {
        argv[argc++] = "EVALSHA";
        argv[argc++] = r->floor_sha;
        argv[argc++] = "1";
    } else {
        argv[argc++] = "SET";
    }
    argv[argc++] = r->key[3];
    argv[argc++] = r->guard_id;
    argv[argc++] = "NX";
    argv[argc++] = "PX";
    argv[argc++] = GUARD_LEASE;
    size_t len[8];
    for (int i = 0; i < argc; i++)
        len[i] = strlen(argv[i]);
    r->requests++;
    redisReply *rep = redisCommandArgv(r->c, argc, argv, len);
    if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "redsem-bench: reference guard: %s\n",
                rep ? rep->str : r->c->errstr[0] ? r->c->errstr : "no reply");
        if (rep)
            freeReplyObject(rep);
        return -1;
    }
    int taken = r->floor || rep->type == REDIS_REPLY_STATUS;
    freeReplyObject(rep);
    return taken;
}

static long long fair_try(bench_ref *r)
{
    if (redsem_id_generate(r->id) != REDSEM_OK)
        bench_die("redsem_id_generate failed");
    char now[32];
    snprintf(now, sizeof now, "%.6f", wall_s());
    const char *keys[3] = {r->key[0], r->key[1], r->key[2]};
    const char *args[4] = {r->id, r->limit, now, r->timeout};
    redisReply *rep = evalsha(r, BENCH_REF_ACQUIRE, 3, keys, 4, args);
    if (rep == NULL)
        return -1;
    long long t = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    freeReplyObject(rep);
    if (r->floor)
        return 1;
    return t;
}

long long bench_ref_try(bench_ref *r)
{
    if (r->kind == BENCH_BOOK_FAIR)
        return fair_try(r);
    if (redsem_id_generate(r->guard_id) != REDSEM_OK)
        bench_die("redsem_id_generate failed");
    /* acquire_lock(conn, semname, acquire_timeout=.01): SETNX, sleep 1 ms, for 10 ms */
    int64_t end = bench_now_ns() + GUARD_TRY_MS * 1000000LL;
    int g;
    while ((g = guard_try(r)) == 0 && bench_now_ns() < end)
        bench_sleep_ns(POLL_NS);
    if (g <= 0)
        return g;
    long long t = fair_try(r);
    /* finally: release_lock(conn, semname, identifier) */
    const char *keys[1] = {r->key[3]};
    const char *args[1] = {r->guard_id};
    redisReply *rep = evalsha(r, BENCH_REF_GUARD_RELEASE, 1, keys, 1, args);
    if (rep == NULL)
        return -1;
    freeReplyObject(rep);
    return t;
}

long long bench_ref_acquire(bench_ref *r, int64_t timeout_ms)
{
    int64_t end = bench_now_ns() + timeout_ms * 1000000LL;
    for (;;) {
        long long t = bench_ref_try(r);
        if (t != 0 || bench_now_ns() >= end)
            return t;
        bench_sleep_ns(POLL_NS);
    }
}

int bench_ref_release(bench_ref *r)
{
    const char *keys[2] = {r->key[0], r->key[1]};
    const char *args[1] = {r->id};
    redisReply *rep = evalsha(r, BENCH_REF_RELEASE, 2, keys, 1, args);
    if (rep == NULL)
        return -1;
    freeReplyObject(rep);
    return 0;
}

void bench_ref_fill(const bench_ctx *ctx, const char *name, long from, long to)
{
    /* The state that to - from more granted acquires of the book leave behind, written
     * directly (ZADD in pipelined batches): filling 100,000 holders through the book's acquire
     * would cost O(H^2) (each acquire intersects the whole owner set), hours on this machine.
     * Ticket i for the i-th holder, the counter at the last ticket, every timeout "now"
     * (the measurement passes a timeout longer than the run, so none expires). */
    redisContext *c = bench_raw_connect(ctx);
    char key[4][640];
    bench_ref_keys(ctx, name, key);
    enum { BATCH = 1000 };
    const char **argv = malloc((2 + 2 * BATCH) * sizeof *argv);
    size_t *len = malloc((2 + 2 * BATCH) * sizeof *len);
    char(*ids)[REDSEM_ID_BUFSIZE] = malloc(BATCH * sizeof *ids);
    char(*score)[32] = malloc(BATCH * sizeof *score);
    if (argv == NULL || len == NULL || ids == NULL || score == NULL)
        bench_die("out of memory");
    char now[32];
    snprintf(now, sizeof now, "%.6f", wall_s());
    for (long i = from; i < to; i += BATCH) {
        int n = (int)(to - i < BATCH ? to - i : BATCH);
        for (int set = 0; set < 2; set++) {
            argv[0] = "ZADD";
            argv[1] = key[set];
            for (int k = 0; k < n; k++) {
                if (set == 0 && redsem_id_generate(ids[k]) != REDSEM_OK)
                    bench_die("redsem_id_generate failed");
                snprintf(score[k], sizeof score[k], "%ld", i + k + 1);
                argv[2 + 2 * k] = set == 0 ? now : score[k];
                argv[3 + 2 * k] = ids[k];
            }
            for (int k = 0; k < 2 + 2 * n; k++)
                len[k] = strlen(argv[k]);
            redisAppendCommandArgv(c, 2 + 2 * n, argv, len);
        }
    }
    for (long i = from; i < to; i += BATCH)
        for (int set = 0; set < 2; set++) {
            redisReply *rep = NULL;
            if (redisGetReply(c, (void **)&rep) != REDIS_OK || rep == NULL ||
                rep->type == REDIS_REPLY_ERROR)
                bench_die("reference fill: %s", rep ? rep->str : c->errstr);
            freeReplyObject(rep);
        }
    redisReply *rep = redisCommand(c, "SET %s %ld", key[2], to);
    if (rep == NULL || rep->type == REDIS_REPLY_ERROR)
        bench_die("reference fill: SET counter failed");
    freeReplyObject(rep);
    free(argv);
    free(len);
    free(ids);
    free(score);
    redisFree(c);
}

/* ================================================================ SLOWLOG */

struct bench_slowlog {
    redisContext *c;
    char old_slower[32], old_len[32];
    bool on;
};

static bool config_get(redisContext *c, const char *name, char *out, size_t len)
{
    redisReply *r = redisCommand(c, "CONFIG GET %s", name);
    bool ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
              r->element[1]->type == REDIS_REPLY_STRING;
    if (ok)
        snprintf(out, len, "%s", r->element[1]->str);
    if (r)
        freeReplyObject(r);
    return ok;
}

static bool config_set(redisContext *c, const char *name, const char *value)
{
    redisReply *r = redisCommand(c, "CONFIG SET %s %s", name, value);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    return ok;
}

bench_slowlog *bench_slowlog_start(const bench_ctx *ctx, long slower_than_us, long max_len)
{
    bench_slowlog *s = calloc(1, sizeof *s);
    if (s == NULL)
        bench_die("out of memory");
    s->c = bench_raw_connect(ctx);
    char v[32], l[32];
    snprintf(v, sizeof v, "%ld", slower_than_us);
    snprintf(l, sizeof l, "%ld", max_len);
    if (!config_get(s->c, "slowlog-log-slower-than", s->old_slower, sizeof s->old_slower) ||
        !config_get(s->c, "slowlog-max-len", s->old_len, sizeof s->old_len) ||
        !config_set(s->c, "slowlog-max-len", l) ||
        !config_set(s->c, "slowlog-log-slower-than", v)) {
        /* CONFIG refused (a managed server, a cluster URL without access): no figures */
        redisFree(s->c);
        free(s);
        return NULL;
    }
    s->on = true;
    redisReply *r = redisCommand(s->c, "SLOWLOG RESET");
    if (r)
        freeReplyObject(r);
    return s;
}

/* lower-case compare of a reply string with a command name */
static bool is_cmd(const redisReply *a, const char *name)
{
    return a->type == REDIS_REPLY_STRING && strcasecmp(a->str, name) == 0;
}

static bool ends_with(const redisReply *a, const char *suffix)
{
    size_t n = strlen(suffix);
    return a->type == REDIS_REPLY_STRING && a->len >= n &&
           memcmp(a->str + a->len - n, suffix, n) == 0;
}

/* The class of one logged command for the kind measured: 1 a part of an acquire, 2 a part of a
 * release, 0 anything else (BLPOP, wake_drain.lua, the floor, INFO, ...). */
static int classify(int kind, const redisReply *args)
{
    if (args->type != REDIS_REPLY_ARRAY || args->elements < 1)
        return 0;
    redisReply *const *a = args->element;
    size_t n = args->elements;
    if (kind == BENCH_BOOK_FAIR || kind == BENCH_BOOK_LOCKED) {
        if (kind == BENCH_BOOK_LOCKED && is_cmd(a[0], "set") && n >= 2 &&
            ends_with(a[1], ":book:lock"))
            return 1;
        if (!is_cmd(a[0], "evalsha") || n < 2 || a[1]->type != REDIS_REPLY_STRING)
            return 0;
        if (strcmp(a[1]->str, bench_ref_sha(BENCH_REF_ACQUIRE)) == 0 ||
            strcmp(a[1]->str, bench_ref_sha(BENCH_REF_GUARD_RELEASE)) == 0)
            return 1;
        if (strcmp(a[1]->str, bench_ref_sha(BENCH_REF_RELEASE)) == 0)
            return 2;
        return 0;
    }
    /* the library's scripts (the shapes of src/sem.c and src/lock.c, as bench/floor.c has
     * them): every release has 4 keys and 2 arguments; fair_acquire.lua has 5 keys, the
     * locked strategy's guard_acquire.lua 1 (the guard, "}:lock"; wake_drain.lua's 1 key is
     * an id list), basic_acquire.lua and lock_acquire.lua 4 keys and more arguments */
    if ((!is_cmd(a[0], "evalsha") && !is_cmd(a[0], "eval")) || n < 4 ||
        a[2]->type != REDIS_REPLY_STRING)
        return 0;
    const char *nk = a[2]->str;
    if (strcmp(nk, "4") == 0)
        return n == 3 + 4 + 2 ? 2 : 1;
    if (strcmp(nk, "5") == 0 || (strcmp(nk, "1") == 0 && ends_with(a[3], "}:lock")))
        return 1;
    return 0;
}

int bench_slowlog_collect(bench_slowlog *s, int kind, bench_busy *b)
{
    if (s == NULL)
        return -1;
    /* GET and RESET in one transaction: nothing logged between them is lost */
    redisAppendCommand(s->c, "MULTI");
    redisAppendCommand(s->c, "SLOWLOG GET -1");
    redisAppendCommand(s->c, "SLOWLOG RESET");
    redisAppendCommand(s->c, "EXEC");
    redisReply *r[4] = {0};
    int rc = 0;
    for (int i = 0; i < 4; i++)
        if (redisGetReply(s->c, (void **)&r[i]) != REDIS_OK)
            rc = -1;
    redisReply *log = rc == 0 && r[3] && r[3]->type == REDIS_REPLY_ARRAY && r[3]->elements == 2
                          ? r[3]->element[0]
                          : NULL;
    if (log == NULL || log->type != REDIS_REPLY_ARRAY)
        rc = -1;
    for (size_t i = 0; rc == 0 && i < log->elements; i++) {
        redisReply *e = log->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 4 ||
            e->element[2]->type != REDIS_REPLY_INTEGER)
            continue;
        int cls = classify(kind, e->element[3]);
        long long us = e->element[2]->integer;
        if (cls == 1) {
            if (b->acq.v == NULL)
                samples_init(&b->acq);
            samples_add(&b->acq, us * 1000);
            b->acquire_cmds++;
            b->acquire_us += (double)us;
            if (us > b->acquire_max_us)
                b->acquire_max_us = us;
        } else if (cls == 2) {
            b->release_cmds++;
            b->release_us += (double)us;
        }
        b->all_cmds++;
        if (us > b->any_max_us)
            b->any_max_us = us;
    }
    for (int i = 0; i < 4; i++)
        if (r[i])
            freeReplyObject(r[i]);
    return rc;
}

void bench_slowlog_stop(bench_slowlog *s)
{
    if (s == NULL)
        return;
    config_set(s->c, "slowlog-log-slower-than", s->old_slower);
    config_set(s->c, "slowlog-max-len", s->old_len);
    redisReply *r = redisCommand(s->c, "SLOWLOG RESET");
    if (r)
        freeReplyObject(r);
    redisFree(s->c);
    free(s);
}

void bench_busy_free(bench_busy *b)
{
    samples_free(&b->acq);
}

json_t *bench_busy_json(bench_busy *b, uint64_t acquires)
{
    if (b == NULL || !b->valid)
        return json_null();
    json_t *j = json_object();
    if (b->threshold_us > 0) {
        /* only the slow commands were logged: no sums, no percentiles */
        json_object_set_new(j, "slowlog_threshold_us", json_integer(b->threshold_us));
        json_object_set_new(j, "slow_acquire_commands", json_integer((json_int_t)b->acquire_cmds));
        json_object_set_new(j, "max_acquire_command_us", json_integer(b->acquire_max_us));
        json_object_set_new(j, "max_command_us", json_integer(b->any_max_us));
        return j;
    }
    json_object_set_new(j, "acquires", json_integer((json_int_t)acquires));
    json_object_set_new(j, "acquire_commands", json_integer((json_int_t)b->acquire_cmds));
    json_object_set_new(j, "server_us_per_acquire",
                        json_real(acquires ? b->acquire_us / (double)acquires : 0));
    json_object_set_new(j, "max_acquire_command_us", json_integer(b->acquire_max_us));
    bench_pct p = bench_percentiles(b->acq.v, b->acq.n);
    json_object_set_new(j, "acquire_command_p50_us", json_real(p.p50));
    json_object_set_new(j, "acquire_command_p99_us", json_real(p.p99));
    json_object_set_new(j, "release_commands", json_integer((json_int_t)b->release_cmds));
    json_object_set_new(j, "server_us_per_release",
                        json_real(b->release_cmds ? b->release_us / (double)b->release_cmds : 0));
    return j;
}
