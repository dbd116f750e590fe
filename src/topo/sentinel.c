/* redsem - a Sentinel-managed primary (the Redis "Sentinel clients" guide): ask the Sentinels
 * in turn, SENTINEL get-master-addr-by-name, the first that answers moves to the front; the
 * node then connects to that address and checks with ROLE that it is the primary (node.c).
 * Asked again at every reconnect, so a call that lost its connection to a primary that failed
 * over (Sentinel closes clients' connections when it reconfigures a server) finds the new one
 * within its retry window. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "topo/topo.h"

/* One request on a connection of our own. */
static int sentinel_request(redsem__conn *c, const redsem__args *a, int64_t deadline_ns,
                            redisReply **ret, char *err, size_t errlen)
{
    char *cmd = NULL;
    int len = redsem__args_format(a, &cmd);
    if (len < 0) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    int err_no = 0;
    int io = redsem__conn_write(c, cmd, (size_t)len, deadline_ns, &err_no);
    redisFreeCommand(cmd);
    if (io == REDSEM__IO_OK)
        io = redsem__conn_read(c, ret, deadline_ns, &err_no, err, errlen);
    return redsem__io_status(io, err_no, err, errlen);
}

/* Ask one Sentinel. On REDSEM_OK, *host (new string) and *port. */
static int ask(redsem__topo *t, redsem__node *n, const redsem__hostport *s, int64_t deadline_ns,
               char **host, int *port, char *err, size_t errlen)
{
    const redsem__endpoint *se = &t->given;
    redsem__endpoint ep = {.kind = REDSEM__EP_TCP, .host = s->host, .port = s->port};
    redsem__conn conn;
    redsem__conn_init(&conn);
    redsem__conn_tls tls = {n->tls_ctx, NULL}; /* verified against the Sentinel's own host */
    bool retryable;
    int rc = redsem__conn_open(&conn, &ep, &tls, deadline_ns, n->command_timeout_ms,
                               &retryable, err, errlen);
    if (rc != REDSEM_OK)
        return rc;
    redsem__args a;
    redisReply *r = NULL;
    if (se->sentinel_password != NULL) {
        redsem__args_init(&a);
        redsem__args_str(&a, "AUTH");
        if (se->sentinel_user != NULL)
            redsem__args_str(&a, se->sentinel_user);
        redsem__args_str(&a, se->sentinel_password);
        rc = sentinel_request(&conn, &a, deadline_ns, &r, err, errlen);
        if (rc == REDSEM_OK && r->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "AUTH: %.200s", r->str);
            rc = REDSEM_EPERM;
        }
        if (r != NULL)
            freeReplyObject(r);
        r = NULL;
    }
    if (rc == REDSEM_OK) {
        redsem__args_init(&a);
        redsem__args_str(&a, "SENTINEL");
        redsem__args_str(&a, "get-master-addr-by-name");
        redsem__args_str(&a, se->master);
        rc = sentinel_request(&conn, &a, deadline_ns, &r, err, errlen);
    }
    if (rc == REDSEM_OK) {
        long p = 0;
        if (r->type == REDIS_REPLY_NIL) {
            snprintf(err, errlen, "knows no primary named '%s'", se->master);
            rc = REDSEM_ECONN;
        } else if (r->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "%.200s", r->str);
            rc = strncmp(r->str, "NOAUTH", 6) == 0 || strncmp(r->str, "NOPERM", 6) == 0 ||
                         strncmp(r->str, "WRONGPASS", 9) == 0
                     ? REDSEM_EPERM
                     : REDSEM_ECONN;
        } else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                   r->element[0]->type != REDIS_REPLY_STRING ||
                   r->element[1]->type != REDIS_REPLY_STRING || r->element[0]->len == 0 ||
                   r->element[0]->len > 253 || (p = strtol(r->element[1]->str, NULL, 10)) < 1 ||
                   p > 65535) {
            snprintf(err, errlen, "unexpected reply to SENTINEL get-master-addr-by-name");
            rc = REDSEM_EPROTO;
        } else if ((*host = redsem__strdup(r->element[0]->str)) == NULL) {
            rc = REDSEM_ENOMEM;
        } else {
            *port = (int)p;
        }
    }
    if (r != NULL)
        freeReplyObject(r);
    redsem__conn_close(&conn);
    return rc;
}

int redsem__sentinel_resolve(void *topo, redsem__node *n, int64_t deadline_ns, char *err,
                             size_t errlen)
{
    redsem__topo *t = topo;
    size_t count = t->given.nhosts;
    size_t used = 0;
    int worst = REDSEM_ECONN;
    err[0] = '\0';
    for (size_t k = 0; k < count; k++) {
        size_t i = (t->first + k) % count;
        const redsem__hostport *s = &t->given.hosts[i];
        /* each Sentinel gets a fair share of what is left, so that one that hangs does not
         * use up the time the others need */
        int64_t now = redsem__now_ns();
        if (now >= deadline_ns)
            break;
        int64_t share = (deadline_ns - now) / (int64_t)(count - k);
        int64_t dl = deadline_ns == REDSEM__FOREVER || share < 100 * REDSEM__NS_PER_MS
                         ? deadline_ns
                         : now + share;
        char why[256] = "";
        char *host = NULL;
        int port = 0;
        int rc = ask(t, n, s, dl, &host, &port, why, sizeof why);
        if (rc == REDSEM_OK) {
            redsem__free(n->ep.host);
            n->ep.host = host;
            n->ep.port = port;
            t->first = i;
            return REDSEM_OK;
        }
        if (rc == REDSEM_ENOMEM) {
            snprintf(err, errlen, "out of memory");
            return rc;
        }
        if (rc == REDSEM_EPERM)
            worst = rc;
        int w = snprintf(err + used, used < errlen ? errlen - used : 0, "%sSentinel %s:%d: %s",
                         used ? "; " : "", s->host, s->port, why);
        if (w > 0)
            used += (size_t)w;
    }
    if (used == 0)
        snprintf(err, errlen, "no Sentinel could be asked before the deadline");
    /* err is "Sentinel h:p: why; ..." */
    char tail[64];
    snprintf(tail, sizeof tail, " (primary '%s')", t->given.master);
    size_t l = strlen(err);
    if (l + strlen(tail) < errlen)
        memcpy(err + l, tail, strlen(tail) + 1);
    return worst;
}
