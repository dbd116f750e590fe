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

void redsem__cluster_close(redsem__topo *t)
{
    for (size_t i = 0; i < t->nnodes; i++) {
        redsem__node_close(t->nodes[i]);
        redsem__free(t->nodes[i]);
    }
    redsem__free(t->nodes);
    redsem__free(t->slots);
    redsem__endpoint_clear(&t->given);
    t->nodes = NULL;
    t->slots = NULL;
    t->nnodes = 0;
}

/* The node at host:port, made (not connected) if new: the URL's credentials and TLS. Its index
 * in *ret_index. REDSEM_OK, REDSEM_ENOMEM, REDSEM_EINVAL (a TLS file) or REDSEM_ESERVER (more
 * than REDSEM__CLUSTER_NODES_MAX nodes), with the reason in the context. */
static int node_at(redsem__topo *t, const char *host, int port, size_t *ret_index)
{
    for (size_t i = 0; i < t->nnodes; i++)
        if (t->nodes[i]->ep.port == port && strcmp(t->nodes[i]->ep.host, host) == 0) {
            *ret_index = i;
            return REDSEM_OK;
        }
    if (t->nnodes == REDSEM__CLUSTER_NODES_MAX)
        return redsem__ctx_err(t->ctx, REDSEM_ESERVER, "the cluster named more than %d nodes",
                               REDSEM__CLUSTER_NODES_MAX);
    redsem__node *n = redsem__calloc(1, sizeof *n);
    if (n == NULL)
        return redsem__ctx_err(t->ctx, REDSEM_ENOMEM, "out of memory");
    redsem__endpoint ep = {.kind = REDSEM__EP_TCP, .host = (char *)host, .port = port,
                           .user = t->given.user, .password = t->given.password,
                           .tls = t->given.tls};
    char err[256] = "";
    int rc = redsem__node_init(n, t->ctx, &ep, &t->cfg, err, sizeof err);
    if (rc != REDSEM_OK) {
        redsem__node_close(n);
        redsem__free(n);
        return redsem__ctx_err(t->ctx, rc, "%s", err);
    }
    n->cluster = true;
    t->nodes[t->nnodes] = n;
    *ret_index = t->nnodes++;
    return REDSEM_OK;
}

static redsem__node *slot_node(redsem__topo *t, int slot)
{
    if (slot < 0) {
        /* a call that names no key: any node that serves a slot */
        for (int s = 0; s < REDSEM__SLOTS; s++)
            if (t->slots[s] != 0)
                return t->nodes[t->slots[s] - 1];
        return t->nnodes > 0 ? t->nodes[0] : NULL;
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
static int read_map(redsem__topo *t, redsem__node *asked, const redisReply *r, char *err,
                    size_t errlen)
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
        int rc = node_at(t, host, port, &idx);
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
    return REDSEM_OK;
}

/* Ask one node for the map. */
static int ask_map(redsem__topo *t, redsem__node *n, int64_t deadline_ns, char *err,
                   size_t errlen)
{
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, "CLUSTER");
    redsem__args_str(&a, "SLOTS");
    redisReply *r = NULL;
    int rc = redsem__node_request(n, &a, 0, deadline_ns, &r, NULL);
    if (rc != REDSEM_OK) {
        snprintf(err, errlen, "%s:%d: %.200s", n->ep.host, n->ep.port, t->ctx->errmsg);
        return rc;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        if (strstr(r->str, "cluster support disabled") != NULL) {
            snprintf(err, errlen, "%s:%d is not a cluster node (cluster support disabled): use "
                     "a redis:// URL for a standalone server", n->ep.host, n->ep.port);
            rc = REDSEM_EINVAL;
        } else {
            rc = redsem__node_error_reply(n, r, "CLUSTER SLOTS");
            if (rc == REDSEM__EREDIRECT)
                rc = REDSEM_ESERVER;
            snprintf(err, errlen, "%s:%d: %.200s", n->ep.host, n->ep.port, t->ctx->errmsg);
        }
    } else {
        rc = read_map(t, n, r, err, errlen);
    }
    freeReplyObject(r);
    return rc;
}

