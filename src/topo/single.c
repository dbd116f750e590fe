/* redsem - the single-server topology: every key is served by the one node. */
#include "topo/topo.h"

int redsem__topo_init(redsem__topo *t, redsem__ctx *ctx, const redsem__endpoint *ep,
                      const redsem__node_cfg *cfg, char *err, size_t errlen)
{
    return redsem__node_init(&t->single, ctx, ep, cfg, err, errlen);
}

void redsem__topo_close(redsem__topo *t)
{
    redsem__node_close(&t->single);
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
