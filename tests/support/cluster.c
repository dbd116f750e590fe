/* Test support: a Redis Cluster on loopback. See cluster.h. */
#include "cluster.h"

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

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A command with a reply that may be long (CLUSTER NODES, CLUSTER SLOTS): the reply object,
 * or NULL. */
static redisReply *command(const ts_server *s, int argc, const char **argv)
{
    struct timeval tv = {5, 0};
    redisContext *ctx = redisConnectUnixWithTimeout(s->sock, tv);
    if (ctx == NULL || ctx->err) {
        if (ctx)
            redisFree(ctx);
        return NULL;
    }
    redisReply *r = redisCommandArgv(ctx, argc, argv, NULL);
    redisFree(ctx);
    return r;
}

static bool node_ok(const ts_cluster *c, int i)
{
    char out[4096] = "";
    if (ts_command(&c->node[i], out, sizeof out, "CLUSTER", "INFO", NULL) != 0 ||
        strstr(out, "cluster_state:ok") == NULL)
        return false;
    const char *argv[] = {"CLUSTER", "NODES"};
    redisReply *r = command(&c->node[i], 2, argv);
    int known = 0;
    if (r != NULL && r->type == REDIS_REPLY_STRING)
        for (int j = 0; j < c->nnodes; j++)
            known += strstr(r->str, c->id[j]) != NULL && c->node[j].pid != 0;
    int running = 0;
    for (int j = 0; j < c->nnodes; j++)
        running += c->node[j].pid != 0;
    bool handshake = r == NULL || r->type != REDIS_REPLY_STRING || strstr(r->str, "handshake");
    if (r)
        freeReplyObject(r);
    return known >= running && !handshake;
}

int ts_cluster_owner(const ts_cluster *c, int asked, int slot)
{
    const char *argv[] = {"CLUSTER", "SLOTS"};
    redisReply *r = command(&c->node[asked], 2, argv);
    int owner = -1;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->elements >= 3 && e->element[0]->integer <= slot && slot <= e->element[1]->integer)
            owner = ts_cluster_by_port(c, (int)e->element[2]->element[1]->integer);
    }
    if (r)
        freeReplyObject(r);
    return owner;
}

int ts_cluster_by_port(const ts_cluster *c, int port)
{
    for (int i = 0; i < c->nnodes; i++)
        if (c->node[i].port == port)
            return i;
    return -1;
}

int ts_cluster_wait_ok(const ts_cluster *c, int slot, int ms)
{
    int64_t until = now_ms() + ms;
    for (;;) {
        bool ok = true;
        int owner = -2;
        for (int i = 0; i < c->nnodes && ok; i++) {
            if (c->node[i].pid == 0)
                continue;
            ok = node_ok(c, i);
            int o = slot >= 0 ? ts_cluster_owner(c, i, slot) : -1;
            if (ok && owner != -2 && o != owner)
                ok = false;
            owner = o;
        }
        if (ok)
            return 0;
        if (now_ms() >= until)
            return -1;
        nap_ms(50);
    }
}

int ts_cluster_start(ts_cluster *c, int nprimaries, int replicas)
{
    return ts_cluster_start_tls(c, nprimaries, replicas, NULL);
}

/* The TLS arguments of node i (after n others in c->argv[i]); the new count. */
static int tls_args(ts_cluster *c, int i, int n, const char *dir)
{
    static const char *const names[5] = {"server.crt", "server.key", "ca.crt", "client.crt",
                                         "client.key"};
    for (int k = 0; k < 5; k++)
        snprintf(c->tls_file[k], sizeof c->tls_file[k], "%s/%s", dir, names[k]);
    c->tls_port[i] = ts_free_port();
    snprintf(c->tls_port_s[i], sizeof c->tls_port_s[i], "%d", c->tls_port[i]);
    const char *a[] = {"--tls-port", c->tls_port_s[i], "--tls-cert-file", c->tls_file[0],
                       "--tls-key-file", c->tls_file[1], "--tls-ca-cert-file", c->tls_file[2],
                       "--tls-client-cert-file", c->tls_file[3], "--tls-client-key-file",
                       c->tls_file[4], "--tls-auth-clients", "no", "--tls-cluster", "yes",
                       "--tls-replication", "yes"};
    memcpy(&c->argv[i][n], a, sizeof a);
    return n + (int)(sizeof a / sizeof *a);
}

