/* redsem - the client handle: its lifecycle, its checks, key names, PING and counters. On top
 * of the object layer's machinery that it sets up and frees: the pool of lanes and the
 * routed calls (pool.c), the shared connection (drive_threads.c) and the shared wait
 * (wake.c). */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "internal.h"

/* ================================================================ checks */

static atomic_uint_fast64_t client_serials;

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
    c->serial = atomic_fetch_add(&client_serials, 1) + 1;
    redsem__clock_init(&c->clock);
    for (int i = 0; i < REDSEM__SCRIPT_COUNT; i++)
        atomic_init(&c->scripts.sent[i], false);
    atomic_init(&c->scripts.eval_body, false);
    pthread_mutex_init(&c->pool_mu, NULL);
    pthread_mutex_init(&c->renew_mu, NULL);
    pthread_mutex_init(&c->wake_mu, NULL);
    pthread_mutex_init(&c->drive.mu, NULL);
    pthread_cond_init(&c->drive.lane_cv, NULL);
    c->drive_on = o->ep.kind != REDSEM__EP_CLUSTER;
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
    if ((c->ep.kind == REDSEM__EP_SENTINEL &&
         (c->sentinel_watch = redsem__sentinel_watch_new()) == NULL) ||
        redsem__wake_init(c) != REDSEM_OK ||
        redsem__metrics_init(c, o->metrics_names_max, o->metrics_off) != REDSEM_OK) {
        redsem_client_free(c);
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    if (o->sync_replicas > 0 && o->sync_timeout_ms >= o->command_timeout_ms) {
        snprintf(err, errlen, "the replica sync timeout (%lld ms) must be shorter than the "
                 "command timeout (%lld ms)", (long long)o->sync_timeout_ms,
                 (long long)o->command_timeout_ms);
        redsem_client_free(c);
        return REDSEM_EINVAL;
    }
    c->sync_replicas = o->sync_replicas;
    c->sync_timeout_ms = o->sync_timeout_ms;
    c->max_connections = o->max_connections;
    c->cfg = (redsem__node_cfg){c->connect_timeout_ms, c->command_timeout_ms, c->retry_ms,
                                &c->tls, c->sync_replicas, c->sync_timeout_ms, NULL,
                                o->allow_eviction};
    /* one TLS context for every connection of the client (its files read once, here) */
    if (c->ep.tls && (c->cfg.tls_ctx = redsem__tls_ctx_new(&c->tls, err, errlen)) == NULL) {
        redsem_client_free(c);
        return REDSEM_EINVAL;
    }
    /* the first request lane, connected now: client creation fails early and clearly */
    c->nreq = 1;
    redsem__lane *l = NULL;
    int rc = redsem__lane_new(c, false, &l);
    if (rc == REDSEM_OK)
        rc = redsem__topo_connect(&l->topo, err, errlen);
    else
        snprintf(err, errlen, "%s", redsem__errbuf(c));
    if (rc != REDSEM_OK) {
        redsem_client_free(c);
        return rc;
    }
    l->next_idle = NULL;
    c->idle_req = l;
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
        if (rc != REDSEM_OK) {
            if (errbuf && errbuf_len)
                snprintf(errbuf, errbuf_len, "out of memory");
            return rc;
        }
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

void redsem_client_free(redsem_client *c)
{
    if (c == NULL)
        return;
    if (c->renewer != NULL)
        c->renew_ops->stop(c);
    for (size_t i = 0; i < c->nlanes; i++) {
        redsem__topo_close(&c->lanes[i]->topo);
        redsem__free(c->lanes[i]);
    }
    redsem__free(c->lanes);
    redsem__free(c->stats_ctx);
    redsem__sentinel_watch_free(c->sentinel_watch); /* after the lanes that point to it */
    if (c->pid == getpid()) {
        /* in a forked child another thread of the parent may have held them: leave them */
        pthread_mutex_destroy(&c->pool_mu);
        pthread_mutex_destroy(&c->renew_mu);
        pthread_mutex_destroy(&c->wake_mu);
        pthread_mutex_destroy(&c->drive.mu);
        pthread_cond_destroy(&c->drive.lane_cv);
    }
    redsem__drive_free(&c->drive); /* (its lane was closed above) */
    redsem__wake_free(c); /* in a forked child also the parent's parked waits (memory) */
    redsem__endpoint_clear(&c->ep);
    redsem__tls_opts_clear(&c->tls);
    redsem__tls_ctx_free(c->cfg.tls_ctx); /* the lanes' nodes dropped theirs */
    redsem__metrics_free(c);
    redsem__free(c->prefix);
    redsem__free(c);
}

/* PING on a borrowed lane, its error reply classified by the node that sent it. */
static int call_ping(redsem__node *n, void *arg)
{
    (void)arg;
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, "PING");
    redisReply *r = NULL;
    int rc = redsem__node_request(n, &a, REDSEM__REQ_RETRY, 0, &r, NULL);
    if (rc != REDSEM_OK)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        rc = redsem__node_error_reply(n, r, "PING");
    else if (r->type != REDIS_REPLY_STATUS)
        rc = redsem__ctx_err(n->ctx, REDSEM_EPROTO, "PING: unexpected reply");
    freeReplyObject(r);
    return rc;
}

