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
