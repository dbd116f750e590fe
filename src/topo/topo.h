/* redsem - the topology layer: which node serves a key. A standalone server (one node at a
 * fixed address) or a Sentinel-managed primary (one node whose address the Sentinels give,
 * asked again at every reconnect); Cluster (the slot map) will be another kind behind the
 * same calls. Every key of one semaphore or lock shares a hash tag, so one key routes a whole
 * call. Not API. */
#ifndef REDSEM_TOPO_H
#define REDSEM_TOPO_H

#include "node/node.h"

enum { REDSEM__TOPO_SINGLE = 1, REDSEM__TOPO_SENTINEL = 2 };

typedef struct redsem__topo {
    int kind;
    redsem__node single; /* the one server; under Sentinel, the current primary */
    /* SENTINEL: the Sentinels (tried in order; the first that answers moves to the front,
     * as the Redis "Sentinel clients" guide says), the primary's name, their credentials */
    redsem__endpoint sentinels;
    size_t first;
    redsem__ctx *ctx;
} redsem__topo;

/* Set up the topology of ep without connecting. REDSEM_OK, EINVAL or ENOMEM (reason in err). */
int redsem__topo_init(redsem__topo *t, redsem__ctx *ctx, const redsem__endpoint *ep,
                      const redsem__node_cfg *cfg, char *err, size_t errlen);
void redsem__topo_close(redsem__topo *t);
/* The node that serves key (len bytes); key may be NULL for a call that names no key. */
redsem__node *redsem__topo_node(redsem__topo *t, const char *key, size_t len);
/* Connect to the topology (the first node) now: client creation fails early and clearly. */
int redsem__topo_connect(redsem__topo *t, char *err, size_t errlen);

/* sentinel.c: ask the Sentinels of t for the primary's address, into n->ep (the node's
 * resolve hook). REDSEM_OK; REDSEM_ECONN (no Sentinel answered, or none knows the primary:
 * err says what each said); REDSEM_ETIMEDOUT; REDSEM_EPERM (a Sentinel refused the
 * credentials); REDSEM_ENOMEM. */
int redsem__sentinel_resolve(void *topo, redsem__node *n, int64_t deadline_ns, char *err,
                             size_t errlen);

#endif /* REDSEM_TOPO_H */