int ts_cluster_start_tls(ts_cluster *c, int nprimaries, int replicas, const char *certs_dir)
{
    memset(c, 0, sizeof *c);
    c->nprimaries = nprimaries;
    c->nnodes = nprimaries * (1 + replicas);
    for (int i = 0; i < c->nnodes; i++) {
        int bus = ts_free_port();
        snprintf(c->busport[i], sizeof c->busport[i], "%d", bus);
        const char *a[] = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                           "--cluster-node-timeout", "1000", "--cluster-port", c->busport[i],
                           "--cluster-replica-validity-factor", "0"};
        memcpy(c->argv[i], a, sizeof a);
        int n = (int)(sizeof a / sizeof *a);
        if (certs_dir != NULL)
            n = tls_args(c, i, n, certs_dir);
        c->argv[i][n] = NULL;
        int rc = ts_server_start(&c->node[i], c->argv[i], true);
        if (rc != 0) {
            ts_cluster_stop(c);
            return rc;
        }
        if (ts_command(&c->node[i], c->id[i], sizeof c->id[i], "CLUSTER", "MYID", NULL) != 0)
            goto fail;
    }
    for (int i = 0; i < nprimaries; i++) {
        char lo[16], hi[16];
        snprintf(lo, sizeof lo, "%d", 16384 * i / nprimaries);
        snprintf(hi, sizeof hi, "%d", 16384 * (i + 1) / nprimaries - 1);
        if (ts_command(&c->node[i], NULL, 0, "CLUSTER", "ADDSLOTSRANGE", lo, hi, NULL) != 0)
            goto fail;
    }
    for (int i = 1; i < c->nnodes; i++) {
        char port[16], bus[16];
        snprintf(port, sizeof port, "%d", certs_dir ? c->tls_port[i] : c->node[i].port);
        snprintf(bus, sizeof bus, "%s", c->busport[i]);
        if (ts_command(&c->node[0], NULL, 0, "CLUSTER", "MEET", "127.0.0.1", port, bus,
                       NULL) != 0)
            goto fail;
    }
    /* every node knows every other before a replica names its primary */
    if (ts_cluster_wait_ok(c, -1, 20000) != 0) {
        fprintf(stderr, "ts_cluster: the nodes never all met\n");
        goto fail;
    }
    for (int i = nprimaries; i < c->nnodes; i++) {
        int p = (i - nprimaries) % nprimaries;
        int64_t until = now_ms() + 10000;
        while (ts_command(&c->node[i], NULL, 0, "CLUSTER", "REPLICATE", c->id[p], NULL) != 0) {
            if (now_ms() >= until) {
                fprintf(stderr, "ts_cluster: CLUSTER REPLICATE failed\n");
                goto fail;
            }
            nap_ms(50);
        }
    }
    for (int i = nprimaries; i < c->nnodes; i++) {
        int64_t until = now_ms() + 20000;
        char out[4096] = "";
        while (ts_command(&c->node[i], out, sizeof out, "INFO", "replication", NULL) != 0 ||
               strstr(out, "master_link_status:up") == NULL) {
            if (now_ms() >= until) {
                fprintf(stderr, "ts_cluster: replica %d never synced\n", i);
                goto fail;
            }
            nap_ms(50);
        }
    }
    if (ts_cluster_wait_ok(c, 0, 20000) != 0) {
        fprintf(stderr, "ts_cluster: cluster_state never became ok everywhere\n");
        goto fail;
    }
    int second = c->nnodes > 1 ? 1 : 0;
    if (certs_dir != NULL)
        snprintf(c->url, sizeof c->url, "rediss+cluster://127.0.0.1:%d,127.0.0.1:%d",
                 c->tls_port[0], c->tls_port[second]);
    else
        snprintf(c->url, sizeof c->url, "redis+cluster://127.0.0.1:%d,127.0.0.1:%d",
                 c->node[0].port, c->node[second].port);
    return 0;
fail:
    ts_cluster_stop(c);
    return -1;
}

void ts_cluster_stop(ts_cluster *c)
{
    for (int i = 0; i < c->nnodes; i++)
        if (c->node[i].dir[0] != '\0')
            ts_server_stop(&c->node[i]);
}

int ts_cluster_move_slot(ts_cluster *c, int slot, int from, int to, void (*between)(void *),
                         void *arg)
{
    char s[16], port[16];
    snprintf(s, sizeof s, "%d", slot);
    snprintf(port, sizeof port, "%d", c->node[to].port);
    if (ts_command(&c->node[to], NULL, 0, "CLUSTER", "SETSLOT", s, "IMPORTING", c->id[from],
                   NULL) != 0 ||
        ts_command(&c->node[from], NULL, 0, "CLUSTER", "SETSLOT", s, "MIGRATING", c->id[to],
                   NULL) != 0) {
        fprintf(stderr, "ts_cluster: SETSLOT IMPORTING/MIGRATING failed\n");
        return -1;
    }
    for (int batch = 0;; batch++) {
        const char *argv[] = {"CLUSTER", "GETKEYSINSLOT", s, "2"};
        redisReply *r = command(&c->node[from], 4, argv);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
            fprintf(stderr, "ts_cluster: GETKEYSINSLOT failed\n");
            if (r)
                freeReplyObject(r);
            return -1;
        }
        if (r->elements == 0) {
            freeReplyObject(r);
            break;
        }
        const char *mv[16] = {"MIGRATE", "127.0.0.1", port, "", "0", "5000", "REPLACE", "KEYS"};
        int n = 8;
        for (size_t i = 0; i < r->elements && n < 16; i++)
            mv[n++] = r->element[i]->str;
        redisReply *m = command(&c->node[from], n, mv);
        bool ok = m != NULL && m->type != REDIS_REPLY_ERROR;
        if (!ok)
            fprintf(stderr, "ts_cluster: MIGRATE: %s\n", m && m->str ? m->str : "no reply");
        if (m)
            freeReplyObject(m);
        freeReplyObject(r);
        if (!ok)
            return -1;
        if (batch == 0 && between != NULL)
            between(arg);
    }
    /* the new owner first, then the old, then the other primaries (as redis-cli does) */
    if (ts_command(&c->node[to], NULL, 0, "CLUSTER", "SETSLOT", s, "NODE", c->id[to], NULL) != 0 ||
        ts_command(&c->node[from], NULL, 0, "CLUSTER", "SETSLOT", s, "NODE", c->id[to], NULL) !=
            0) {
        fprintf(stderr, "ts_cluster: SETSLOT NODE failed\n");
        return -1;
    }
    for (int i = 0; i < c->nnodes; i++)
        if (i != from && i != to && c->node[i].pid != 0)
            (void)ts_command(&c->node[i], NULL, 0, "CLUSTER", "SETSLOT", s, "NODE", c->id[to],
                             NULL);
    return 0;
}
