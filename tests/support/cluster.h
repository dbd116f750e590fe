/* Test support: a Redis Cluster on loopback: 3 primaries and 3 replicas (one per primary),
 * private servers started with --cluster-enabled yes (node timeout 1 s) and joined by the
 * test's own commands (CLUSTER ADDSLOTSRANGE, MEET, REPLICATE). Used by tests/test_cluster.c,
 * the fault suite and the bench. Not part of the library. */
#ifndef REDSEM_TEST_CLUSTER_H
#define REDSEM_TEST_CLUSTER_H

#include "server.h"

#define TS_CLUSTER_MAX 6

typedef struct ts_cluster {
    int nprimaries, nnodes;
    ts_server node[TS_CLUSTER_MAX]; /* 0..nprimaries-1 primaries at start, then replicas */
    char busport[TS_CLUSTER_MAX][16];
    const char *argv[TS_CLUSTER_MAX][32];
    /* with TLS (ts_cluster_start_tls): each node's TLS port, and the certificate files */
    int tls_port[TS_CLUSTER_MAX];
    char tls_port_s[TS_CLUSTER_MAX][16];
    char tls_file[5][320];
    char id[TS_CLUSTER_MAX][48]; /* node ids */
    char url[512];               /* redis+cluster://127.0.0.1:P0,127.0.0.1:P1 */
} ts_cluster;

/* Start nprimaries (1..3) primaries, each with `replicas` (0 or 1) replicas, the 16384 slots
 * split evenly, and wait until every node says cluster_state:ok and knows every other node.
 * 0, 77 without redis-server, or -1 with a message on stderr (what is started is stopped). */
int ts_cluster_start(ts_cluster *c, int nprimaries, int replicas);
/* The same with a TLS port on every node (the test's own commands keep the unix socket),
 * the cluster bus and replication over TLS (tls-cluster, tls-replication; the nodes present
 * client.crt to each other), certificates from certs_dir (support/gen-certs.sh); url is then
 * rediss+cluster:// with the TLS ports, which CLUSTER SLOTS gives a TLS client. */
int ts_cluster_start_tls(ts_cluster *c, int nprimaries, int replicas, const char *certs_dir);
void ts_cluster_stop(ts_cluster *c);
/* The index of the node that node i says serves slot (CLUSTER SLOTS), or -1. */
int ts_cluster_owner(const ts_cluster *c, int asked, int slot);
/* The index of the node listening on port, or -1. */
int ts_cluster_by_port(const ts_cluster *c, int port);
/* Wait until every running node (pid != 0) says cluster_state:ok and agrees on the owner of
 * slot. 0 or -1 after ms. */
int ts_cluster_wait_ok(const ts_cluster *c, int slot, int ms);
/* Move slot from node `from` to node `to` as redis-cli --cluster reshard does: SETSLOT
 * IMPORTING / MIGRATING, MIGRATE of every key in batches, SETSLOT NODE on both and on every
 * other primary. between (may be NULL) runs after the first batch is migrated (a half-moved
 * slot: ASK replies). 0 or -1 with a message on stderr. */
int ts_cluster_move_slot(ts_cluster *c, int slot, int from, int to, void (*between)(void *),
                         void *arg);

#endif
