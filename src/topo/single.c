/* redsem - the single-server topology: every key is served by the one node. */
#include "topo/topo.h"

int redsem__topo_init(redsem__topo *t, redsem__ctx *ctx, const redsem__endpoint *ep,
                      int64_t connect_timeout_ms, int64_t command_timeout_ms, int64_t retry_ms)
{
    return redsem__node_init(&t->single, ctx, ep, connect_timeout_ms, command_timeout_ms,
                             retry_ms);
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
