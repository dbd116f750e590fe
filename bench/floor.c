/* redsem-bench - the floor: the library's round trips with a trivial script.
 *
 * For each kind the floor sends, per acquire+release pair, exactly the requests the library
 * sends when the acquire is granted at once, each with the same number of KEYS and ARGV and
 * key names and values of the same length, but EVALSHA runs "return 1" instead of the real
 * script:
 *
 *   basic   acquire EVALSHA 4 keys 7 args            release EVALSHA 4 keys 2 args
 *   fair    acquire EVALSHA 5 keys 9 args            release EVALSHA 4 keys 2 args
 *   locked  acquire EVALSHA 1 key 2 args (guard),    release EVALSHA 4 keys 2 args
 *                   EVALSHA 5 keys 9 args (it also deletes the guard)
 *   lock    acquire EVALSHA 4 keys 6 args            release EVALSHA 4 keys 2 args
 *
 * (the shapes of src/sem.c and src/lock.c at the time of writing). Whatever the library adds
 * on top of the floor is then its own cost: the work of the real scripts on the server and
 * the library's client-side work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "bench.h"

#define MAX_ARGV 20
#define MAX_CMDS 4

typedef struct floor_cmd {
    int argc;
    const char *argv[MAX_ARGV];
    size_t len[MAX_ARGV];
} floor_cmd;

struct bench_floor {
    redisContext *c;
    char sha[41];
    char id[REDSEM_ID_BUFSIZE];
    char keys[8][640];
    floor_cmd acq[MAX_CMDS];
    int nacq;
    floor_cmd rel;
};

static void add(floor_cmd *cmd, const char *s)
{
    cmd->argv[cmd->argc] = s;
    cmd->len[cmd->argc] = strlen(s);
    cmd->argc++;
}

static void evalsha(bench_floor *f, floor_cmd *cmd, const char *nkeys)
{
    cmd->argc = 0;
    add(cmd, "EVALSHA");
    add(cmd, f->sha);
    add(cmd, nkeys);
}

bench_floor *bench_floor_new(const bench_ctx *ctx, int kind, const char *name)
{
    bench_floor *f = calloc(1, sizeof *f);
    if (f == NULL)
        bench_die("out of memory");
    f->c = bench_raw_connect(ctx);
    redisReply *r = redisCommand(f->c, "SCRIPT LOAD %s", "return 1");
    if (r == NULL || r->type != REDIS_REPLY_STRING || r->len != 40)
        bench_die("floor: SCRIPT LOAD failed: %s", r && r->str ? r->str : f->c->errstr);
    memcpy(f->sha, r->str, 40);
    freeReplyObject(r);
    if (redsem_id_generate(f->id) != REDSEM_OK)
        bench_die("redsem_id_generate failed");

    static const char *const sem_suffix[2][5] = {
        {":meta", ":holders", ":waiters", ":signal", ":lock"},
        {":meta", ":owners", ":timeouts", ":signal:", ":lock"},
    };
    static const char *const lock_suffix[4] = {":mutex", ":mutex:meta", ":mutex:waiters",
                                               ":mutex:signal"};
    /* Keys of the same length as the library's but of another name, so that the floor's
     * guard never blocks the library's (floor and library run side by side). */
    char fname[REDSEM_NAME_MAX + 1];
    bench_floor_name(name, fname, sizeof fname);
    for (int i = 0; i < 5; i++) {
        const char *suf = kind == BENCH_LOCK ? (i < 4 ? lock_suffix[i] : ":x")
                                             : sem_suffix[kind == BENCH_BASIC ? 0 : 1][i];
        snprintf(f->keys[i], sizeof f->keys[i], "%s{%s}%s", ctx->prefix, fname, suf);
    }
    static const char *const lease = "10000", *const limit = "4", *const mode = "1",
                             *const wait_lease = "3000";
    /* the not-after time: server microseconds, 16 digits */
    static const char *const not_after = "1800000000000000";
    floor_cmd *a = &f->acq[0];
    switch (kind) {
    case BENCH_BASIC:
    case BENCH_LOCK:
        evalsha(f, a, "4");
        for (int i = 0; i < 4; i++)
            add(a, f->keys[i]);
        add(a, f->id);
        if (kind == BENCH_BASIC) {
            add(a, limit);
            add(a, lease);
            add(a, mode);
            add(a, wait_lease);
        } else {
            add(a, lease);
            add(a, mode);
            add(a, wait_lease);
            add(a, "0");
        }
        add(a, not_after);
        if (kind == BENCH_BASIC)
            add(a, "1"); /* permits wanted */
        f->nacq = 1;
        break;
    case BENCH_FAIR:
    case BENCH_LOCKED:
        if (kind == BENCH_LOCKED) {
            /* the guard: guard_acquire.lua (SET NX PX inside a script) */
            evalsha(f, a, "1");
            add(a, f->keys[4]);
            add(a, f->id);
            add(a, "1000");
            a++;
        }
        evalsha(f, a, "5");
        for (int i = 0; i < 5; i++)
            add(a, f->keys[i]);
        add(a, f->id);
        add(a, limit);
        add(a, lease);
        add(a, mode);
        add(a, wait_lease);
        add(a, kind == BENCH_LOCKED ? "locked" : "fair");
        add(a, f->id);
        add(a, not_after);
        add(a, "1"); /* permits wanted */
        f->nacq = kind == BENCH_LOCKED ? 2 : 1;
        break;
    default:
        bench_die("floor: unknown kind %d", kind);
    }
    evalsha(f, &f->rel, "4");
    for (int i = 0; i < 4; i++)
        add(&f->rel, f->keys[i]);
    add(&f->rel, f->id);
    add(&f->rel, kind == BENCH_LOCK ? "0" : "1"); /* lock: reentrant flag; sems: weight */
    return f;
}

void bench_floor_free(bench_floor *f)
{
    if (f == NULL)
        return;
    redisFree(f->c);
    free(f);
}

static int send(bench_floor *f, floor_cmd *cmd)
{
    redisReply *r = redisCommandArgv(f->c, cmd->argc, cmd->argv, cmd->len);
    if (r == NULL) {
        fprintf(stderr, "redsem-bench: floor: %s\n", f->c->errstr);
        return -1;
    }
    int rc = r->type == REDIS_REPLY_ERROR ? -1 : 0;
    if (rc != 0)
        fprintf(stderr, "redsem-bench: floor: %s\n", r->str);
    freeReplyObject(r);
    return rc;
}

int bench_floor_acquire(bench_floor *f)
{
    for (int i = 0; i < f->nacq; i++)
        if (send(f, &f->acq[i]) != 0)
            return -1;
    return 0;
}

int bench_floor_release(bench_floor *f)
{
    return send(f, &f->rel);
}
