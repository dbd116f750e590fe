/* redsem - topologies: a single server, a Sentinel-managed primary (sentinel.c), or a Redis
 * Cluster (cluster.c). */
#include <stdio.h>
#include <string.h>

#include "topo/topo.h"

int redsem__topo_init(redsem__topo *t, redsem__ctx *ctx, const redsem__endpoint *ep,
                      const redsem__node_cfg *cfg, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    t->ctx = ctx;
    if (ep->kind == REDSEM__EP_CLUSTER) {
        t->kind = REDSEM__TOPO_CLUSTER;
        return redsem__cluster_init(t, ep, cfg, err, errlen);
    }
    if (ep->kind != REDSEM__EP_SENTINEL) {
        t->kind = REDSEM__TOPO_SINGLE;
        return redsem__node_init(&t->single, ctx, ep, cfg, err, errlen);
    }
    t->kind = REDSEM__TOPO_SENTINEL;
    if (redsem__endpoint_copy(&t->given, ep) != REDSEM_OK) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    /* the data node: the URL's credentials, db and TLS; its address comes from the
     * Sentinels at every connect */
    redsem__endpoint data = {.kind = REDSEM__EP_TCP, .user = ep->user, .password = ep->password,
                             .db = ep->db, .tls = ep->tls};
    int rc = redsem__node_init(&t->single, ctx, &data, cfg, err, errlen);
    t->single.resolve = redsem__sentinel_resolve;
    t->single.resolve_arg = t;
    t->single.moved = redsem__sentinel_moved;
    return rc;
}

void redsem__topo_close(redsem__topo *t)
{
    if (t->kind == REDSEM__TOPO_CLUSTER)
        redsem__cluster_close(t);
    else
        redsem__node_close(&t->single);
    redsem__endpoint_clear(&t->given);
}

redsem__node *redsem__topo_node(redsem__topo *t, const char *key, size_t len)
{
    if (t->kind == REDSEM__TOPO_CLUSTER)
        return redsem__cluster_node(t, key, len);
    return &t->single;
}

