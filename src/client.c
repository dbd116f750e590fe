/* redsem - the client handle: its creation (the engine's first connection opened at once)
 * and freeing, and PING. On top of the blocking driver that it sets up and frees
 * (drive_sync.c: the client's engine, drive_loop.c). */
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "internal.h"

static atomic_uint_fast64_t client_serials;

/* Open a client (redsem_client_new and redsem_client_new_verbose). */
static int client_open(const redsem_options *o, redsem_client **ret, char *err, size_t errlen)
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
    pthread_mutex_init(&c->stats_mu, NULL);
    pthread_mutex_init(&c->renew_mu, NULL);
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
        redsem__wake_init(c) != REDSEM_OK || redsem__sync_new(c) != REDSEM_OK ||
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
    /* the engine's request connection opened now: creation fails early and clearly */
    int rc = redsem__sync_open(c);
    if (rc != REDSEM_OK) {
        snprintf(err, errlen, "%s", redsem__errbuf(c));
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
        if (rc != REDSEM_OK) {
            if (errbuf && errbuf_len)
                snprintf(errbuf, errbuf_len, "out of memory");
            return rc;
        }
        options = defaults;
    }
    int rc = client_open(options, ret_client, err, sizeof err);
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
    redsem__sync_free(c); /* its engine, whose nodes point to the watch */
    redsem__free(c->stats_ctx);
    redsem__sentinel_watch_free(c->sentinel_watch);
    if (c->pid == getpid()) {
        /* in a forked child another thread of the parent may have held them: leave them */
        pthread_mutex_destroy(&c->stats_mu);
        pthread_mutex_destroy(&c->renew_mu);
    }
    redsem__wake_free(c);
    redsem__endpoint_clear(&c->ep);
    redsem__tls_opts_clear(&c->tls);
    redsem__tls_ctx_free(c->cfg.tls_ctx); /* the engines' nodes dropped theirs */
    redsem__metrics_free(c);
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
    return redsem__sync_ping(c, REDSEM__REQ_RETRY);
}

