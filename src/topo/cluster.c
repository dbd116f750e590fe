/* redsem - Redis Cluster: the slot map (CLUSTER SLOTS), one node per primary, routing by the
 * key's hash slot and the redirections of the Redis Cluster specification
 * (https://redis.io/docs/reference/cluster-spec/: "Redirection and resharding", "ASK
 * redirection", "Hash tags"). */
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "topo/topo.h"

/* ================================================================ hash slot */

/* CRC16-CCITT as the specification names it (XMODEM: polynomial 0x1021, initial 0, no
 * reflection, no final xor); its check value for "123456789" is 0x31C3. */
static uint16_t crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

int redsem__key_slot(const char *key, size_t len)
{
    /* the hash tag: between the first '{' and the first '}' after it, when not empty */
    const char *open = memchr(key, '{', len);
    if (open != NULL) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(open + 1, '}', len - from);
        if (close != NULL && close > open + 1)
            return crc16(open + 1, (size_t)(close - open - 1)) & (REDSEM__SLOTS - 1);
    }
    return crc16(key, len) & (REDSEM__SLOTS - 1);
}

/* ================================================================ nodes */

/* A node of the table and what the topology knows of it. n first: a cnode * is the
 * redsem__node * that the table, the map and the calls use. */
typedef struct cnode {
    redsem__node n;
    int64_t used_ns; /* when a call or a map request last went to it */
} cnode;

static cnode *cn(redsem__node *n)
{
    return (cnode *)n;
}

int redsem__cluster_init(redsem__topo *t, const redsem__endpoint *ep, const redsem__node_cfg *cfg,
                         char *err, size_t errlen)
{
    redsem__conn_init(&t->single.conn); /* unused in a cluster */
    t->cfg = *cfg;
    t->slots = redsem__calloc(REDSEM__SLOTS, sizeof *t->slots);
    t->nodes = redsem__calloc(REDSEM__CLUSTER_NODES_MAX, sizeof *t->nodes);
    if (t->slots == NULL || t->nodes == NULL || redsem__endpoint_copy(&t->given, ep) != REDSEM_OK) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    return REDSEM_OK;
}

static void node_free(redsem__node *n)
{
    redsem__node_close(n);
    redsem__free(cn(n));
}

void redsem__cluster_close(redsem__topo *t)
{
    for (size_t i = 0; i < t->nnodes; i++)
        if (t->nodes[i] != NULL)
            node_free(t->nodes[i]);
    redsem__free(t->nodes);
    redsem__free(t->slots);
    redsem__endpoint_clear(&t->given);
    t->nodes = NULL;
    t->slots = NULL;
    t->nnodes = 0;
}

size_t redsem__cluster_live_nodes(const redsem__topo *t)
{
    size_t live = 0;
    for (size_t i = 0; i < t->nnodes; i++)
        live += t->nodes[i] != NULL;
    return live;
}

static bool is_seed(const redsem__topo *t, const redsem__node *n)
{
    for (size_t i = 0; i < t->given.nhosts; i++)
        if (t->given.hosts[i].port == n->ep.port && strcmp(t->given.hosts[i].host, n->ep.host) == 0)
            return true;
    return false;
}

/* Which entries of the table serve a slot in the map (or in pending, a map being built:
 * NULL or REDSEM__SLOTS entries). */
static void mapped(const redsem__topo *t, const uint16_t *pending,
                   bool in_map[REDSEM__CLUSTER_NODES_MAX])
{
    memset(in_map, 0, REDSEM__CLUSTER_NODES_MAX * sizeof *in_map);
    for (int s = 0; s < REDSEM__SLOTS; s++) {
        if (t->slots[s] != 0)
            in_map[t->slots[s] - 1] = true;
        if (pending != NULL && pending[s] != 0)
            in_map[pending[s] - 1] = true;
    }
}

/* Drop (close and free) the nodes that serve no slot of the map (nor of pending), are not
 * seeds (always kept: the way back into the cluster), are not keep (a node the caller holds)
 * and, unless force, have had no call for REDSEM__CLUSTER_DROP_MS (an ASK target in use
 * stays). Their entries become free; the other nodes keep their indices, so the map stays
 * right. Returns how many such nodes were kept for being in use (to look again later). */
