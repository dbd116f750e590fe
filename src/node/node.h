/* redsem - the node layer: one Redis server as seen by one client. Its connection (with the
 * handshake: AUTH, SELECT, TIME), requests with reconnect and idempotent retry, the server's
 * clock offset, the script cache (SCRIPT LOAD + EVALSHA on first use, EVALSHA after,
 * NOSCRIPT) and BLPOP.
 * Below the topology; knows nothing of semaphores, locks or permits. Not API. */
#ifndef REDSEM_NODE_H
#define REDSEM_NODE_H

#include <stdatomic.h>

#include "lua_scripts.h"
#include "net/net.h"
#include "node/conn.h"
#include "proto/resp.h"

/* How a client reaches its servers: the same for every node it connects. */
typedef struct redsem__node_cfg {
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    int64_t retry_ms;
    const redsem__tls_opts *tls; /* used for rediss:// endpoints; NULL: defaults */
    int sync_replicas;           /* > 0: WAIT for this many replicas after REQ_SYNC requests */
    int64_t sync_timeout_ms;     /* WAIT's timeout (< command timeout) */
    /* The client's TLS context (SSL_CTX *, made from tls), shared by every node of its
     * engines: each holds a reference. NULL: a rediss:// node makes its own from tls. */
    void *tls_ctx;
    bool allow_eviction;         /* false: refuse a server that may evict keys (INFO memory) */
} redsem__node_cfg;

/* A Redis Cluster redirection or refusal, read from an error reply by a cluster node. */
enum {
    REDSEM__REDIR_MOVED = 1,   /* "MOVED slot host:port": the slot lives there now */
    REDSEM__REDIR_ASK = 2,     /* "ASK slot host:port": this key is there, ask with ASKING */
    REDSEM__REDIR_TRYAGAIN = 3 /* TRYAGAIN, CLUSTERDOWN, UNBLOCKED (a BLPOP cut by a
                                * failover): nothing ran; back off and retry */
};
typedef struct redsem__redirect {
    int kind;
    int slot;
    char host[256];
    int port;
} redsem__redirect;
/* Internal status: the node's redirect field says where to go. The topology layer follows it
 * and never lets it reach the API. */
#define REDSEM__EREDIRECT (-1000)

/* The server's clock (TIME, us) minus our CLOCK_MONOTONIC (us), as last measured: from TIME
 * at connect, then from every acquire reply; INT64_MIN while unknown. Used only to tell the
 * server until when an acquire may still run (its "not after"), never to judge a lease.
 * Atomic: the connections of a client's engines to its one server (the request and wait
 * connections of the blocking driver's engine and of each event-loop binding's) share the
 * client's (redsem__loop_new); a Cluster node keeps its own. */
typedef struct redsem__clock {
    _Atomic int64_t offset_us;
} redsem__clock;
void redsem__clock_init(redsem__clock *k);
/* Record the server's clock as seen in a reply read at recv_ns. */
void redsem__clock_note(redsem__clock *k, int64_t server_us, int64_t recv_ns);
/* The latest server time (us) at which an acquire sent now may still run: now + the command
 * timeout + a margin for the offset's error, on the server's clock; 0 (no limit) while the
 * offset is unknown. */
int64_t redsem__clock_not_after_us(const redsem__clock *k, int64_t command_timeout_ms);

/* The scripts a server is known to hold in its cache: loaded there (SCRIPT LOAD, or EVAL
 * with the body where SCRIPT LOAD is refused) and not reported missing since (NOSCRIPT). A
 * node's own, or the client's, shared as the clock is (redsem__loop_new), so that a new
 * connection does not send every body again. eval_body:
 * the server refused SCRIPT LOAD (an ACL without script|load, a renamed command): bodies go
 * by EVAL. Atomic: a client's engines run in different threads. */
