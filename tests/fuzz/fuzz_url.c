/* libFuzzer target: the connection URL parser (redsem__url_parse, and through the public
 * redsem_options_set_url): redis://, rediss://, unix://, redis+sentinel://,
 * rediss+sentinel://, redis+cluster:// and rediss+cluster://. Any input must be accepted with a well-formed endpoint or refused
 * with REDSEM_EINVAL; never a crash, a leak or an out-of-bounds access (ASan+UBSan).
 *   fuzz-url [-max_total_time=60] CORPUS_DIR SEED_DIR */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const redsem__endpoint *ep)
{
    if (ep->kind == REDSEM__EP_TCP) {
        if (ep->host == NULL || ep->host[0] == '\0' || strlen(ep->host) > 253 || ep->port < 1 ||
            ep->port > 65535 || ep->path != NULL)
            abort();
    } else if (ep->kind == REDSEM__EP_UNIX) {
        if (ep->path == NULL || ep->path[0] != '/' || strlen(ep->path) < 2 ||
            strlen(ep->path) > 107 || ep->host != NULL)
            abort();
    } else if (ep->kind == REDSEM__EP_SENTINEL || ep->kind == REDSEM__EP_CLUSTER) {
        if (ep->host != NULL || ep->path != NULL || ep->nhosts < 1 ||
            ep->nhosts > REDSEM__HOSTS_MAX)
            abort();
        if (ep->kind == REDSEM__EP_SENTINEL &&
            (ep->master == NULL || ep->master[0] == '\0' || strlen(ep->master) > 255 ||
             (ep->sentinel_user != NULL && ep->sentinel_password == NULL) ||
             (ep->sentinel_password != NULL && ep->sentinel_password[0] == '\0')))
            abort();
        if (ep->kind == REDSEM__EP_CLUSTER &&
            (ep->master != NULL || ep->sentinel_user != NULL || ep->db != 0))
            abort();
        for (size_t i = 0; i < ep->nhosts; i++)
            if (ep->hosts[i].host == NULL || ep->hosts[i].host[0] == '\0' ||
                strlen(ep->hosts[i].host) > 253 || ep->hosts[i].port < 1 ||
                ep->hosts[i].port > 65535)
                abort();
    } else {
        abort();
    }
    if (ep->db < 0 || ep->db > 2147483647)
        abort();
    if (ep->password != NULL && ep->password[0] == '\0')
        abort();
    if (ep->user != NULL && ep->password == NULL)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *url = malloc(size + 1);
    if (url == NULL)
        return 0;
    memcpy(url, data, size);
    url[size] = '\0';
    redsem__endpoint ep;
    char err[256];
    int rc = redsem__url_parse(url, &ep, err, sizeof err);
    if (rc == REDSEM_OK) {
        check(&ep);
        redsem__endpoint copy;
        if (redsem__endpoint_copy(&copy, &ep) == REDSEM_OK) {
            check(&copy);
            if (copy.kind != ep.kind || copy.port != ep.port || copy.db != ep.db ||
                copy.tls != ep.tls || copy.nhosts != ep.nhosts)
                abort();
            redsem__endpoint_clear(&copy);
        }
        redsem__endpoint_clear(&ep);
    } else if (rc != REDSEM_EINVAL && rc != REDSEM_ENOMEM) {
        abort();
    } else if (strncmp(err, "invalid URL: ", 13) != 0) {
        abort(); /* every refusal says why */
    }
    redsem_options *o = NULL;
    if (redsem_options_new(&o) == REDSEM_OK) {
        if (redsem_options_set_url(o, url) != rc)
            abort();
        redsem_options_free(o);
    }
    free(url);
    return 0;
}
