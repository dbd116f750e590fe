/* redsem - the node's script cache: every script's SHA1 is known at build time; EVAL with the
 * body on first use, EVALSHA after, EVAL again after NOSCRIPT. */
#include <string.h>

#include <hiredis/hiredis.h>

#include "node/node.h"

#define REDSEM__NOSCRIPT_RETRIES 5

/* Every script's SHA1 is known at build time (tools/embed-lua.c). A script this client has
 * not run yet goes out as EVAL with its body, which runs it and caches it on the server in
 * the same round trip; after that, EVALSHA. A NOSCRIPT reply (SCRIPT FLUSH, a restart, a
 * failover to a server that never saw it) is answered with EVAL of the body: one more round
 * trip only when the server really lost the script, never a SCRIPT LOAD. NOSCRIPT means the
 * script did not run, so sending it again is safe whatever the call. */
int redsem__node_eval(redsem__node *n, int script, int nkeys, const redsem__args *ka, int flags,
                 redsem__req_info *info, redisReply **ret_reply)
{
    const redsem__script_def *d = &redsem__script_defs[script];
    /* A copy sent before a NOSCRIPT retry may have been applied: a reply lost with the
     * connection, then a restarted server (whose script cache is empty) answering the resent
     * copy NOSCRIPT. Each request starts its own req_info; keep what the earlier copies may
     * have done, or a release re-sent after a restart would call its own first copy's work
     * "not held" (REDSEM_ELOST). */
    bool maybe_applied = false;
    for (int attempt = 0;; attempt++) {
        bool body = !n->script_sent[script];
        redsem__args a;
        redsem__args_init(&a);
        if (body) {
            redsem__args_str(&a, "EVAL");
            redsem__args_mem(&a, d->text, d->len);
        } else {
            redsem__args_str(&a, "EVALSHA");
            redsem__args_mem(&a, d->sha, 40);
        }
        redsem__args_i64(&a, nkeys);
        for (int i = 0; i < ka->n; i++)
            redsem__args_mem(&a, ka->v[i], ka->len[i]);
        redisReply *r = NULL, *w = NULL;
        /* WAIT N timeout after a write that must reach the replicas: in the same write, so
         * in the same round trip; the reply says how many acknowledged (replication is
         * asynchronous: this is how long the caller waits for it, not a guarantee) */
        bool sync = (flags & REDSEM__REQ_SYNC) && n->sync_replicas > 0;
        redsem__args wa;
        redsem__args_init(&wa);
        redsem__args_str(&wa, "WAIT");
        redsem__args_i64(&wa, n->sync_replicas);
        redsem__args_i64(&wa, n->sync_timeout_ms);
        int rc = redsem__node_request2(n, &a, sync ? &wa : NULL, flags, 0, &r, sync ? &w : NULL,
                                       info);
        if (rc == REDSEM_OK && sync) {
            /* The script ran whatever WAIT says: a refused or odd WAIT counts as no replica
             * (the caller then gives a grant back), with the reason in errmsg. */
            long long acked = 0;
            if (w->type == REDIS_REPLY_ERROR)
                (void)redsem__node_error_reply(n, w, "WAIT");
            else if (!redsem__reply_int(w, &acked) || acked < 0) {
                acked = 0;
                (void)redsem__ctx_err(n->ctx, REDSEM_EPROTO, "WAIT: unexpected reply");
            }
            freeReplyObject(w);
            if (info != NULL)
                info->replicas_acked = (int)(acked > INT32_MAX ? INT32_MAX : acked);
        }
        if (info != NULL) {
            maybe_applied = maybe_applied || info->maybe_applied;
            info->maybe_applied = maybe_applied;
        }
        if (rc != REDSEM_OK)
            return rc;
        if (body)
            n->ctx->stats.script_loads++;
        /* Each NOSCRIPT gets one retry with the body; a server whose cache is flushed again
         * between the two (SCRIPT FLUSH in a loop) gets a few more, then the error. */
        if (!body && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0 &&
            attempt < REDSEM__NOSCRIPT_RETRIES) {
            freeReplyObject(r);
            n->ctx->stats.noscript++;
            n->script_sent[script] = false;
            continue;
        }
        /* The server has compiled and cached the script (an error reply from inside the
         * script leaves it cached too); a compile error could only come from a broken build
         * and is reported below each time. */
        if (r->type != REDIS_REPLY_ERROR || strncmp(r->str, "ERR Error compiling", 19) != 0)
            n->script_sent[script] = true;
        if (r->type == REDIS_REPLY_ERROR) {
            rc = redsem__node_error_reply(n, r, d->name);
            freeReplyObject(r);
            return rc;
        }
        *ret_reply = r;
        return REDSEM_OK;
    }
}
