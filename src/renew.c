/* redsem - automatic renewal (placeholder until the renewer lands). */
#include "internal.h"

void redsem__renewer_stop(redsem_client *c)
{
    (void)c;
}

void redsem__renewal_detach(redsem_permit *p)
{
    p->renewal = NULL;
}