typedef struct redsem__script_cache {
    _Atomic bool sent[REDSEM__SCRIPT_COUNT];
    _Atomic bool eval_body;
} redsem__script_cache;

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
    bool allow_eviction; /* false: every connect reads INFO memory (judge_eviction, node.c) */
    redsem__conn conn;
    bool connected;
    /* the scripts the server holds: own_scripts, or the client's (set after node_init) */
    redsem__script_cache own_scripts;
    redsem__script_cache *scripts;
    /* The server's clock: own_clock, or the client's (set after node_init). */
    redsem__clock own_clock;
    redsem__clock *clock;
    /* Set by a topology that finds the node's address itself (Sentinel): called before every
     * connect to set ep.host and ep.port, within deadline_ns; the node connected to must then
     * say it is a primary (ROLE), and a READONLY reply counts as a lost connection (a
     * primary demoted under us): the request is retried, resolving again; a BLPOP cut with
     * UNBLOCKED (demoted while it waited) ends the wait early and drops the connection, so
     * the caller's next request resolves again. NULL: a fixed address. */
    int (*resolve)(void *arg, redsem__node *n, int64_t deadline_ns, char *err, size_t errlen);
    void *resolve_arg;
    /* Set with resolve by the Sentinel topology: called (with resolve_arg) before every
     * request on an open connection; true when the primary has moved away from the address
     * connected to (a +switch-master the topology read from its Sentinel subscription), err
     * saying so. The request is then handled as after READONLY: the connection is dropped
     * and, with REDSEM__REQ_RETRY, the request resent after a new resolve; nothing was sent.
     * watch_epoch is the hook's own (what it last checked this connection against). */
    bool (*moved)(void *arg, redsem__node *n, char *err, size_t errlen);
    uint64_t watch_epoch;
    /* With resolve: when the server last said it is the primary (ROLE, CLOCK_MONOTONIC ns):
     * at connect, then again, in the same write as a request, once this is older than
     * REDSEM__ROLE_CHECK_MS; a server that no longer says "master" is handled as READONLY. */
    int64_t role_checked_ns;
    /* A Redis Cluster primary (topo/cluster.c): a redirection reply becomes REDSEM__EREDIRECT
     * with its detail in redirect, and a failed connect is not retried here (the topology
     * asks the cluster where the slot went, then retries). asking: send ASKING before every
     * request in the same write (set by the topology for one call after an ASK). */
    bool cluster;
    bool asking;
    redsem__redirect redirect;
};

/* Set up n for ep (copied) without connecting; for rediss:// it takes a reference to
 * cfg->tls_ctx, or makes a TLS context now (its files read) when there is none. REDSEM_OK,
 * REDSEM_EINVAL (a TLS file, with the reason in err) or REDSEM_ENOMEM. */
int redsem__node_init(redsem__node *n, redsem__ctx *ctx, const redsem__endpoint *ep,
                      const redsem__node_cfg *cfg, char *err, size_t errlen);
void redsem__node_close(redsem__node *n);
/* Close the connection (if any) without freeing anything: the next request connects anew. */
void redsem__node_disconnect(redsem__node *n);

/* The node is open (a connect done elsewhere: the loop engine's): connected, counted. */
void redsem__node_opened(redsem__node *n);

/* The handshake of a connect as requests, in this order: AUTH (a password), SELECT (db not
 * 0), TIME (the clock's offset not measured yet), ROLE (a node found through Sentinel),
 * INFO memory (eviction not allowed: refused with REDSEM_EEVICTION when the server may
 * evict). The engine (drive_loop.c) sends them in one write on its pipe, each built with
 * redsem__handshake_format, and judges their outcomes with redsem__handshake_judge, in
 * order, stopping at the first failure. */
