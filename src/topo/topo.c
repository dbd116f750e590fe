/* redsem - topologies: a single server, or a Sentinel-managed primary (sentinel.c). */
#include <stdio.h>
#include <string.h>

#include "topo/topo.h"

int redsem__topo_init(redsem__topo *t, redsem__ctx *ctx, const redsem__endpoint *ep,
                      const redsem__node_cfg *cfg, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    t->ctx = ctx;
    if (ep->kind != REDSEM__EP_SENTINEL) {
        t->kind = REDSEM__TOPO_SINGLE;
        return redsem__node_init(&t->single, ctx, ep, cfg, err, errlen);
    }
    t->kind = REDSEM__TOPO_SENTINEL;
    if (redsem__endpoint_copy(&t->sentinels, ep) != REDSEM_OK) {
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
    return rc;
}

void redsem__topo_close(redsem__topo *t)
{
    redsem__node_close(&t->single);
    redsem__endpoint_clear(&t->sentinels);
}

redsem__node *redsem__topo_node(redsem__topo *t, const char *key, size_t len)
{
    (void)key;
    (void)len;
    return &t->single;
}

int redsem__topo_connect(redsem__topo *t, char *err, size_t errlen)
{
    bool retryable;
    return redsem__node_connect(&t->single, &retryable, err, errlen);
}