/* How bad a failure to read the map is, to report the worst: a node that is not in cluster
 * mode or refuses the credentials says more than one that cannot be reached (refused or
 * timed out: both REDSEM_ECONN when no node answers). */
static int severity(int rc)
{
    return rc == REDSEM_EINVAL || rc == REDSEM_EPERM ? 3
           : rc == REDSEM_ECONN || rc == REDSEM_ETIMEDOUT ? 1
                                                          : 2;
}

/* Read the map from the known nodes (the ones serving slots first, starting after the last
 * that answered, skipping avoid), then the seeds, within timeout_ms overall. */
static int refresh(redsem__topo *t, const redsem__node *avoid, char *err, size_t errlen)
{
    int64_t deadline = redsem__deadline_after_ms(t->cfg.connect_timeout_ms);
    int64_t saved_cap = t->ctx->deadline_cap_ns;
    if (saved_cap == 0 || deadline < saved_cap)
        t->ctx->deadline_cap_ns = deadline; /* bounds the connects too */
    t->refreshed_ns = redsem__now_ns();
    /* the seeds join the known nodes at the end (as nodes: a seed is usually a primary) */
    for (size_t i = 0; i < t->given.nhosts; i++) {
        size_t idx;
        int rc = node_at(t, t->given.hosts[i].host, t->given.hosts[i].port, &idx);
        if (rc != REDSEM_OK) {
            t->ctx->deadline_cap_ns = saved_cap;
            snprintf(err, errlen, "%.200s", t->ctx->errmsg);
            return rc;
        }
    }
    int worst = REDSEM_ECONN;
    char why[512] = "", one[256];
    size_t count = t->nnodes;
    int rc = REDSEM_ECONN;
    for (size_t k = 0; k < count; k++) {
        size_t i = (t->first + k) % count;
        redsem__node *n = t->nodes[i];
        if (n == avoid && count > 1)
            continue;
        if (redsem__now_ns() >= deadline)
            break;
        rc = ask_map(t, n, deadline, one, sizeof one);
        if (rc == REDSEM_OK) {
            t->first = i;
            break;
        }
        if (rc == REDSEM_ENOMEM)
            break;
        if (severity(rc) > severity(worst))
            worst = rc;
        size_t l = strlen(why);
        snprintf(why + l, sizeof why - l, "%s%s", l ? "; " : "", one);
    }
    t->ctx->deadline_cap_ns = saved_cap;
    if (rc == REDSEM_OK || rc == REDSEM_ENOMEM)
        return rc;
    snprintf(err, errlen, "no cluster node gave the slot map: %s",
             why[0] ? why : "none could be asked before the deadline");
    return worst;
}

int redsem__cluster_connect(redsem__topo *t, char *err, size_t errlen)
{
    return refresh(t, NULL, err, errlen);
}

/* Re-read the map unless that was done less than REDSEM__CLUSTER_REFRESH_MS ago. A failure
 * leaves the old map (the caller's retries find out). */
static void refresh_soon(redsem__topo *t, const redsem__node *avoid)
{
    if (redsem__now_ns() - t->refreshed_ns < REDSEM__CLUSTER_REFRESH_MS * REDSEM__NS_PER_MS)
        return;
    char saved[sizeof t->ctx->errmsg], err[512];
    memcpy(saved, t->ctx->errmsg, sizeof saved);
    (void)refresh(t, avoid, err, sizeof err);
    memcpy(t->ctx->errmsg, saved, sizeof saved);
}

/* ================================================================ routing */

#define REDSEM__CLUSTER_HOPS_MAX 16

