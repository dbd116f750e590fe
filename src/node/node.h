/* redsem - the node layer: one Redis server as seen by one client. Its connection (with the
 * handshake: AUTH, SELECT, TIME), requests with reconnect and idempotent retry, the server's
 * clock offset, the script cache (EVAL on first use, EVALSHA after, NOSCRIPT) and BLPOP.
 * Below the topology; knows nothing of semaphores, locks or permits. Not API. */
#ifndef REDSEM_NODE_H
#define REDSEM_NODE_H

#include "lua_scripts.h"
#include "net/net.h"
#include "proto/resp.h"

/* How a client reaches its servers: the same for every node it connects. */
typedef struct redsem__node_cfg {
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    int64_t retry_ms;
    const redsem__tls_opts *tls; /* used for rediss:// endpoints; NULL: defaults */
    int sync_replicas;           /* > 0: WAIT for this many replicas after REQ_SYNC requests */
    int64_t sync_timeout_ms;     /* WAIT's timeout (< command timeout) */
} redsem__node_cfg;

typedef struct redsem__node redsem__node;
struct redsem__node {
    redsem__ctx *ctx; /* the owning client's errors, counters and deadline cap */
    redsem__endpoint ep;
    void *tls_ctx;     /* SSL_CTX * for a rediss:// endpoint, else NULL */
    char *tls_server_name; /* NULL: the endpoint's host */
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    int64_t retry_ms;
    int sync_replicas;
    int64_t sync_timeout_ms;
    redsem__conn conn;
    bool connected;
    /* script i was sent with its body (EVAL) and has not been reported missing since */
    bool script_sent[REDSEM__SCRIPT_COUNT];
    /* The server's clock (TIME, us) minus our CLOCK_MONOTONIC (us), as last measured: from
     * TIME at connect, then from every acquire reply. Used only to tell the server until when
     * an acquire may still run (its "not after"), never to judge a lease. */
    int64_t clock_offset_us;
    bool clock_offset_known;
    /* Set by a topology that finds the node's address itself (Sentinel): called before every
     * connect to set ep.host and ep.port, within deadline_ns; the node connected to must then
     * say it is a primary (ROLE), and a READONLY reply counts as a lost connection (a
     * primary demoted under us): the request is retried, resolving again. NULL: a fixed
     * address. */
    int (*resolve)(void *arg, redsem__node *n, int64_t deadline_ns, char *err, size_t errlen);
    void *resolve_arg;
};

/* Set up n for ep (copied) without connecting; for rediss:// the TLS context is made now
 * (its files read). REDSEM_OK, REDSEM_EINVAL (a TLS file, with the reason in err) or
 * REDSEM_ENOMEM. */
int redsem__node_init(redsem__node *n, redsem__ctx *ctx, const redsem__endpoint *ep,
                      const redsem__node_cfg *cfg, char *err, size_t errlen);
void redsem__node_close(redsem__node *n);
/* Connect and run the handshake. On failure err says why and *retryable whether another
 * try may help. */
int redsem__node_connect(redsem__node *n, bool *retryable, char *err, size_t errlen);

/* Request flags. */
#define REDSEM__REQ_RETRY 0x1 /* re-send after a connection-level failure (idempotent) */
#define REDSEM__REQ_SYNC 0x2  /* eval: with sync_replicas, WAIT in the same round trip */

/* Outcome detail of a request, for callers that must tell "not applied" from "maybe". */
typedef struct redsem__req_info {
    bool maybe_applied; /* a copy was fully written and its reply never came */
    int64_t sent_ns;    /* when the copy that got the reply was written (start of write) */
    int64_t recv_ns;    /* when its reply was read */
    int replicas_acked; /* REQ_SYNC with sync_replicas: WAIT's answer; else -1 */
} redsem__req_info;

/* One request/reply. Connects first if needed. *ret_reply is set on REDSEM_OK only and may
 * be an error reply (the caller classifies it). deadline_ns bounds the reply wait; 0 means
 * now + command timeout. */
int redsem__node_request(redsem__node *n, const redsem__args *a, int flags, int64_t deadline_ns,
                         struct redisReply **ret_reply, redsem__req_info *info);
/* The same with a second request pipelined after the first in the same write (one round
 * trip); both are resent together after a lost connection. On REDSEM_OK both replies are
 * set (either may be an error reply). */
int redsem__node_request2(redsem__node *n, const struct redsem__args *a,
                          const struct redsem__args *then, int flags, int64_t deadline_ns,
                          struct redisReply **ret_reply, struct redisReply **ret_then,
                          redsem__req_info *info);
/* Run one embedded script: EVAL with its body on this node's first use, EVALSHA after,
 * EVAL again after NOSCRIPT (one more round trip only then); error replies are classified
 * into codes with the text in the context's errmsg. On REDSEM_OK *ret_reply is a non-error
 * reply owned by the caller. keys/args are appended after "EVALSHA sha numkeys". */
int redsem__node_eval(redsem__node *n, int script, int nkeys, const redsem__args *keys_and_args,
                      int flags, redsem__req_info *info, struct redisReply **ret_reply);
/* BLPOP key for up to wait_ms (server side), giving up at hard_deadline_ns (the connection
 * is then discarded). Returns REDSEM_OK with *signaled, or a fault. */
int redsem__node_blpop(redsem__node *n, const char *key, size_t keylen, int64_t wait_ms,
                       int64_t hard_deadline_ns, bool *signaled);
/* Map an error reply to a code and record it. */
int redsem__node_error_reply(redsem__node *n, const struct redisReply *r, const char *what);

/* The latest server time (us) at which an acquire sent now may still run: now + the command
 * timeout + a margin for the offset's error, on the server's clock; 0 (no limit) until the
 * node has measured the offset. */
int64_t redsem__node_not_after_us(const redsem__node *n);
/* Record the server's clock as seen in a reply read at recv_ns. */
void redsem__node_note_server_clock(redsem__node *n, int64_t server_us, int64_t recv_ns);

#endif /* REDSEM_NODE_H */
