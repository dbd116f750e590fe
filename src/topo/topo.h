/* redsem - the topology layer: which node serves a key. One standalone server today
 * (single.c); Sentinel (the primary named by the Sentinels) and Cluster (the slot map) will
 * be other kinds behind the same calls. Every key of one semaphore or lock shares a hash
 * tag, so one key routes a whole call. Not API. */
#ifndef REDSEM_TOPO_H
#define REDSEM_TOPO_H

#include "node/node.h"

typedef struct redsem__topo {
    redsem__node single; /* the one server */
} redsem__topo;

/* Set up the topology of ep without connecting. REDSEM_OK, EINVAL or ENOMEM (reason in err). */
int redsem__topo_init(redsem__topo *t, redsem__ctx *ctx, const redsem__endpoint *ep,
                      const redsem__node_cfg *cfg, char *err, size_t errlen);
void redsem__topo_close(redsem__topo *t);
/* The node that serves key (len bytes); key may be NULL for a call that names no key. */
redsem__node *redsem__topo_node(redsem__topo *t, const char *key, size_t len);
/* Connect to the topology (the first node) now: client creation fails early and clearly. */
int redsem__topo_connect(redsem__topo *t, char *err, size_t errlen);

#endif /* REDSEM_TOPO_H */