enum {
    REDSEM__HS_AUTH = 0,
    REDSEM__HS_SELECT = 1,
    REDSEM__HS_TIME = 2,
    REDSEM__HS_ROLE = 3,
    REDSEM__HS_EVICTION = 4
};
#define REDSEM__HS_MAX 5
typedef struct redsem__handshake {
    int step[REDSEM__HS_MAX];
    int n;
} redsem__handshake;
/* The steps n's connect takes now (with_role: ROLE when the node is found through Sentinel). */
void redsem__handshake_plan(const redsem__node *n, bool with_role, redsem__handshake *h);
/* The bytes of one step in *cmd (owned: freed with redsem__handshake_free, which wipes AUTH's
 * password): the length, or -1 without memory. */
int redsem__handshake_format(const redsem__node *n, int step, char **cmd);
void redsem__handshake_free(char *cmd, int len);
/* A step's outcome: rc is its request's (REDSEM_OK with its reply r, borrowed, read at
 * recv_ns; else the fault, with its text in err and r NULL). REDSEM_OK, or the connect's
 * failure with its text in err. */
int redsem__handshake_judge(redsem__node *n, int step, int rc, const struct redisReply *r,
                            int64_t recv_ns, char *err, size_t errlen);
/* A connect failed with rc: the hint added to err (a lost connection during the handshake:
 * TLS or a client certificate), and whether another try may help. */
bool redsem__handshake_failed(const redsem__node *n, int rc, char *err, size_t errlen);

/* How often a node found through Sentinel re-checks that its server is the primary (ROLE,
 * sent in the same write as the next request). */
#define REDSEM__ROLE_CHECK_MS 1000

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

/* The arguments of one call of script d (its nkeys keys, then its arguments, in ka): a, the
 * EVALSHA (or, body && !load, the EVAL with the body); la, with load, the SCRIPT LOAD of the
 * body that goes before it (else left empty). Both initialised here. */
void redsem__script_args(const redsem__script_def *d, bool body, bool load, int nkeys,
                         const redsem__args *ka, redsem__args *a, redsem__args *la);
/* The replicas a WAIT reply w says acknowledged (an error reply, or one that is not a
 * non-negative integer, counts as none, its reason in n's context errmsg). */
int redsem__node_wait_acked(redsem__node *n, const struct redisReply *w);
/* Whether r is "-LOADING ...": a restarted server reading its RDB or AOF file, which
 * executes nothing until it is done (a request is resent within its retry window). */
bool redsem__loading_reply(const struct redisReply *r);
/* One script call of a batch (redsem__eval_many in drive_sync.c): its script, its keys
 * (nkeys of ka) and arguments, its flags, and its outcome. errmsg: a buffer of
 * REDSEM__ERRMSG_LEN bytes for the text of its failure. */
typedef struct redsem__batch_item {
    int script, nkeys;
    const redsem__args *ka;
    int flags;
    redsem__req_info *info; /* may be NULL */
    struct redisReply **ret_reply;
    char *errmsg;
    int rc;
} redsem__batch_item;
#define REDSEM__BATCH_MAX 16
/* Map an error reply to a code and record it. On a cluster node a redirection (MOVED, ASK,
 * TRYAGAIN, CLUSTERDOWN, UNBLOCKED) is REDSEM__EREDIRECT with n->redirect set; elsewhere a MOVED or ASK
 * is REDSEM_ESERVER with a hint to use a redis+cluster:// URL. */
int redsem__node_error_reply(redsem__node *n, const struct redisReply *r, const char *what);

/* Whether r is a cluster redirection error reply (MOVED, ASK, TRYAGAIN, CLUSTERDOWN,
 * UNBLOCKED). */
bool redsem__redirect_reply(const struct redisReply *r);

/* The latest server time (us) at which an acquire sent now may still run: now + the command
 * timeout + a margin for the offset's error, on the server's clock; 0 (no limit) until the
 * node has measured the offset. */
int64_t redsem__node_not_after_us(const redsem__node *n);
/* Record the server's clock as seen in a reply read at recv_ns. */
void redsem__node_note_server_clock(redsem__node *n, int64_t server_us, int64_t recv_ns);

#endif /* REDSEM_NODE_H */