static size_t sweep(redsem__topo *t, const redsem__node *keep, const uint16_t *pending,
                    bool force)
{
    bool in_map[REDSEM__CLUSTER_NODES_MAX];
    mapped(t, pending, in_map);
    int64_t now = redsem__now_ns();
    size_t kept = 0;
    for (size_t i = 0; i < t->nnodes; i++) {
        redsem__node *n = t->nodes[i];
        if (n == NULL || in_map[i] || n == keep || is_seed(t, n))
            continue;
        if (!force && now - cn(n)->used_ns < REDSEM__CLUSTER_DROP_MS * REDSEM__NS_PER_MS) {
            kept++;
            continue;
        }
        node_free(n);
        t->nodes[i] = NULL;
    }
    while (t->nnodes > 0 && t->nodes[t->nnodes - 1] == NULL)
        t->nnodes--;
    return kept;
}

/* The node at host:port, made (not connected) if new: the URL's credentials and TLS; in a
 * free entry, or a new one, or, the table being full, one freed by dropping the nodes out of
 * the map (keep and pending as for sweep). Its index in *ret_index. REDSEM_OK, REDSEM_ENOMEM,
 * REDSEM_EINVAL (a TLS file) or REDSEM_ESERVER (REDSEM__CLUSTER_NODES_MAX nodes in use), with
 * the reason in the context. */
static int node_at(redsem__topo *t, const char *host, int port, const redsem__node *keep,
                   const uint16_t *pending, size_t *ret_index)
{
    size_t at = SIZE_MAX;
    for (size_t i = 0; i < t->nnodes; i++) {
        redsem__node *n = t->nodes[i];
        if (n == NULL) {
            if (at == SIZE_MAX)
                at = i;
        } else if (n->ep.port == port && strcmp(n->ep.host, host) == 0) {
            *ret_index = i;
            return REDSEM_OK;
        }
    }
    if (at == SIZE_MAX && t->nnodes == REDSEM__CLUSTER_NODES_MAX) {
        (void)sweep(t, keep, pending, true);
        for (size_t i = 0; i < t->nnodes && at == SIZE_MAX; i++)
            if (t->nodes[i] == NULL)
                at = i;
        if (at == SIZE_MAX && t->nnodes == REDSEM__CLUSTER_NODES_MAX)
            return redsem__ctx_err(t->ctx, REDSEM_ESERVER, "the cluster named more than %d "
                                   "nodes in use at once", REDSEM__CLUSTER_NODES_MAX);
    }
    if (at == SIZE_MAX)
        at = t->nnodes;
    cnode *c = redsem__calloc(1, sizeof *c);
    if (c == NULL)
        return redsem__ctx_err(t->ctx, REDSEM_ENOMEM, "out of memory");
    redsem__node *n = &c->n;
    redsem__endpoint ep = {.kind = REDSEM__EP_TCP, .host = (char *)host, .port = port,
                           .user = t->given.user, .password = t->given.password,
                           .tls = t->given.tls};
    char err[256] = "";
    int rc = redsem__node_init(n, t->ctx, &ep, &t->cfg, err, sizeof err);
    if (rc != REDSEM_OK) {
        node_free(n);
        return redsem__ctx_err(t->ctx, rc, "%s", err);
    }
    n->cluster = true;
    c->used_ns = redsem__now_ns();
    t->nodes[at] = n;
    if (at == t->nnodes)
        t->nnodes++;
    t->sweep_due = true;
    *ret_index = at;
    return REDSEM_OK;
}

void redsem__cluster_touch(redsem__topo *t, size_t i)
{
    if (i < t->nnodes && t->nodes[i] != NULL)
        cn(t->nodes[i])->used_ns = redsem__now_ns();
}

bool redsem__cluster_sweep(redsem__topo *t)
{
    int64_t now = redsem__now_ns();
    if (!t->sweep_due || now - t->swept_ns < REDSEM__CLUSTER_DROP_MS * REDSEM__NS_PER_MS)
        return false;
    t->swept_ns = now;
    t->sweep_due = sweep(t, NULL, NULL, false) > 0;
    return true;
}

static redsem__node *slot_node(redsem__topo *t, int slot)
{
    if (slot < 0) {
        /* a call that names no key: any node that serves a slot, else any node */
        for (int s = 0; s < REDSEM__SLOTS; s++)
            if (t->slots[s] != 0)
                return t->nodes[t->slots[s] - 1];
        for (size_t i = 0; i < t->nnodes; i++)
            if (t->nodes[i] != NULL)
                return t->nodes[i];
        return NULL;
    }
    return t->slots[slot] != 0 ? t->nodes[t->slots[slot] - 1] : NULL;
}

