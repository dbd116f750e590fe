/* redsem - the node's script cache: every script's SHA1 is known at build time; SCRIPT LOAD
 * pipelined before the EVALSHA on first use, EVALSHA alone after, the pair again after
 * NOSCRIPT. */
#include <string.h>

#include <hiredis/hiredis.h>

#include "node/node.h"

#define REDSEM__NOSCRIPT_RETRIES 5

static bool error_starts(const redisReply *r, const char *word)
{
    return r->type == REDIS_REPLY_ERROR && r->str != NULL &&
           strncmp(r->str, word, strlen(word)) == 0;
}

void redsem__script_args(const redsem__script_def *d, bool body, bool load, int nkeys,
                         const redsem__args *ka, redsem__args *a, redsem__args *la)
{
    redsem__args_init(a);
    redsem__args_init(la);
    if (load) {
        redsem__args_str(la, "SCRIPT");
        redsem__args_str(la, "LOAD");
        redsem__args_mem(la, d->text, d->len);
    }
    if (body && !load) {
        redsem__args_str(a, "EVAL");
        redsem__args_mem(a, d->text, d->len);
    } else {
        redsem__args_str(a, "EVALSHA");
        redsem__args_mem(a, d->sha, 40);
    }
    redsem__args_i64(a, nkeys);
    for (int i = 0; i < ka->n; i++)
        redsem__args_mem(a, ka->v[i], ka->len[i]);
}

int redsem__node_wait_acked(redsem__node *n, const redisReply *w)
{
    /* The script ran whatever WAIT says: a refused or odd WAIT counts as no replica (the
     * caller then gives a grant back), with the reason in errmsg. */
    long long acked = 0;
    if (w->type == REDIS_REPLY_ERROR)
        (void)redsem__node_error_reply(n, w, "WAIT");
    else if (!redsem__reply_int(w, &acked) || acked < 0) {
        acked = 0;
        (void)redsem__ctx_err(n->ctx, REDSEM_EPROTO, "WAIT: unexpected reply");
    }
    return (int)(acked > INT32_MAX ? INT32_MAX : acked);
}

/* Every script's SHA1 is known at build time (tools/embed-lua.c). A script this client has
 * not run yet on a server goes out as SCRIPT LOAD with its body followed by its EVALSHA, in
 * one write: one round trip, whose replies are SCRIPT LOAD's (the SHA1) then EVALSHA's. After
 * that, EVALSHA alone. SCRIPT LOAD rather than EVAL with the body: Valkey 8 and Redis 7.4
 * keep at most 500 scripts that came by EVAL, evicting the least recently used, and never
 * evict one loaded by SCRIPT LOAD (nor one sent by EVAL and loaded since), so another
 * application that EVALs many distinct scripts on the same server cannot push redsem's
 * out. A NOSCRIPT reply (SCRIPT FLUSH, a restart, a failover to a server that never saw it)
 * is answered the same way: one more round trip only when the server really lost the script.
 * NOSCRIPT means the script did not run, so sending it again is safe whatever the call. A
 * server that refuses SCRIPT LOAD (an ACL without script|load, a renamed command) gets the
 * body by EVAL from then on (the script cache's eval_body) */
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
    bool resend_body = false; /* after a NOSCRIPT: the body, whatever another lane marked */
    for (int attempt = 0;; attempt++) {
        bool body = resend_body || !atomic_load(&n->scripts->sent[script]);
        /* load: SCRIPT LOAD before the EVALSHA; else the body by EVAL (SCRIPT LOAD refused) */
        bool load = body && !atomic_load(&n->scripts->eval_body);
        redsem__args a, la;
        redsem__script_args(d, body, load, nkeys, ka, &a, &la);
        redisReply *r = NULL, *w = NULL, *lr = NULL;
        /* WAIT N timeout after a write that must reach the replicas: in the same write, so
         * in the same round trip; the reply says how many acknowledged (replication is
         * asynchronous: this is how long the caller waits for it, not a guarantee) */
        bool sync = (flags & REDSEM__REQ_SYNC) && n->sync_replicas > 0;
        redsem__args wa;
        redsem__args_init(&wa);
        redsem__args_str(&wa, "WAIT");
        redsem__args_i64(&wa, n->sync_replicas);
        redsem__args_i64(&wa, n->sync_timeout_ms);
        int rc = redsem__node_request3(n, load ? &la : NULL, &a, sync ? &wa : NULL, flags, 0,
                                       load ? &lr : NULL, &r, sync ? &w : NULL, info);
        if (rc == REDSEM_OK && sync) {
            int acked = redsem__node_wait_acked(n, w);
            freeReplyObject(w);
            if (info != NULL)
                info->replicas_acked = acked;
        }
        if (info != NULL) {
            maybe_applied = maybe_applied || info->maybe_applied;
            info->maybe_applied = maybe_applied;
        }
        if (rc != REDSEM_OK)
            return rc;
        if (body)
            REDSEM__COUNT(n->ctx, script_loads, 1);
        /* SCRIPT LOAD answered the SHA1: the server holds the script, whatever the EVALSHA
         * after it met (a redirection, an error from inside the script). Refused (not a
         * compile error, which only a broken build makes): send bodies by EVAL from now on. */
        bool refused = false;
        if (lr != NULL) {
            if (lr->type == REDIS_REPLY_STRING)
                atomic_store(&n->scripts->sent[script], true);
            else if (lr->type == REDIS_REPLY_ERROR && !error_starts(lr, "ERR Error compiling"))
                refused = true;
            freeReplyObject(lr);
        }
        /* Each NOSCRIPT gets one retry with the body; a server whose cache is flushed again
         * between the two (SCRIPT FLUSH in a loop) gets a few more, then the error. */
        if (!(body && !load) && error_starts(r, "NOSCRIPT") &&
            attempt < REDSEM__NOSCRIPT_RETRIES) {
            freeReplyObject(r);
            if (refused)
                atomic_store(&n->scripts->eval_body, true); /* not a lost script */
            else
                REDSEM__COUNT(n->ctx, noscript, 1);
            atomic_store(&n->scripts->sent[script], false);
            resend_body = true;
            continue;
        }
        /* The server has compiled and cached the script (an error reply from inside the
         * script leaves it cached too); a compile error could only come from a broken build
         * and is reported below each time. */
        if (r->type != REDIS_REPLY_ERROR ||
            (!error_starts(r, "ERR Error compiling") && !error_starts(r, "NOSCRIPT") &&
             !redsem__redirect_reply(r)))
            atomic_store(&n->scripts->sent[script], true); /* (a redirection ran nothing) */
        if (r->type == REDIS_REPLY_ERROR) {
            rc = redsem__node_error_reply(n, r, d->name);
            freeReplyObject(r);
            return rc;
        }
        *ret_reply = r;
        return REDSEM_OK;
    }
}
