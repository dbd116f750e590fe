/* redsem - the object layer: the client handle, semaphores, locks, permits, renewal and
 * status, above the topology (topo/topo.h), the node (node/node.h), the protocol
 * (proto/resp.h), the connection (net/net.h) and the base (base/base.h). A file includes
 * its own layer's header; no header includes one above it. Not API. */
#ifndef REDSEM_INTERNAL_H
#define REDSEM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "topo/topo.h"

/* ------------------------------------------------------ blocking calls (drive_sync.c) */
/* The object layer's blocking requests: ops of the client's engine (drive_loop.c), driven
 * by the calling threads (drive_sync.c), each sent to the node that serves its key. A
 * command: redsem__request (its error reply is a reply; deadline_ns 0: a command timeout);
 * a script call: redsem__eval, or redsem__call_run for a call built by an operation (the
 * wake-ups its reply carries pushed by the engine). Their codes: the engine's (section 10 of
 * docs/design.md), the text the calling thread's. */
int redsem__request(redsem_client *c, const redsem__args *a, int flags, int64_t deadline_ns,
                    struct redisReply **ret_reply, redsem__req_info *info);
int redsem__eval(redsem_client *c, int script, int nkeys, const redsem__args *keys_and_args,
                 int flags, redsem__req_info *info, struct redisReply **ret_reply);
/* k (1..REDSEM__BATCH_MAX) script calls of the calling thread at once, in one write per
 * connection. Each item's errmsg must be a buffer of its own (REDSEM__ERRMSG_LEN bytes): the
 * text of its failure. */
void redsem__eval_many(redsem_client *c, redsem__batch_item *items, int k);
struct redsem__wake_grant; /* below, with the acquire loop's state */
/* Wait up to wait_ms (never past hard_deadline_ns, our clock) for an element on the list
 * key, popping it, as an acquire's wait does on the engine, without its attempts (for the
 * white-box tests of the engine's waits: tests/test_wake.c): REDSEM_OK with *signaled, or a
 * fault. since_ns: when the caller began waiting (of the waiters on one list, the one waiting
 * longest gets its element). elem: NULL, or (a fair waiter, whose key is then the client's
 * bell) the element of the client's id list that alone wakes it, "<id> <meta key>", kept
 * for it if drained while it did not wait; grant: where the direct grant that element
 * carried goes (token 0 if none). redsem__wake_waiters: the waits of c's blocking engine
 * under way now (acquires' and these). */
int redsem__blpop(redsem_client *c, const char *key, size_t keylen, const char *elem,
                  int64_t wait_ms, int64_t hard_deadline_ns, int64_t since_ns, bool *signaled,
                  struct redsem__wake_grant *grant);
int redsem__wake_waiters(redsem_client *c);
/* The address of the node serving key now, as the engine the calling thread steps knows it
 * ("host:port" or a socket path; "" if not known, or outside an engine). */
void redsem__served_by(redsem_client *c, const char *key, char *buf, size_t len);
/* The not-after time for an acquire on key (node.h), and a server clock seen in its reply:
 * a Cluster node's clock is the engine's node's (the calling thread steps it: an op's call
 * builder or reply), another client's the client's. */
int64_t redsem__not_after_us(redsem_client *c, const char *key);
void redsem__note_server_clock(redsem_client *c, const char *key, int64_t server_us,
                               int64_t recv_ns);