redsem__node *redsem__cluster_node(redsem__topo *t, const char *key, size_t len)
{
    return slot_node(t, key != NULL ? redsem__key_slot(key, len) : -1);
}

/* ================================================================ the slot map */

static bool reply_port(const redisReply *r, int *port)
{
    long long v;
    if (!redsem__reply_int(r, &v) || v < 1 || v > 65535)
        return false;
    *port = (int)v;
    return true;
}

/* CLUSTER SLOTS (Redis 3.0 to 7.x): an array of [start, end, [host, port, id, ...] (the
 * primary), [replica]...]. A host that is "" or "?" (unknown endpoint) is the asked node's
 * own. Builds the whole map first, then replaces the old one. */
int redsem__cluster_read_map(redsem__topo *t, redsem__node *asked, const redisReply *r,
                             char *err, size_t errlen)
{
    if (r->type != REDIS_REPLY_ARRAY) {
        snprintf(err, errlen, "%s:%d: CLUSTER SLOTS: unexpected reply", asked->ep.host,
                 asked->ep.port);
        return REDSEM_EPROTO;
    }
    uint16_t *map = redsem__calloc(REDSEM__SLOTS, sizeof *map);
    if (map == NULL)
        return REDSEM_ENOMEM;
    size_t served = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        long long from, to;
        int port;
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            !redsem__reply_int(e->element[0], &from) || !redsem__reply_int(e->element[1], &to) ||
            from < 0 || to < from || to >= REDSEM__SLOTS ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
            e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            !reply_port(e->element[2]->element[1], &port)) {
            redsem__free(map);
            snprintf(err, errlen, "%s:%d: CLUSTER SLOTS: unexpected entry", asked->ep.host,
                     asked->ep.port);
            return REDSEM_EPROTO;
        }
        const char *host = e->element[2]->element[0]->str;
        if (host[0] == '\0' || strcmp(host, "?") == 0)
            host = asked->ep.host;
        size_t idx;
        int rc = node_at(t, host, port, asked, map, &idx);
        if (rc != REDSEM_OK) {
            redsem__free(map);
            snprintf(err, errlen, "%.200s", t->ctx->errmsg);
            return rc;
        }
        for (long long s = from; s <= to; s++)
            map[s] = (uint16_t)(idx + 1);
        served += (size_t)(to - from + 1);
    }
    if (served == 0) {
        redsem__free(map);
        snprintf(err, errlen, "%s:%d: the cluster serves no hash slot yet", asked->ep.host,
                 asked->ep.port);
        return REDSEM_ESERVER;
    }
    redsem__free(t->slots);
    t->slots = map;
    t->sweep_due = true; /* nodes may have left it */
    return REDSEM_OK;
}

/* ================================================================ routing */

#define REDSEM__CLUSTER_HOPS_MAX 16

int redsem__cluster_node_at(redsem__topo *t, const char *host, int port, size_t *ret_index)
{
    return node_at(t, host, port, NULL, NULL, ret_index);
}

int redsem__cluster_redirected(redsem__topo *t, const redsem__redirect *d, int *hops,
                               size_t *ret_index, bool *asking, bool *refresh)
{
    *asking = false;
    *refresh = true;
    if (d->kind == REDSEM__REDIR_TRYAGAIN) /* TRYAGAIN, CLUSTERDOWN, UNBLOCKED: the text is
                                            * in errmsg; a slot being moved, or a failover
                                            * under way; the map may have changed */
        return REDSEM_ESERVER;
    int rc = node_at(t, d->host, d->port, NULL, NULL, ret_index);
    if (rc != REDSEM_OK) {
        *refresh = false;
        return rc;
    }
    REDSEM__COUNT(t->ctx, redirects, 1);
    if (++*hops > REDSEM__CLUSTER_HOPS_MAX) {
        /* nodes that disagree (a slot's new owner not yet known to all): wait for them to
         * agree, within the retry window */
        *hops = 0;
        return redsem__ctx_err(t->ctx, REDSEM_ESERVER,
                               "more than %d cluster redirections for one request (last: "
                               "%s:%d)", REDSEM__CLUSTER_HOPS_MAX, d->host, d->port);
    }
    if (d->kind == REDSEM__REDIR_ASK) { /* this key only, this once: the map stays */
        *asking = true;
        *refresh = false;
        return REDSEM_OK;
    }
    t->slots[d->slot] = (uint16_t)(*ret_index + 1);
    return REDSEM_OK;
}

