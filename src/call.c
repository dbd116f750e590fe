/* redsem - script calls as requests: an operation builds a call and takes its outcome in
 * functions of its own; a driver runs it (drive_sync.c on the calling thread, async.c on a
 * loop, both through the engine, drive_loop.c). */
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

void redsem__call_keys(redsem__call *call, int n, const char *const keys[])
{
    for (int i = 0; i < n; i++)
        redsem__args_str(&call->ka, keys[i]);
    call->nkeys = call->ka.n;
}