int redsem__set_err(redsem_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* With sync_replicas: REDSEM_EREPLICA when fewer replicas acknowledged the refresh of info
 * than required (the message says so); REDSEM_OK otherwise. */
int redsem__refresh_synced(redsem_client *c, const redsem__req_info *info);
int redsem__check_owner(redsem_client *c); /* EFORKED after fork */
/* The first element of a script's {status, ...} array reply; REDSEM_EPROTO otherwise. */
int redsem__reply_status(redsem_client *c, const struct redisReply *r, const char *what,
                         long long *status);

/* ---------------------------------------------------------------- calls (call.c) */
/* One script call an operation asks its driver to run: the operation builds it (its keys,
 * then its arguments: the first key routes it) and takes its outcome in a function of its
 * own, so that a driver on the calling thread (redsem__call_run) and one on an event loop
 * run the same operation. ka points into itself (its numbers): built in place, never
 * copied. */
typedef struct redsem__call {
    int script, nkeys, flags; /* REDSEM__SCRIPT_*, the count of keys in ka, REDSEM__REQ_* */
    redsem__args ka;
    /* NULL, or the signal-list prefix of a script whose reply may carry wake-ups for waiters
     * it granted (redsem__wake_push_call): the driver pushes them before it hands the reply on */
    const char *wake_prefix;
    int64_t cap_ns; /* 0, or the call's own deadline (CLOCK_MONOTONIC ns; as
                     * redsem__call_cap_set) */
} redsem__call;
/* The script of a call that is a command (call->ka: its words), not a script. */
#define REDSEM__SCRIPT_NONE (-1)
/* Start a call: no keys or arguments yet, no wake-ups, no cap. */
static inline void redsem__call_init(redsem__call *call, int script, int flags,
                                     const char *wake_prefix)
{
    call->script = script;
    call->nkeys = 0;
    call->flags = flags;
    redsem__args_init(&call->ka);
    call->wake_prefix = wake_prefix;
    call->cap_ns = 0;
}
/* How a call's outcome is taken (by the engine's drivers: redsem__loop_run, and
 * redsem__call_judged): rc, on REDSEM_OK its reply *r (which it may keep by setting *r NULL:
 * else it is freed), info; it returns the operation's status. */
typedef int (*redsem__loop_reply)(void *arg, int rc, struct redisReply **r,
                                  const redsem__req_info *info);
/* Append the call's n keys (before any argument); nkeys becomes their count. */
void redsem__call_keys(redsem__call *call, int n, const char *const keys[]);
/* The blocking driver: run call on the calling thread (redsem__eval under its cap, then the
 * wake-ups its reply carries): redsem__eval's codes, *ret_reply (owned by the caller) on
 * REDSEM_OK. */
int redsem__call_run(redsem_client *c, redsem__call *call, redsem__req_info *info,
                     struct redisReply **ret_reply);
/* The same, its outcome judged by judge(arg, rc, &r, info) inside the engine (on the thread
 * stepping it: what it asks of the node serving a key, redsem__served_by, is the engine's);
 * returns judge's status, its text the calling thread's. */
int redsem__call_judged(redsem_client *c, redsem__call *call, redsem__loop_reply judge,
                        void *arg);

/* ---------------------------------------------------------------- client */
struct redsem_options {
    redsem__endpoint ep;
    redsem__tls_opts tls;
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    int64_t retry_ms;
    int sync_replicas;       /* 0: no WAIT */
    int64_t sync_timeout_ms;
    int max_connections; /* request connections per server */
    char *prefix;
    bool allow_eviction; /* connect to servers that may evict keys (node.c checks) */
    uint32_t metrics_names_max; /* names with figures of their own (metrics.c) */
    bool metrics_off;           /* redsem_options_set_metrics(o, false) */
};

typedef struct redsem__renewer redsem__renewer;
/* The blocking driver's state (drive_sync.c): the client's engine, its mutex, the threads
 * asleep on their ops. new: made with the client (REDSEM_OK, ENOMEM, ECONN: no eventfd);
 * free: with the client (in a forked child: memory and descriptors only). */
typedef struct redsem__sync redsem__sync;
int redsem__sync_new(redsem_client *c);
void redsem__sync_free(redsem_client *c);
/* PING through the engine (flags: REDSEM__REQ_RETRY or 0), its error reply classified by
 * the node that sent it. */
int redsem__sync_ping(redsem_client *c, int flags);
/* Open the engine's request connection now (a Cluster client's: read the slot map), with
 * its code and text: the client's creation fails early and clearly. */
int redsem__sync_open(redsem_client *c);

/* ---------------------------------------------------------------- renewal (renew.c) */
/* Installed in the client by renew.c when it starts the client's renewer, so that client.c
 * and permit.c stop renewal without calling up into renew.c. */
typedef struct redsem__renew_ops {
    void (*stop)(redsem_client *c);      /* stop and free the renewer (client_free) */
    void (*detach)(redsem_permit *p);    /* stop renewing p, waiting for one in flight */
    /* stop renewing the permits of a semaphore or lock handle (sem_free, lock_free) */
    void (*forget)(redsem_client *c, const void *handle);
} redsem__renew_ops;
/* What a permit granted on an event loop points to: that loop's renewer (renew.c), which
 * renews it; a reference, let go of by redsem_permit_free (unref) without calling up into
 * renew.c. */
typedef struct redsem__home {
    void (*unref)(struct redsem__home *h);
} redsem__home;


struct redsem_client {
    /* the settings it was made with */
    redsem__endpoint ep;
    redsem__tls_opts tls;
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    int64_t retry_ms;
    int sync_replicas; /* > 0: grants and refreshes must reach this many replicas (WAIT) */
    int64_t sync_timeout_ms;
    int max_connections; /* request connections per server at most (the engines use one) */
    redsem__node_cfg cfg;
    redsem__clock clock; /* the server's, shared by its engines (not in a cluster) */
    _Atomic size_t seed_first; /* a cluster's seed that last gave an engine the map */
    redsem__script_cache scripts; /* what the server has cached, shared the same way */
    redsem__sentinel_watch *sentinel_watch; /* Sentinel: the engines' shared watch (topo.h) */
    char *prefix;
    size_t prefix_len;
    pid_t pid; /* owner process */
    uint64_t serial; /* unique in the process: keys the per-thread error texts (client.c) */
    pthread_mutex_t stats_mu; /* the engines' counters (redsem__stats_attach) */
    uint64_t direct_grants; /* atomic adds (acquire.c), atomic loads */
    /* counters of event-loop engines (redsem__stats_attach), and of those gone */
    redsem__ctx **stats_ctx;
    size_t nstats_ctx, stats_ctx_cap;
    redsem_client_stats stats_gone;
    pthread_mutex_t renew_mu; /* serialises starting the renewer */
    char *wake_ids;  /* this client's list of fair wake-ups: {prefix}wake:<tag>:ids (wake.c) */
    char *wake_bell; /* its bell (wake_ids + ":bell"), which the engines' BLPOP watches */
    atomic_int waits; /* ops of its engines waiting now (redsem__wake_any) */
    redsem__renewer *renewer; /* NULL unless automatic renewal was enabled (atomic access) */
    const redsem__renew_ops *renew_ops; /* set with renewer, or with a loop's renewer */
    redsem__renewer *loop_renewers; /* the running event loops' renewers (under renew_mu) */
    struct redsem__metrics *metrics; /* what it recorded (record.c) */
    redsem__sync *sync; /* the blocking calls' engine (drive_sync.c) */
};

/* The counters of an engine (drive_loop.c): attached, they are summed into
 * redsem_client_get_stats(); detached (before ctx goes), what they counted is kept in the
 * client's. client.c, under stats_mu. */
void redsem__stats_attach(redsem_client *c, redsem__ctx *ctx);
void redsem__stats_detach(redsem_client *c, redsem__ctx *ctx);
/* Copy an error text (REDSEM__ERRMSG_LEN bytes at most). */
void redsem__text_copy(char *dst, const char *src);
/* wake.c: name c's id list and its bell (REDSEM_OK or REDSEM_ENOMEM), and free them. */
int redsem__wake_init(redsem_client *c);
void redsem__wake_free(redsem_client *c);

/* Cap the deadlines of the calling thread's calls on c (0: no cap of its own): their
 * connect and their replies end by cap_ns (CLOCK_MONOTONIC) at most. Set by the renewer
 * around each round of renewals; reset to 0 after (client.c). */
void redsem__call_cap_set(const redsem_client *c, int64_t cap_ns);
/* The calling thread's cap on c set by redsem__call_cap_set (0: none). */
int64_t redsem__call_cap(const redsem_client *c);
/* The calling thread's error text for c: a buffer of REDSEM__ERRMSG_LEN bytes that the
 * thread's next call on c may overwrite (client.c). */
char *redsem__errbuf(const redsem_client *c);

/* Build "PREFIX{NAME}SUFFIX". */
char *redsem__key(const redsem_client *c, const char *name, const char *suffix);

/* ---------------------------------------------------------------- metrics (record.c) */
/* What a client records (metrics.h): record.c keeps it, metrics.c writes it out. The figures
 * of one (name, kind) a client used are a slot, found by redsem__metrics_of() once per
 * handle, then updated with relaxed atomic adds by any thread (no lock, no I/O). */
typedef struct redsem__mslot redsem__mslot;
enum { REDSEM__MK_SEM = 0, REDSEM__MK_LOCK = 1, REDSEM__MK_RATE = 2, REDSEM__MK_N = 3 };
/* lost reasons; acquire outcomes; refresh outcomes; rate outcomes */
enum { REDSEM__ML_EXPIRED = 0, REDSEM__ML_TAKEN = 1, REDSEM__ML_RENEWAL = 2, REDSEM__ML_N = 3 };
enum {
    REDSEM__MO_GRANTED, REDSEM__MO_BUSY, REDSEM__MO_TIMEOUT, REDSEM__MO_CANCELLED,
    REDSEM__MO_ERROR, REDSEM__MO_UNKNOWN, REDSEM__MO_N
};
enum { REDSEM__MR_OK, REDSEM__MR_LOST, REDSEM__MR_ERROR, REDSEM__MR_N };
enum { REDSEM__MT_ALLOWED, REDSEM__MT_LIMITED, REDSEM__MT_ERROR, REDSEM__MT_N };

typedef struct redsem__hist {
    _Atomic uint64_t b[REDSEM_METRICS_BUCKETS]; /* per bucket (not cumulative) */
    _Atomic uint64_t sum_ns;
} redsem__hist;

struct redsem__mslot {
    redsem__hist wait[REDSEM__MO_N];
    redsem__hist hold;
    _Atomic uint64_t grants;
    _Atomic uint64_t lost[REDSEM__ML_N];
    _Atomic uint64_t renew[REDSEM__MR_N];
    _Atomic uint64_t rate[REDSEM__MT_N];
    int kind;
    char name[]; /* NUL-terminated */
};

/* A waiter the server-side scrape listed, and when a scrape first saw it (our clock). */
typedef struct redsem__seen_waiter {
    char id[REDSEM_ID_BUFSIZE];
    int64_t first_ns;
} redsem__seen_waiter;

/* The waiters the last scrape of one (name, kind) listed, sorted by id. */
typedef struct redsem__seen_name {
    char *name;
    int kind;
    redsem__seen_waiter *w;
    size_t n;
} redsem__seen_name;

typedef struct redsem__metrics {
    bool off;                       /* recording off: no table */
    /* the server-side scrapes' waiters, sorted by (kind, name); under seen_mu */
    pthread_mutex_t seen_mu;
    redsem__seen_name *seen;
    size_t nseen, seen_cap;
    size_t mask;                    /* table size - 1 (a power of 2) */
    redsem__mslot *_Atomic *table;  /* by hash; entries never change once set */
    redsem__mslot **order;          /* slots in the order they were made: norder of them */
    _Atomic size_t norder;          /* written under mu (release), read with acquire */
    uint32_t max, nnames;           /* the cap; names with a slot of their own (under mu) */
    redsem__mslot *other[REDSEM__MK_N]; /* "_other" of each kind (under mu) */
    _Atomic uint64_t dropped;
    pthread_mutex_t mu;
} redsem__metrics;

/* Make c's table for max names (c->metrics), or leave recording off (NULL) when off is set.
 * REDSEM_OK or REDSEM_ENOMEM. */
int redsem__metrics_init(redsem_client *c, uint32_t max, bool off);
void redsem__metrics_free(redsem_client *c);
/* The slot of (name, kind) on c, cached in *cache (a handle's; NULL: not looked up yet):
 * NULL when recording is off or no memory was left (then nothing is recorded). */
redsem__mslot *redsem__metrics_of(redsem_client *c, redsem__mslot *_Atomic *cache,
                                  const char *name, int kind);
/* An acquire's result rc, started at
 * start_ns and decided at now_ns (our clock): its wait by outcome, a grant, and for a rate
 * limiter its outcome. */
void redsem__metrics_acquired(redsem__mslot *s, int rc, int64_t start_ns, int64_t now_ns);
/* A release answered by the server, of a permit granted at granted_ns (0: not known). */
void redsem__metrics_released(redsem__mslot *s, int64_t granted_ns);
void redsem__metrics_lost(redsem__mslot *s, int reason); /* REDSEM__ML_* */
/* A permit p found lost by the server (its state was HELD): counted as expired when its
 * validity deadline had passed by our clock, else as taken. */
void redsem__metrics_lost_held(const struct redsem_permit *p);
void redsem__metrics_renewal(redsem__mslot *s, int rc);  /* a refresh's result */

/* ---------------------------------------------------------------- acquire machinery */
/* What a permit needs from the object that granted it, a semaphore (sem.c) or a lock
 * (lock.c): they hand their table to the permits they make, so that permit.c and renew.c
 * never call up into sem.c or lock.c. */
typedef struct redsem__kind {
    const char *name; /* "sem" or "lock": holder.lua's argument */
    /* The refresh of permit p: its script call (keys, then arguments, into a: the script's
     * id is returned, its key count in *nkeys); and, when the script said p is no longer
     * held, the REDSEM_ELOST message (set on c). Run by permit.c, one at a time or several
     * in one round trip (the renewer). */
    int (*refresh_call)(void *handle, const redsem_permit *p, redsem__args *a, int *nkeys);
    int (*refresh_lost)(redsem_client *c, void *handle, const redsem_permit *p);
    /* Server-side release of one permit p, without touching renewal, as one script call:
     * release_call builds it in place; release_reply takes its outcome (rc; on REDSEM_OK its
     * reply r, borrowed, and info) and returns REDSEM_OK, REDSEM_ELOST (the message set on
     * c) or the call's code. Run by permit.c's release_on_server on the calling thread. */
    void (*release_call)(void *handle, const redsem_permit *p, redsem__call *call);
    int (*release_reply)(redsem_client *c, void *handle, const redsem_permit *p, int rc,
                         const struct redisReply *r, const redsem__req_info *info);
    /* The handle's count of its permits that the renewer holds on to (renew.c). */
    _Atomic uint32_t *(*renewed)(void *handle);
} redsem__kind;

enum {
    REDSEM__MODE_TRY = 0,   /* new request, leave if not granted */
    REDSEM__MODE_WAIT = 1,  /* new request, stay (register / queue) if not granted */
    REDSEM__MODE_AGAIN = 2, /* already registered: re-check and renew the wait lease */
    REDSEM__MODE_LAST = 3   /* already registered: final check, leave if not granted */
};
extern const char *const redsem__mode_names[4];

enum {
    REDSEM__ATT_GRANTED = 1,
    REDSEM__ATT_BUSY = 0,
    REDSEM__ATT_GUARD_BUSY = -2,
    REDSEM__ATT_TOO_LATE = -3, /* the server ran it after its not-after time: nothing done */
    REDSEM__ATT_WEIGHT = -4,   /* the id holds or waits for another weight (in .weight) */
    REDSEM__ATT_TOO_MANY = -5  /* the weight exceeds the limit (in .limit) */
};

typedef struct redsem__attempt {
    int outcome;       /* REDSEM__ATT_* */
    uint64_t token;    /* granted: fencing token */
    uint32_t limit;    /* limit in effect on the server */
    int64_t next_ms;   /* busy: ms until the earliest lease deadline, -1 unknown */
    uint32_t holds;    /* lock: reentrant hold count */
    int64_t sent_ns;   /* granted: when the granting request was sent */
    int replicas_acked; /* granted with sync_replicas: replicas that acknowledged; else -1 */
    int64_t server_us; /* the server's clock when it ran the script (0 if not reported) */
    uint32_t weight;   /* granted: permits taken (0 = 1); REDSEM__ATT_WEIGHT: held */
    uint64_t fence;    /* busy (fair, locked): the last token drawn on the semaphore */
    bool fence_known;  /* the reply said it (fair_acquire.lua) */
} redsem__attempt;

/* What the generic waiting loop needs from a semaphore strategy or the lock. */
typedef struct redsem__acquirer {
    redsem_client *client;
    void *handle;
    /* One attempt, as script calls (the locked strategy: its guard, then its attempt; the
     * others: one). attempt_call builds the call of stage (0 first) in place. attempt_reply
     * takes that call's outcome: rc, and on REDSEM_OK its reply r (borrowed: the driver frees
     * it) and info (which it may amend); it returns REDSEM_OK with *att filled,
     * REDSEM__ATTEMPT (the call of stage + 1 is due), or a code (with info->maybe_applied).
     * Run by the engine (drive_loop.c). */
    void (*attempt_call)(void *handle, const char *id, int mode, uint32_t weight, int stage,
                         redsem__call *call);
    int (*attempt_reply)(void *handle, int stage, int rc, const struct redisReply *r,
                         redsem__req_info *info, redsem__attempt *att);
    /* Key to BLPOP on while waiting (may depend on id). */
    const char *(*wait_key)(void *handle, const char *id, size_t *len, char *buf, size_t buflen);
    int64_t wait_lease_ms; /* > 0: renew registration at least every third of it */
    int64_t lease_ms;      /* the lease its attempts ask for (a direct grant must carry it) */
    /* NULL, or (a fair waiter of a one-server client) the semaphore's meta key: the waiter
     * is woken by "<id> <wake_meta>" on its client's id list (wake.c) */
    const char *wake_meta;
    uint32_t weight;       /* permits wanted (1 for a lock) */
    redsem__mslot *metrics; /* where its outcome is recorded (NULL: nowhere) */
    /* NULL, or where the decided attempt goes instead of a permit (the rate limiter: its
     * acquire's kind is NULL, nothing is recorded or given back) */
    redsem__attempt *att_out;
} redsem__acquirer;

/* Parse the {status, a, b, now} reply of an acquire script into att. */
int redsem__parse_attempt(redsem_client *c, const struct redisReply *r, redsem__attempt *att,
                          const char *what);

/* wake.c: a script's reply that came with wake-ups for waiters it granted ({'wake', reply,
 * kind, target, element, ...}: prelude.lua's grant_heads, rate.lua) becomes the script's own
 * reply in *reply (unwrap returns the wrapper, owned by the caller, freed with
 * freeReplyObject; NULL, *reply untouched, if it has none), and the engine pushes them with
 * wake_push.lua, whose KEYS name the lists: a kind-'i' target only if it is an id list of
 * this client's prefix (PREFIXwake:<16 hex>:ids, and not in a cluster), a kind-'s' target (a
 * holder id) as sigprefix + id. push_call: build in wc the wake_push.lua call for the
 * wake-ups of the wrapper r from its element *from (2 at first) on, at most
 * REDSEM__WAKE_PUSH_MAX of them, skipping names that are not a waiter's list; *from: the
 * element after the last one taken. false: none left. A wake-up that cannot be pushed (a
 * fault, a planted name) is dropped: the grant stands and its waiter's poll finds it. */
struct redisReply *redsem__wake_unwrap(struct redisReply **reply);
/* wake-ups per wake_push.lua call: 2 keys and 2 arguments each (REDSEM__MAX_ARGS) */
#define REDSEM__WAKE_PUSH_MAX (REDSEM__MAX_ARGS / 4)
#define REDSEM__WAKE_KEY_MAX 1100 /* prefix (<= 256) + '{' + name (<= 512) + a suffix + id */
typedef struct redsem__wake_call {
    redsem__call call;
    char keys[REDSEM__WAKE_PUSH_MAX][REDSEM__WAKE_KEY_MAX];
    char bells[REDSEM__WAKE_PUSH_MAX][REDSEM__WAKE_KEY_MAX + 8];
} redsem__wake_call;
bool redsem__wake_push_call(redsem_client *c, const char *sigprefix,
                            const struct redisReply *r, size_t *from, redsem__wake_call *wc);
/* Whether an engine of c has an op waiting now (a fair or locked release then names c's id
 * list in its keys, and wakes such a waiter in the same round trip); one atomic load. */
bool redsem__wake_any(redsem_client *c);


/* A direct grant given with a fair waiter's wake-up (prelude.lua's grant_heads: the element
 * "<id> <meta> <token> <server us> <lease ms>"): token 0 if the wake-up carried none. */
typedef struct redsem__wake_grant {
    uint64_t token;
    int64_t server_us;
    int64_t lease_ms; /* the lease the server gave it */
} redsem__wake_grant;

typedef struct redsem__acq_state {
    redsem__acquirer q;
    const redsem__kind *kind;
    char id[REDSEM_ID_BUFSIZE];
    int64_t lease_ms;
    bool blocking, registered;
    int64_t deadline;
    int64_t since_ns; /* the acquire's start (our clock): its age among a list's waiters */
    int mode, too_late;
    int64_t backoff_ms, guard_backoff_us;
    char keybuf[1024];
    char elem[REDSEM_ID_LEN + 1 + 1024]; /* "<id> <q.wake_meta>" ("" if none) */
    size_t keylen;
    const char *wkey;
    /* the wait asked for: BLPOP on wkey for wait_ms, cut at cut_ns (our clock); then the
     * waiter sets wait_rc and signaled */
    int64_t wait_ms, cut_ns;
    bool waited, signaled;
    int wait_rc;
    /* the wake-up's direct grant, if any (set by the wait, under its lock) */
    redsem__wake_grant grant;
    /* the last attempt that found this waiter queued (fair, locked): a direct grant after it
     * has a greater token than its fence, and its lease runs from a server time after it */
    bool queued_known;
    uint64_t queued_fence;
    int64_t queued_sent_ns, queued_server_us;
    uint32_t queued_limit;
    /* the attempt asked for (REDSEM__ATTEMPT, REDSEM__NAP): its mode, and what its outcome
     * continues (acquire.c); the driver runs it and sets att_rc, att and att_info, with the
     * call's error text as the calling thread's */
    int att_mode, cont;
    int att_rc;
    redsem__attempt att; /* also the grant, when the step returns REDSEM_OK */
    redsem__req_info att_info;
    int64_t nap_until_ns; /* REDSEM__NAP: the attempt runs then (our clock) */
    int64_t cap_ns;       /* 0, or the attempts' own deadline (leaving the queue) */
    /* leaving the queue: why, the code it ends with, until when it tries, the fault that
     * made it leave, and the error text kept meanwhile */
    int end_rc, fault_rc, leave_too_late;
    const char *why;
    int64_t give_up;
    char saved[REDSEM__ERRMSG_LEN];
    const atomic_bool *cancel; /* the operation's cancel flag (the event-loop API's), or NULL */
    bool given_back; /* its driver gave back a grant short of its replicas (drive_loop.c) */
} redsem__acq_state;
/* acquire_step()'s "wait, then call again". An internal code: never returned by a public
 * function. */
#define REDSEM__WAIT (-1000)
/* acquire_step()'s "run the attempt s->att_mode (its calls), set s->att_rc, s->att
 * and s->att_info, and call again"; REDSEM__NAP: the same once the clock reaches
 * s->nap_until_ns (a locked attempt found the guard busy). An attempt's "next call due"
 * (redsem__acquirer). Internal codes, as REDSEM__WAIT. */
#define REDSEM__ATTEMPT (-1002)
#define REDSEM__NAP (-1003)
/* The acquire's steps for a driver of its own (drive_loop.c): begin sets s up (the first
 * step is due); next is one step (its codes as acquire_step's: REDSEM__ATTEMPT, REDSEM__NAP,
 * REDSEM__WAIT, or the acquire's status); finish makes the decided acquire (next's status
 * rc) a permit in *ret_permit (a grant that must reach replicas and did not is given back
 * on the calling thread, unless s->given_back). */
void redsem__acquire_begin(redsem__acq_state *s, const redsem__acquirer *q,
                           const redsem__kind *kind, const char *id, int64_t timeout_ms,
                           int64_t lease_ms);
int redsem__acquire_next(redsem__acq_state *s);
int redsem__acquire_finish(redsem__acq_state *s, int rc, redsem_permit **ret_permit);
/* Whether a grant att did not reach the replicas c asks for (sync_replicas): it must be
 * given back, and its acquire ends with REDSEM_EREPLICA. A driver that gives it back itself
 * sets s->given_back before redsem__acquire_finish, which then only says so. */
bool redsem__grant_short(const redsem_client *c, const redsem__attempt *att);
/* A semaphore's or a lock's acquire before any I/O (sem.c, lock.c): the arguments checked
 * (as redsem_sem_acquire_as_n / redsem_lock_acquire_as: holder_id NULL for a new id;
 * ret_permit only checked not to be NULL), and the acquirer, its holder id and the permits'
 * kind made. REDSEM_OK or a code. */
int redsem__sem_prepare(redsem_sem *s, const char *holder_id, bool id_required, uint32_t n,
                        int64_t timeout_ms, redsem_permit **ret_permit, redsem__acquirer *q,
                        const redsem__kind **kind, char id[REDSEM_ID_BUFSIZE]);
int redsem__lock_prepare(redsem_lock *l, const char *token, bool token_required,
                         int64_t timeout_ms, redsem_permit **ret_permit, redsem__acquirer *q,
                         const redsem__kind **kind, char id[REDSEM_ID_BUFSIZE]);
/* The event-loop driver of acquires (drive_loop.c): one connection of its own to a
 * one-server client's server (a Cluster client's: one per node, by the key's slot), stepped
 * by an event loop on one
 * thread; it starts no thread and never sleeps (nor does a connect: net/dial.c). new: made,
 * not connected yet (REDSEM_EINVAL for another kind of client). acquire: start one acquire
 * of q's handle (prepared by redsem__sem_prepare or redsem__lock_prepare), called at
 * since_ns (redsem__now_ns()'s clock; 0: now: its wait is timed and aged from then); done(arg, rc,
 * permit) runs once from inside redsem__loop_step (or from here, if it is decided without
 * I/O), and *ret_cancel (may be NULL) is its cancel flag, valid until then. wants: the
 * descriptors to watch (its request connection and its wait connection, which holds one
 * BLPOP on the waiters' lists at a time; while one opens, its socket and c-ares' sockets: at
 * most REDSEM__LOOP_WATCH_MAX, how many returned) with their events, and the earliest
 * deadline (REDSEM__FOREVER: none; c-ares' timeouts and a connect's included); step: do what is due (call it with the
 * descriptors found ready, revents as poll()'s, when one is or the deadline came);
 * generation: changes when a descriptor of it is opened or closed (its number may be a
 * closed one's). free: the acquires under way end without their callbacks. */
typedef struct redsem__loop redsem__loop;
typedef void (*redsem__loop_done)(void *arg, int rc, redsem_permit *p);
int redsem__loop_new(redsem_client *c, redsem__loop **ret);
int redsem__loop_acquire(redsem__loop *l, const redsem__acquirer *q, const redsem__kind *kind,
                         const char *id, int64_t timeout_ms, int64_t lease_ms, int64_t since_ns,
                         redsem__loop_done done, void *arg, atomic_bool **ret_cancel);
/* Cancel the acquire whose *ret_cancel is cancel: its flag is set, and the engine's next step
 * looks at its ops (a step with no reply and no timer due looks at none). Any thread; the
 * op's waiting ends at that step, so the caller has the loop step soon (async.c rings). */
void redsem__loop_cancel(redsem__loop *l, atomic_bool *cancel);
/* One call on the loop: a script call, or a command (call->script REDSEM__SCRIPT_NONE:
 * call->ka is the whole command; its first call->nkeys words after the name route it in a
 * cluster, none: any node). loop_call: build(arg, call) builds it in place, in the op;
 * loop_run: call is the caller's, valid until done. reply(arg, rc, &r, info) takes its
 * outcome (rc; on REDSEM_OK its reply *r, which it may keep by setting *r NULL: else it is
 * freed; a command's error reply is a reply) and returns the operation's status, which
 * done(arg, status, NULL) is given, as for an acquire. */
int redsem__loop_call(redsem__loop *l, void (*build)(void *arg, redsem__call *call),
                      redsem__loop_reply reply, redsem__loop_done done, void *arg);
int redsem__loop_run(redsem__loop *l, redsem__call *call, redsem__loop_reply reply,
                     redsem__loop_done done, void *arg);
/* A wait alone on the engine (redsem__blpop's: an acquire's wait without its attempts): on
 * the list key, for wait_ms, cut at cut_ns (our clock), aged since since_ns; elem: NULL or a
 * fair waiter's element of the client's id list. done(arg, rc, NULL) when it ends, *signaled
 * and *grant set. waiting: the ops waiting now. */
struct redsem__wake_grant;
int redsem__loop_wait(redsem__loop *l, const char *key, const char *elem, int64_t wait_ms,
                      int64_t cut_ns, int64_t since_ns, bool *signaled,
                      struct redsem__wake_grant *grant, redsem__loop_done done, void *arg);
size_t redsem__loop_waiting(const redsem__loop *l);
/* An op that ends (done(arg, rc, NULL)) when the engine's request connection is open (a
 * Cluster client's: when a round of questions read the slot map), or its open failed: the
 * connect's, the handshake's or the map's code and text (the client's creation). */
int redsem__loop_open(redsem__loop *l, redsem__loop_done done, void *arg);
typedef struct redsem__loop_watch {
    int fd;
    short events; /* POLLIN, POLLOUT */
} redsem__loop_watch;
/* The most descriptors wants names: per connection (at most REDSEM__LOOP_CONNS_MAX: a
 * request and a wait connection, or a Cluster client's per node), its socket, or while it
 * opens its socket and c-ares' (net/dial.c). */
#define REDSEM__LOOP_CONNS_MAX 16
#define REDSEM__LOOP_WATCH_MAX (REDSEM__LOOP_CONNS_MAX * (REDSEM__DIAL_SOCKS + 1))
int redsem__loop_wants(const redsem__loop *l, redsem__loop_watch w[REDSEM__LOOP_WATCH_MAX],
                       int64_t *deadline_ns);
struct pollfd;
void redsem__loop_step(redsem__loop *l, const struct pollfd *ready, int n);
unsigned redsem__loop_generation(const redsem__loop *l);
/* The engine that the calling thread steps or starts an op on now, if it is one of c's
 * (NULL: none): an op's call builders run there, and what they ask of the node serving a
 * key (its clock, its address) is that engine's: redsem__loop_node (one server's, or in a
 * cluster the node its map says serves key; NULL: none known). inflight: requests in flight
 * on its request connections (not the BLPOP). */
redsem__loop *redsem__loop_current(const redsem_client *c);
redsem__node *redsem__loop_node(redsem__loop *l, const char *key);
size_t redsem__loop_inflight(const redsem__loop *l);
/* A Cluster client's engine's slot map and node table (NULL: not a cluster), for the
 * white-box tests. */
redsem__topo *redsem__loop_topo(redsem__loop *l);
void redsem__loop_free(redsem__loop *l);

/* The renewer of the permits granted on one event loop (renew.c): the client's renewer's
 * queues, rounds and judgement without a thread, on the loop's thread. new: registered in
 * c (the lost callbacks of auto_renew run on the loop's thread; poke_fd is written to when
 * a renewal falls due earlier than next said); adopt: p, just granted there, is renewed by
 * it (a reference, until p is freed); next: when run must be called (REDSEM__FOREVER:
 * never), and in *busy (may be NULL) whether renewals are in flight; run: send the
 * renewals due on l, whose replies redsem__loop_step judges; close: the loop ends, its permits' renewal stops (as by
 * redsem_permit_stop_renewal) and their auto_renew goes to the client's thread from now
 * on; put, once l is freed: the loop's reference is let go of. All on the loop's thread
 * (adopt: any, before p is handed out). */
int redsem__renew_loop_new(redsem_client *c, int poke_fd, redsem__renewer **ret);
void redsem__renew_loop_adopt(redsem__renewer *r, redsem_permit *p);
int64_t redsem__renew_loop_next(redsem__renewer *r, bool *busy);
void redsem__renew_loop_run(redsem__renewer *r, redsem__loop *l);
void redsem__renew_loop_close(redsem__renewer *r);
void redsem__renew_loop_put(redsem__renewer *r);
/* Before any I/O: the fork check, ret_permit, the timeout, and the holder id (given_id
 * validated and copied, or a new random one; NULL is EINVAL when id_required). */
int redsem__acquire_args(redsem_client *c, redsem_permit **ret_permit, int64_t timeout_ms,
                         const char *given_id, bool id_required, char id[REDSEM_ID_BUFSIZE]);
/* Wait for a grant and make it a permit of the given kind for q->handle. */
int redsem__acquire_permit(const redsem__acquirer *q, const redsem__kind *kind, const char *id,
                           int64_t timeout_ms, int64_t lease_ms, redsem_permit **ret_permit);

/* ---------------------------------------------------------------- permits */
enum { REDSEM__HELD = 0, REDSEM__RELEASED = 1, REDSEM__LOST = 2 };


struct redsem_permit {
    const redsem__kind *kind;
    void *handle; /* the redsem_sem or redsem_lock it came from */
    redsem_client *client;
    char id[REDSEM_ID_BUFSIZE];
    uint64_t token;
    int64_t lease_ms;
    _Atomic int64_t deadline_ns; /* validity deadline, monotonic */
    _Atomic int state;           /* REDSEM__HELD / RELEASED / LOST */
    uint32_t weight;             /* permits this permit object stands for (1 for a lock) */
    void *renewal; /* renewer entry, NULL if not renewed (__atomic access; written under the
                    * renewer's lock) */
    redsem__mslot *metrics; /* its name's figures (NULL: none, e.g. adopted) */
    int64_t granted_ns;     /* when its acquire returned (our clock): the hold's start */
    /* granted on an event loop's engine: that loop's renewer, which auto_renew then uses
     * while the loop runs (set before the permit is handed out, never changed); NULL: the
     * client's renewer thread */
    redsem__home *home;
};

/* Refresh p on the server through client c (the renewer passes its own), without touching
 * its state or deadline: REDSEM_OK with *sent_ns (when the request that extended it was
 * sent), REDSEM_ELOST (no longer held: the message says why), REDSEM_EREPLICA, or a fault. */
int redsem__refresh(redsem_client *c, redsem_permit *p, int64_t *sent_ns);
/* The same as a call: redsem__refresh_call builds it in place; redsem__refresh_reply takes
 * the outcome of that call of the given script (rc; on REDSEM_OK its reply r, borrowed, and
 * info) and returns as redsem__refresh. */
void redsem__refresh_call(const redsem_permit *p, redsem__call *call);
int redsem__refresh_reply(redsem_client *c, redsem_permit *p, int script, int rc,
                          const struct redisReply *r, const redsem__req_info *info,
                          int64_t *sent_ns);
/* redsem_permit_refresh() around its call, for a driver that runs the call itself: begin
 * checks p (fork; not held: REDSEM_ESTATE); end takes the call's status and the time its
 * request was sent (REDSEM_OK moves the validity deadline on, REDSEM_ELOST marks p lost)
 * and returns the status. */
int redsem__refresh_begin(redsem_permit *p);
int redsem__refresh_end(redsem_permit *p, int rc, int64_t sent_ns);
/* The same for k permits (1..REDSEM__BATCH_MAX) at once, in one round trip where the client
 * can pipeline (redsem__eval_many); rcs[i] and sent_ns[i] for each. The error text is the
 * last failure's. */
void redsem__refresh_many(redsem_client *c, redsem_permit *const *ps, int k, int *rcs,
                          int64_t *sent_ns);

/* redsem_permit_release() around its call, for a driver that runs the call itself: begin
 * checks p (fork, already released: REDSEM_ESTATE) and stops its renewal; end takes the
 * call's status (REDSEM_OK or REDSEM_ELOST mark p released) and returns it. */
int redsem__release_begin(redsem_permit *p);
int redsem__release_end(redsem_permit *p, int rc);

redsem_permit *redsem__permit_new(const redsem__kind *kind, void *handle, redsem_client *c,
                                  const char *id, const redsem__attempt *att, int64_t lease_ms);
/* Look up a live holder and make a permit object for it (redsem_sem_adopt / lock_adopt). */
int redsem__adopt(redsem_client *c, const redsem__kind *kind, void *handle, const char *id,
                  int64_t lease_ms, const char *k1, const char *k2, const char *k3,
                  redsem_permit **ret_permit);

/* ---------------------------------------------------------------- semaphore / lock */
struct redsem_sem {
    redsem_client *client;
    char *name;
    redsem_strategy strategy;
    _Atomic uint32_t limit; /* as last seen on the server: threads sharing s update it */
    int64_t lease_ms;
    int64_t wait_lease_ms;
    int64_t guard_lease_ms;
    char *k_meta, *k_holders, *k_waiters, *k_signal; /* basic */
    char *k_owners, *k_timeouts, *k_sigprefix, *k_guard; /* fair / locked */
    size_t sigprefix_len;
    _Atomic uint32_t renewed; /* its permits the renewer holds on to: sem_free lets go */
    redsem__mslot *_Atomic metrics; /* its figures (metrics.c), found at the first acquire */
};

struct redsem_lock {
    redsem_client *client;
    char *name;
    int64_t lease_ms;
    bool reentrant;
    char owner[REDSEM_ID_BUFSIZE]; /* reentrant owner identity */
    char *k_mutex, *k_meta, *k_waiters, *k_signal;
    _Atomic uint32_t renewed; /* its permits the renewer holds on to: lock_free lets go */
    redsem__mslot *_Atomic metrics; /* its figures (metrics.c), found at the first acquire */
};



/* ---------------------------------------------------------------- status */
typedef struct redsem__entry {
    char *id;
    uint64_t token;
    int64_t remaining_ms;
    uint32_t weight; /* holders: permits held */
} redsem__entry;

struct redsem_status {
    int strategy;
    bool exists;
    uint32_t limit;
    size_t holder_count, waiter_count;
    size_t nholders, nwaiters;
    redsem__entry *holders, *waiters;
    uint32_t holds;
    uint64_t in_use; /* permits held (weights summed) */
    uint64_t expired; /* leases the clean-up removed without a release (status.lua; metrics) */
    char server[300]; /* the address of the node that serves it ("" if not known) */
};

/* key: the first key of the status call (it names the node that served it). */
int redsem__status_from_reply(redsem_client *c, const char *key, const struct redisReply *r,
                              redsem_status **ret);
/* The status calls, built in place (sem.c, lock.c): kind is "basic", "fair" (the handle's:
 * redsem__sem_status_kind) or "auto" (what the server has); their replies are taken by
 * redsem__status_from_reply with the call's first key. redsem__status_run runs one on the
 * calling thread (status.c). */
void redsem__sem_status_call(const redsem_sem *s, const char *kind, size_t max_entries,
                             redsem__call *call);
const char *redsem__sem_status_kind(const redsem_sem *s);
void redsem__lock_status_call(const redsem_lock *l, size_t max_entries, redsem__call *call);
int redsem__status_run(redsem_client *c, redsem__call *call, redsem_status **ret);

#endif /* REDSEM_INTERNAL_H */
