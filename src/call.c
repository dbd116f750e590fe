/* redsem - script calls as requests: an operation builds a call and takes its outcome in
 * functions of its own; this is the driver that runs one on the calling thread. */
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

int redsem__call_run(redsem_client *c, redsem__call *call, redsem__req_info *info,
                     redisReply **ret_reply)
{
    if (call->cap_ns != 0)
        redsem__call_cap_set(c, call->cap_ns);
    int rc = redsem__eval(c, call->script, call->nkeys, &call->ka, call->flags, info, ret_reply);
    if (rc == REDSEM_OK && call->wake_prefix != NULL)
        (void)redsem__wake_push(c, call->wake_prefix, ret_reply);
    if (call->cap_ns != 0)
        redsem__call_cap_set(c, 0);
    return rc;
}

void redsem__call_keys(redsem__call *call, int n, const char *const keys[])
{
    for (int i = 0; i < n; i++)
        redsem__args_str(&call->ka, keys[i]);
    call->nkeys = call->ka.n;
}
