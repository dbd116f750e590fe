/* Test support: a Sentinel-managed primary on loopback: one primary, two replicas and three
 * Sentinels (quorum 2, down-after 500 ms, failover-timeout 2 s), all private servers. Used by
 * tests/test_sentinel.c and the fault suite. Not part of the library. */
#ifndef REDSEM_TEST_SENTINEL_H
#define REDSEM_TEST_SENTINEL_H

#include "server.h"

typedef struct ts_sentinels {
    ts_server primary, replica[2], sentinel[3];
    char replicaof[2][32];
    const char *rargv[2][4];
    char url[512]; /* redis+sentinel://127.0.0.1:P1,...:P3/mymaster */
} ts_sentinels;

/* Start it all and wait until both replicas are online and every Sentinel knows both
 * replicas and the other two Sentinels (so that a failover can happen). 0, or -1 with a
 * message on stderr (what is started is stopped again). */
int ts_sentinels_start(ts_sentinels *c);
void ts_sentinels_stop(ts_sentinels *c);
/* The port of the primary the first Sentinel names now, or -1. */
int ts_sentinels_primary_port(const ts_sentinels *c);
/* The same as Sentinel i (0..2) names it. */
int ts_sentinels_primary_port_of(const ts_sentinels *c, int i);

#endif
