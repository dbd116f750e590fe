/* Test support: a Sentinel-managed primary on loopback. See sentinel.h. */
#include "sentinel.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Both replicas connected and past the initial sync (state=online: they acknowledge). */
static bool replicas_online(const ts_server *primary)
{
    char out[4096] = "";
    if (ts_command(primary, out, sizeof out, "INFO", "replication", NULL) != 0)
        return false;
    int online = 0;
    for (const char *p = out; (p = strstr(p, "state=online")) != NULL; p++)
        online++;
    return online == 2;
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
    int64_t until = now_ms() + ms;
    while (!cond(s)) {
        if (now_ms() >= until)
            return false;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return true;
}

int ts_sentinels_start(ts_sentinels *c)
{
    memset(c, 0, sizeof *c);
    if (ts_server_start(&c->primary, NULL, true) != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        snprintf(c->replicaof[i], sizeof c->replicaof[i], "%d", c->primary.port);
        c->rargv[i][0] = "--replicaof";
        c->rargv[i][1] = "127.0.0.1";
        c->rargv[i][2] = c->replicaof[i];
        c->rargv[i][3] = NULL;
        if (ts_server_start(&c->replica[i], c->rargv[i], true) != 0)
            goto fail;
    }
    if (!wait_until(replicas_online, &c->primary, 10000)) {
        fprintf(stderr, "ts_sentinels: the replicas never came online\n");
        goto fail;
    }
    for (int i = 0; i < 3; i++)
        if (ts_sentinel_start(&c->sentinel[i], "mymaster", c->primary.port, 2, 500, 2000) != 0)
            goto fail;
    for (int i = 0; i < 3; i++) {
        if (!wait_until(sentinel_ready, &c->sentinel[i], 15000)) {
            fprintf(stderr, "ts_sentinels: Sentinel %d never saw both replicas and both other "
                            "Sentinels\n", i);
            goto fail;
        }
    }
    snprintf(c->url, sizeof c->url,
             "redis+sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/mymaster",
             c->sentinel[0].port, c->sentinel[1].port, c->sentinel[2].port);
    return 0;
fail:
    ts_sentinels_stop(c);
    return -1;
}

void ts_sentinels_stop(ts_sentinels *c)
{
    for (int i = 0; i < 3; i++)
        ts_server_stop(&c->sentinel[i]);
    for (int i = 0; i < 2; i++)
        ts_server_stop(&c->replica[i]);
    ts_server_stop(&c->primary);
}

int ts_sentinels_primary_port(const ts_sentinels *c)
{
    return ts_sentinels_primary_port_of(c, 0);
}

int ts_sentinels_primary_port_of(const ts_sentinels *c, int i)
{
    struct timeval tv = {2, 0};
    redisContext *rc = redisConnectUnixWithTimeout(c->sentinel[i].sock, tv);
    if (rc == NULL || rc->err) {
        if (rc)
            redisFree(rc);
        return -1;
    }
    redisReply *r = redisCommand(rc, "SENTINEL get-master-addr-by-name mymaster");
    int port = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING)
        port = atoi(r->element[1]->str);
    freeReplyObject(r);
    redisFree(rc);
    return port;
}
