/* redsem - the client handle: its lifecycle, its errors, key names, and the calls of the
 * object layer (semaphores, locks, permits) routed to the node that serves their key. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "internal.h"

/* ================================================================ errors */

int redsem__set_err(redsem_client *c, int code, const char *fmt, ...)
{
    if (c != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->ctx.errmsg, sizeof c->ctx.errmsg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void redsem__clear_err(redsem_client *c)
{
    c->ctx.errmsg[0] = '\0';
}

const char *redsem_client_errmsg(const redsem_client *c)
{
    return c ? c->ctx.errmsg : "";
}

int redsem__check_owner(redsem_client *c)
{
    redsem__clear_err(c);
    if (c->pid != getpid())
        return redsem__set_err(c, REDSEM_EFORKED,
                               "this client was created by process %ld; it cannot be used "
                               "in process %ld (after fork)",
                               (long)c->pid, (long)getpid());
    return REDSEM_OK;
}

int redsem__reply_status(redsem_client *c, const redisReply *r, const char *what,
                         long long *status)
{
    if (!redsem__reply_status_of(r, status))
        return redsem__set_err(c, REDSEM_EPROTO, "%s: unexpected reply", what);
    return REDSEM_OK;
}

int redsem__refresh_synced(redsem_client *c, const redsem__req_info *info)
{
    if (c->sync_replicas == 0 || info->replicas_acked >= c->sync_replicas)
        return REDSEM_OK;
    return redsem__set_err(c, REDSEM_EREPLICA,
                           "refreshed, but %d of the %d replicas required acknowledged it "
                           "within %lld ms: the validity deadline was not moved",
                           info->replicas_acked < 0 ? 0 : info->replicas_acked, c->sync_replicas,
                           (long long)c->sync_timeout_ms);
}

/* ================================================================ routed calls */

static redsem__node *node_for(redsem_client *c, const char *key, size_t len)
{
    return redsem__topo_node(&c->topo, key, len);
}

int redsem__request(redsem_client *c, const redsem__args *a, int flags, int64_t deadline_ns,
                    redisReply **ret_reply, redsem__req_info *info)
{
    /* the calls sent this way (PING) name no key */
    return redsem__node_request(node_for(c, NULL, 0), a, flags, deadline_ns, ret_reply, info);
}

int redsem__eval(redsem_client *c, int script, int nkeys, const redsem__args *ka, int flags,
                 redsem__req_info *info, redisReply **ret_reply)
{
    /* every key of one call shares a hash tag: the first one routes it */
    redsem__node *n = nkeys > 0 ? node_for(c, ka->v[0], ka->len[0]) : node_for(c, NULL, 0);
    return redsem__node_eval(n, script, nkeys, ka, flags, info, ret_reply);
}

int redsem__blpop(redsem_client *c, const char *key, size_t keylen, int64_t wait_ms,
                  int64_t hard_deadline_ns, bool *signaled)
{
    return redsem__node_blpop(node_for(c, key, keylen), key, keylen, wait_ms, hard_deadline_ns,
                              signaled);
}

int64_t redsem__not_after_us(redsem_client *c, const char *key)
{
    return redsem__node_not_after_us(node_for(c, key, strlen(key)));
}

void redsem__note_server_clock(redsem_client *c, const char *key, int64_t server_us,
                               int64_t recv_ns)
{
    redsem__node_note_server_clock(node_for(c, key, strlen(key)), server_us, recv_ns);
}

/* ================================================================ client */

char *redsem__key(const redsem_client *c, const char *name, const char *suffix)
{
    size_t nl = strlen(name), sl = strlen(suffix);
    size_t len = c->prefix_len + nl + sl + 2;
    char *k = redsem__malloc(len + 1);
    if (k == NULL)
        return NULL;
    char *p = k;
    memcpy(p, c->prefix, c->prefix_len);
    p += c->prefix_len;
    *p++ = '{';
    memcpy(p, name, nl);
    p += nl;
    *p++ = '}';
    memcpy(p, suffix, sl);
    p[sl] = '\0';
    return k;
}

int redsem__client_open(const redsem_options *o, redsem_client **ret, char *err, size_t errlen)
{
    if (sodium_init() < 0) {
        snprintf(err, errlen, "libsodium failed to initialise");
        return REDSEM_ENOMEM;
    }
    redsem_client *c = redsem__calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    c->pid = getpid();
    c->connect_timeout_ms = o->connect_timeout_ms;
    c->command_timeout_ms = o->command_timeout_ms;
    c->retry_ms = o->retry_ms;
    c->prefix = redsem__strdup(o->prefix);
    if (c->prefix == NULL || redsem__endpoint_copy(&c->ep, &o->ep) != REDSEM_OK ||
        redsem__tls_opts_copy(&c->tls, &o->tls) != REDSEM_OK) {
        redsem_client_free(c);
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    c->prefix_len = strlen(c->prefix);
    if (o->sync_replicas > 0 && o->sync_timeout_ms >= o->command_timeout_ms) {
        snprintf(err, errlen, "the replica sync timeout (%lld ms) must be shorter than the "
                 "command timeout (%lld ms)", (long long)o->sync_timeout_ms,
                 (long long)o->command_timeout_ms);
        redsem_client_free(c);
        return REDSEM_EINVAL;
    }
    c->sync_replicas = o->sync_replicas;
    c->sync_timeout_ms = o->sync_timeout_ms;
    redsem__node_cfg cfg = {c->connect_timeout_ms, c->command_timeout_ms, c->retry_ms, &c->tls,
                            c->sync_replicas, c->sync_timeout_ms};
    int rc = redsem__topo_init(&c->topo, &c->ctx, &c->ep, &cfg, err, errlen);
    if (rc == REDSEM_OK)
        rc = redsem__topo_connect(&c->topo, err, errlen);
    if (rc != REDSEM_OK) {
        redsem_client_free(c);
        return rc;
    }
    *ret = c;
    return REDSEM_OK;
}

int redsem_client_new_verbose(const redsem_options *options, redsem_client **ret_client,
                              char *errbuf, size_t errbuf_len)
{
    char err[512] = "";
    if (ret_client == NULL) {
        if (errbuf && errbuf_len)
            snprintf(errbuf, errbuf_len, "ret_client is NULL");
        return REDSEM_EINVAL;
    }
    redsem_options *defaults = NULL;
    if (options == NULL) {
        int rc = redsem_options_new(&defaults);
        if (rc != REDSEM_OK)
            return rc;
        options = defaults;
    }
    int rc = redsem__client_open(options, ret_client, err, sizeof err);
    redsem_options_free(defaults);
    if (rc != REDSEM_OK && errbuf && errbuf_len)
        snprintf(errbuf, errbuf_len, "%s", err);
    return rc;
}

int redsem_client_new(const redsem_options *options, redsem_client **ret_client)
{
    return redsem_client_new_verbose(options, ret_client, NULL, 0);
}

int redsem_client_connect(const char *url, redsem_client **ret_client)
{
    if (ret_client == NULL)
        return REDSEM_EINVAL;
    redsem_options *o = NULL;
    int rc = redsem_options_new(&o);
    if (rc == REDSEM_OK && url != NULL)
        rc = redsem_options_set_url(o, url);
    if (rc == REDSEM_OK)
        rc = redsem_client_new(o, ret_client);
    redsem_options_free(o);
    return rc;
}

int redsem__client_options(const redsem_client *c, redsem_options **ret)
{
    redsem_options *o = redsem__calloc(1, sizeof *o);
    if (o == NULL)
        return REDSEM_ENOMEM;
    o->connect_timeout_ms = c->connect_timeout_ms;
    o->command_timeout_ms = c->command_timeout_ms;
    o->retry_ms = c->retry_ms;
    o->sync_replicas = c->sync_replicas;
    o->sync_timeout_ms = c->sync_timeout_ms;
    o->prefix = redsem__strdup(c->prefix);
    if (o->prefix == NULL || redsem__endpoint_copy(&o->ep, &c->ep) != REDSEM_OK ||
        redsem__tls_opts_copy(&o->tls, &c->tls) != REDSEM_OK) {
        redsem_options_free(o);
        return REDSEM_ENOMEM;
    }
    *ret = o;
    return REDSEM_OK;
}

void redsem_client_free(redsem_client *c)
{
    if (c == NULL)
        return;
    if (c->renewer != NULL)
        c->renew_ops->stop(c);
    redsem__topo_close(&c->topo);
    redsem__endpoint_clear(&c->ep);
    redsem__tls_opts_clear(&c->tls);
    redsem__free(c->prefix);
    redsem__free(c);
}

int redsem_client_ping(redsem_client *c)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, "PING");
    redisReply *r = NULL;
    rc = redsem__request(c, &a, REDSEM__REQ_RETRY, 0, &r, NULL);
    if (rc != REDSEM_OK)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        rc = redsem__node_error_reply(node_for(c, NULL, 0), r, "PING");
    else if (r->type != REDIS_REPLY_STATUS)
        rc = redsem__set_err(c, REDSEM_EPROTO, "PING: unexpected reply");
    freeReplyObject(r);
    return rc;
}

int redsem_client_get_stats(const redsem_client *c, redsem_client_stats *ret_stats)
{
    if (c == NULL || ret_stats == NULL)
        return REDSEM_EINVAL;
    *ret_stats = c->ctx.stats;
    return REDSEM_OK;
}