int redsem_client_ping(redsem_client *c)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    return redsem__routed(c, false, NULL, 0, REDSEM__REQ_RETRY, NULL, call_ping, NULL);
}

/* Add the counters of s (updated by other threads: relaxed atomic loads) to sum. */
static void stats_add(redsem_client_stats *sum, const redsem_client_stats *s)
{
#define SUM(f) sum->f += __atomic_load_n(&s->f, __ATOMIC_RELAXED)
    SUM(requests);
    SUM(connects);
    SUM(script_loads);
    SUM(noscript);
    SUM(retries);
    SUM(wakeups);
    SUM(redirects);
    SUM(pipelined);
#undef SUM
}

void redsem__stats_attach(redsem_client *c, redsem__ctx *ctx)
{
    pthread_mutex_lock(&c->pool_mu);
    if (c->nstats_ctx == c->stats_ctx_cap) {
        size_t cap = c->stats_ctx_cap ? 2 * c->stats_ctx_cap : 4;
        redsem__ctx **v = redsem__realloc(c->stats_ctx, cap * sizeof *v);
        if (v != NULL) {
            c->stats_ctx = v;
            c->stats_ctx_cap = cap;
        }
    }
    if (c->nstats_ctx < c->stats_ctx_cap) /* else (no memory) not counted */
        c->stats_ctx[c->nstats_ctx++] = ctx;
    pthread_mutex_unlock(&c->pool_mu);
}

void redsem__stats_detach(redsem_client *c, redsem__ctx *ctx)
{
    pthread_mutex_lock(&c->pool_mu);
    for (size_t i = 0; i < c->nstats_ctx; i++)
        if (c->stats_ctx[i] == ctx) {
            stats_add(&c->stats_gone, &ctx->stats);
            c->stats_ctx[i] = c->stats_ctx[--c->nstats_ctx];
            break;
        }
    pthread_mutex_unlock(&c->pool_mu);
}

int redsem_client_get_stats(const redsem_client *c, redsem_client_stats *ret_stats)
{
    if (c == NULL || ret_stats == NULL)
        return REDSEM_EINVAL;
    memset(ret_stats, 0, sizeof *ret_stats);
    redsem_client *m = (redsem_client *)c; /* the pool's lock only */
    pthread_mutex_lock(&m->pool_mu);
    for (size_t i = 0; i < c->nlanes; i++)
        stats_add(ret_stats, &c->lanes[i]->ctx.stats);
    for (size_t i = 0; i < c->nstats_ctx; i++)
        stats_add(ret_stats, &c->stats_ctx[i]->stats);
    stats_add(ret_stats, &c->stats_gone);
    ret_stats->pool_waits = c->pool_waits;
    ret_stats->direct_grants = __atomic_load_n(&c->direct_grants, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&m->pool_mu);
    return REDSEM_OK;
}
