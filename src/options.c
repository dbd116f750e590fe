/* redsem - client options. */
#include <string.h>

#include "internal.h"

int redsem_options_new(redsem_options **ret_options)
{
    if (ret_options == NULL)
        return REDSEM_EINVAL;
    redsem_options *o = redsem__calloc(1, sizeof *o);
    if (o == NULL)
        return REDSEM_ENOMEM;
    o->connect_timeout_ms = REDSEM_DEFAULT_CONNECT_TIMEOUT_MS;
    o->command_timeout_ms = REDSEM_DEFAULT_COMMAND_TIMEOUT_MS;
    o->retry_ms = REDSEM_DEFAULT_RETRY_MS;
    o->max_connections = REDSEM_DEFAULT_MAX_CONNECTIONS;
    o->metrics_names_max = REDSEM_METRICS_NAMES_DEFAULT;
    o->prefix = redsem__strdup(REDSEM_DEFAULT_KEY_PREFIX);
    if (o->prefix == NULL ||
        redsem__url_parse(REDSEM_DEFAULT_URL, &o->ep, NULL, 0) != REDSEM_OK) {
        redsem_options_free(o);
        return REDSEM_ENOMEM;
    }
    *ret_options = o;
    return REDSEM_OK;
}

void redsem_options_free(redsem_options *o)
{
    if (o == NULL)
        return;
    redsem__endpoint_clear(&o->ep);
    redsem__tls_opts_clear(&o->tls);
    redsem__free(o->prefix);
    redsem__free(o);
}

int redsem_options_set_url(redsem_options *o, const char *url)
{
    if (o == NULL || url == NULL)
        return REDSEM_EINVAL;
    redsem__endpoint ep;
    int rc = redsem__url_parse(url, &ep, NULL, 0);
    if (rc != REDSEM_OK)
        return rc;
    redsem__endpoint_clear(&o->ep);
    o->ep = ep;
    return REDSEM_OK;
}

static int set_ms(int64_t *field, int64_t ms, int64_t lo)
{
    if (ms < lo || ms > REDSEM_TIMEOUT_MAX_MS)
        return REDSEM_EINVAL;
    *field = ms;
    return REDSEM_OK;
}

int redsem_options_set_connect_timeout_ms(redsem_options *o, int64_t ms)
{
    return o ? set_ms(&o->connect_timeout_ms, ms, 1) : REDSEM_EINVAL;
}

int redsem_options_set_command_timeout_ms(redsem_options *o, int64_t ms)
{
    return o ? set_ms(&o->command_timeout_ms, ms, 1) : REDSEM_EINVAL;
}

int redsem_options_set_retry_ms(redsem_options *o, int64_t ms)
{
    return o ? set_ms(&o->retry_ms, ms, 0) : REDSEM_EINVAL;
}

int redsem_options_set_metrics_names_max(redsem_options *o, uint32_t max)
{
    if (o == NULL || max > REDSEM_METRICS_NAMES_MAX)
        return REDSEM_EINVAL;
    o->metrics_names_max = max;
    return REDSEM_OK;
}

int redsem_options_set_metrics(redsem_options *o, bool on)
{
    if (o == NULL)
        return REDSEM_EINVAL;
    o->metrics_off = !on;
    return REDSEM_OK;
}

int redsem_options_set_max_connections(redsem_options *o, int n)
{
    if (o == NULL || n < 1 || n > REDSEM_MAX_CONNECTIONS_MAX)
        return REDSEM_EINVAL;
    o->max_connections = n;
    return REDSEM_OK;
}

int redsem_options_set_key_prefix(redsem_options *o, const char *prefix)
{
    if (o == NULL || !redsem__valid_prefix(prefix))
        return REDSEM_EINVAL;
    char *p = redsem__strdup(prefix);
    if (p == NULL)
        return REDSEM_ENOMEM;
    redsem__free(o->prefix);
    o->prefix = p;
    return REDSEM_OK;
}

/* Replace *field with a copy of value (NULL clears it); an empty string is EINVAL. */
static int set_str(char **field, const char *value)
{
    if (value != NULL && value[0] == '\0')
        return REDSEM_EINVAL;
    char *copy = NULL;
    if (value != NULL && (copy = redsem__strdup(value)) == NULL)
        return REDSEM_ENOMEM;
    redsem__free(*field);
    *field = copy;
    return REDSEM_OK;
}

int redsem_options_set_tls_ca(redsem_options *o, const char *ca_file, const char *ca_dir)
{
    if (o == NULL || (ca_file && !*ca_file) || (ca_dir && !*ca_dir))
        return REDSEM_EINVAL;
    int rc = set_str(&o->tls.ca_file, ca_file);
    return rc == REDSEM_OK ? set_str(&o->tls.ca_dir, ca_dir) : rc;
}

int redsem_options_set_tls_cert(redsem_options *o, const char *cert_file, const char *key_file)
{
    if (o == NULL || (cert_file == NULL && key_file != NULL) || (cert_file && !*cert_file) ||
        (key_file && !*key_file))
        return REDSEM_EINVAL;
    int rc = set_str(&o->tls.cert_file, cert_file);
    return rc == REDSEM_OK ? set_str(&o->tls.key_file, key_file) : rc;
}

int redsem_options_set_tls_server_name(redsem_options *o, const char *name)
{
    if (o == NULL || (name != NULL && strnlen(name, 254) > 253))
        return REDSEM_EINVAL;
    for (const char *p = name; p && *p; p++)
        if (*p <= 0x20 || *p >= 0x7f)
            return REDSEM_EINVAL;
    return set_str(&o->tls.server_name, name);
}

int redsem_options_set_tls_insecure_skip_verify(redsem_options *o, bool skip)
{
    if (o == NULL)
        return REDSEM_EINVAL;
    o->tls.insecure = skip;
    return REDSEM_OK;
}

int redsem_options_set_allow_eviction(redsem_options *o, bool allow)
{
    if (o == NULL)
        return REDSEM_EINVAL;
    o->allow_eviction = allow;
    return REDSEM_OK;
}

int redsem_options_set_sync_replicas(redsem_options *o, int replicas, int64_t timeout_ms)
{
    if (o == NULL || replicas < 0 || replicas > 64 ||
        (replicas > 0 && (timeout_ms < 1 || timeout_ms > REDSEM_TIMEOUT_MAX_MS)))
        return REDSEM_EINVAL;
    o->sync_replicas = replicas;
    o->sync_timeout_ms = replicas > 0 ? timeout_ms : 0;
    return REDSEM_OK;
}
