/* redsem - metrics (metrics.h): first stubs, filled in next. */
#include "internal.h"

int redsem_metrics_write(const redsem_client *c, char *buf, size_t len, size_t *needed)
{
    (void)needed;
    if (c == NULL || (buf == NULL && len > 0))
        return REDSEM_EINVAL;
    return REDSEM_ESTATE;
}

int redsem_metrics_visit(const redsem_client *c, redsem_metric_visitor fn, void *arg)
{
    (void)arg;
    if (c == NULL || fn == NULL)
        return REDSEM_EINVAL;
    return REDSEM_ESTATE;
}

int redsem_metrics_write_server(redsem_client *c, const char *const *names, size_t n, char *buf,
                                size_t len, size_t *needed)
{
    (void)needed;
    if (c == NULL || (names == NULL && n > 0) || (buf == NULL && len > 0))
        return REDSEM_EINVAL;
    return REDSEM_ESTATE;
}

int redsem_scan_names(redsem_client *c, const char *pattern, size_t max, char ***ret_names,
                      size_t *ret_n, bool *capped)
{
    (void)max;
    (void)capped;
    if (c == NULL || pattern == NULL || ret_names == NULL || ret_n == NULL)
        return REDSEM_EINVAL;
    return REDSEM_ESTATE;
}

void redsem_names_free(char **names, size_t n)
{
    if (names == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        redsem__free(names[i]);
    redsem__free(names);
}
