/* redsem - automatic renewal (placeholder until the renewer lands). */
#include <string.h>

#include "internal.h"

void redsem__renewer_stop(redsem_client *c)
{
    (void)c;
}

void redsem__renewal_detach(redsem_permit *p)
{
    p->renewal = NULL;
}

/* TODO(issue 4): the renewer thread. Stubs so that callers compile meanwhile. */
int redsem_permit_auto_renew(redsem_permit *p, int64_t interval_ms, redsem_lost_fn on_lost,
                             void *user_data)
{
    (void)p;
    (void)interval_ms;
    (void)on_lost;
    (void)user_data;
    return REDSEM_ESTATE;
}

int redsem_permit_stop_renewal(redsem_permit *p)
{
    return p ? REDSEM_OK : REDSEM_EINVAL;
}

int redsem_client_renew_stats(redsem_client *c, redsem_renew_stats *st)
{
    if (c == NULL || st == NULL)
        return REDSEM_EINVAL;
    memset(st, 0, sizeof *st);
    return REDSEM_OK;
}

int redsem_lock_set_reentrant(redsem_lock *l, bool on)
{
    if (l == NULL)
        return REDSEM_EINVAL;
    l->reentrant = on;
    return REDSEM_OK;
}