int redsem__cluster_route(redsem__topo *t, const char *key, size_t len, int flags,
                          redsem__req_info *info, redsem__node_call call, void *arg)
{
    int slot = key != NULL ? redsem__key_slot(key, len) : -1;
    redsem__node *next = NULL; /* the node a redirection named, for the next try only */
    bool asking = false, maybe_applied = false;
    int64_t retry_until = 0, backoff = 5 * REDSEM__NS_PER_MS;
    for (int hops = 0;;) {
        redsem__node *n = next != NULL ? next : slot_node(t, slot);
        int rc;
        if (n == NULL) {
            refresh_soon(t, NULL);
            n = slot_node(t, slot);
        }
        if (n == NULL) {
            rc = redsem__ctx_err(t->ctx, REDSEM_ESERVER, "no cluster node serves hash slot %d",
                                 slot);
        } else {
            n->asking = asking;
            rc = call(n, arg);
            n->asking = false;
            if (info != NULL) {
                maybe_applied = maybe_applied || info->maybe_applied;
                info->maybe_applied = maybe_applied;
            }
            next = NULL;
            asking = false;
            if (rc == REDSEM__EREDIRECT && n->redirect.kind != REDSEM__REDIR_TRYAGAIN) {
                redsem__redirect d = n->redirect;
                size_t idx;
                rc = node_at(t, d.host, d.port, &idx);
                if (rc != REDSEM_OK)
                    return rc;
                REDSEM__COUNT(t->ctx, redirects, 1);
                if (++hops > REDSEM__CLUSTER_HOPS_MAX) {
                    /* nodes that disagree (a slot's new owner not yet known to all): wait
                     * for them to agree, within the retry window */
                    hops = 0;
                    rc = redsem__ctx_err(t->ctx, REDSEM_ESERVER, "more than %d cluster "
                                         "redirections for one request (last: %s:%d)",
                                         REDSEM__CLUSTER_HOPS_MAX, d.host, d.port);
                    refresh_soon(t, NULL);
                } else if (d.kind == REDSEM__REDIR_ASK) {
                    next = t->nodes[idx]; /* this key only, this once: the map stays */
                    asking = true;
                } else {
                    t->slots[d.slot] = (uint16_t)(idx + 1);
                    refresh_soon(t, NULL); /* more slots have likely moved with it */
                    t->slots[d.slot] = (uint16_t)(idx + 1);
                    next = t->nodes[idx]; /* where the node said, whatever the map says */
                }
                if (hops > 0)
                    continue;
            } else if (rc == REDSEM__EREDIRECT) {
                /* TRYAGAIN, CLUSTERDOWN, UNBLOCKED (the text is in errmsg): a slot being
                 * moved, or a failover under way; the map may have changed */
                rc = REDSEM_ESERVER;
                refresh_soon(t, NULL);
            } else if (rc == REDSEM_ECONN && (flags & REDSEM__REQ_RETRY))
                refresh_soon(t, n); /* a failover may have moved its slots */
            else
                return rc;
        }
        /* nothing ran (a redirection or refusal), or with REDSEM__REQ_RETRY running it again
         * is safe: retry within the window */
        if (t->cfg.retry_ms == 0)
            return rc;
        int64_t now = redsem__now_ns();
        if (retry_until == 0) {
            retry_until = now + t->cfg.retry_ms * REDSEM__NS_PER_MS;
            if (t->ctx->deadline_cap_ns && t->ctx->deadline_cap_ns < retry_until)
                retry_until = t->ctx->deadline_cap_ns;
        }
        if (now >= retry_until)
            return rc;
        int64_t nap = redsem__rand_between(backoff / 2, backoff);
        if (nap > retry_until - now)
            nap = retry_until - now;
        redsem__sleep_ns(nap);
        backoff = backoff * 2 > 100 * REDSEM__NS_PER_MS ? 100 * REDSEM__NS_PER_MS : backoff * 2;
        REDSEM__COUNT(t->ctx, retries, 1);
    }
}
