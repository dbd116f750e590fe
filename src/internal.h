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

/* ------------------------------------------------- routed calls (pool.c, drive_threads.c) */
/* The object layer's requests, each sent to the node that serves its key (topo/topo.h):
 * redsem__request and the routed calls below on a borrowed lane (pool.c), the script calls
 * through the shared connection or alone (drive_threads.c). */
int redsem__request(redsem_client *c, const redsem__args *a, int flags, int64_t deadline_ns,
                    struct redisReply **ret_reply, redsem__req_info *info);
int redsem__eval(redsem_client *c, int script, int nkeys, const redsem__args *keys_and_args,
                 int flags, redsem__req_info *info, struct redisReply **ret_reply);
/* k (1..REDSEM__BATCH_MAX) script calls of the calling thread at once: in one write and one
 * round trip when the client has one server (not a cluster), else one after another. Each
 * item's errmsg must be a buffer of its own (REDSEM__ERRMSG_LEN bytes), its text given. */
void redsem__eval_many(redsem_client *c, redsem__batch_item *items, int k);
struct redsem__wake_grant; /* below, with the acquire loop's state */
/* Wait up to wait_ms (our clock: never past hard_deadline_ns) for an element on the list key,
 * popping it: REDSEM_OK with *signaled, or a fault. One server: through the client's shared
 * wait (wake.c), one BLPOP for every thread waiting; a cluster: alone, on a wait lane.
 * since_ns: when the caller began waiting (its acquire's start, our clock): of the waiters on
 * one list, the one waiting longest gets its element. elem: NULL, or (a fair waiter of a
 * one-server client, whose key is then the client's bell, c->wake_bell) the element of its
 * client's id list that alone wakes it, "<id> <meta key>"; one drained for it since its
 * last wait, while it was not registered, ends this one at once (signaled). grant: NULL, or
 * where the direct grant that element carried goes (token 0 if none; see acquire.c). */
int redsem__blpop(redsem_client *c, const char *key, size_t keylen, const char *elem,
                  int64_t wait_ms, int64_t hard_deadline_ns, int64_t since_ns, bool *signaled,
                  struct redsem__wake_grant *grant);
/* The same on a wait lane of its own, routed to the node serving key (pool.c). */
int redsem__blpop_alone(redsem_client *c, const char *key, size_t keylen, int64_t wait_ms,
                        int64_t hard_deadline_ns, bool *signaled);
/* One call on a borrowed lane (request or wait), run on the node serving key. */
int redsem__routed(redsem_client *c, bool for_wait, const char *key, size_t len, int flags,
                   redsem__req_info *info, redsem__node_call call, void *arg);
/* The address of the node serving key now ("host:port" or a socket path; "" if not known). */
void redsem__served_by(redsem_client *c, const char *key, char *buf, size_t len);
/* The not-after time for an acquire on key (node.h), and a server clock seen in its reply. */
int64_t redsem__not_after_us(redsem_client *c, const char *key);
void redsem__note_server_clock(redsem_client *c, const char *key, int64_t server_us,
                               int64_t recv_ns);

int redsem__set_err(redsem_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* With sync_replicas: REDSEM_EREPLICA when fewer replicas acknowledged the refresh of info
 * than required (the message says so); REDSEM_OK otherwise. */
int redsem__refresh_synced(redsem_client *c, const redsem__req_info *info);
void redsem__clear_err(redsem_client *c);
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
     * it granted (redsem__wake_push): the driver pushes them before it hands the reply on */
    const char *wake_prefix;
    int64_t cap_ns; /* 0, or the call's own deadline (CLOCK_MONOTONIC ns; as
                     * redsem__call_cap_set) */
} redsem__call;
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
/* Append the call's n keys (before any argument); nkeys becomes their count. */
void redsem__call_keys(redsem__call *call, int n, const char *const keys[]);
/* The blocking driver: run call on the calling thread (redsem__eval under its cap, then the
 * wake-ups its reply carries): redsem__eval's codes, *ret_reply (owned by the caller) on
 * REDSEM_OK. */
int redsem__call_run(redsem_client *c, redsem__call *call, redsem__req_info *info,
                     struct redisReply **ret_reply);

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


/* One set of connections of a client: a topology (its nodes, each with one connection) and
 * the context its layers share. Used by one thread at a time, borrowed from the client's pool
 * for one routed call (pool.c). */
typedef struct redsem__lane {
    redsem__ctx ctx;
    redsem__topo topo;
    struct redsem__lane *next_idle;
    bool for_wait;  /* a wait lane (BLPOP), not a request lane */
    uint64_t epoch; /* the pool's fault epoch its connections have seen (pool.c) */
    int64_t queued_since; /* the borrower waited for it since then (0: it did not) */
} redsem__lane;

/* The shared connection of a client with one server (drive_threads.c): the script calls of every
 * thread go into one pipe (node/conn.h), several batches in flight at once. It holds a request
 * lane of the pool while requests are in flight on it and gives it back when they are all
 * answered. The threads waiting for replies drive it in turn (one reads and hands the others
 * their replies); see docs/design.md section 13. */
typedef struct redsem__drive {
    pthread_mutex_t mu;
    pthread_cond_t lane_cv; /* a lane came (or not) for the thread that went for one */
    redsem__lane *lane;     /* held while requests are in flight; NULL: none */
    redsem__pipe pipe;      /* on the held lane's node's connection */
    int users;    /* threads with a call in it, not finished yet (the lane stays held) */
    bool getting; /* a thread is borrowing a lane for it */
    bool reading; /* a thread holds the reader role (polls the socket, steps the pipe) */
    bool retire;  /* take no more requests: give the lane back once drained */
    bool drop;    /* ... closing its connection (a fault, READONLY, a moved primary) */
    /* the threads' wake-ups (drive_threads.c): free ones, every one made (freed with the client),
     * and those whose calls ended in the step under way, posted once the mutex is let go */
    struct drive_waker *free_wakers, *all_wakers;
    struct drive_waker *posts[64];
    int nposts;
} redsem__drive;

struct redsem_client {
    /* the settings it was made with */
    redsem__endpoint ep;
    redsem__tls_opts tls;
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    int64_t retry_ms;
    int sync_replicas; /* > 0: grants and refreshes must reach this many replicas (WAIT) */
    int64_t sync_timeout_ms;
    int max_connections; /* request lanes at most */
    redsem__node_cfg cfg;
    redsem__clock clock; /* the server's, shared by the lanes (not in a cluster) */
    _Atomic size_t seed_first; /* a cluster's seed that last gave a lane the map (topo.h) */
    redsem__script_cache scripts; /* what the server has cached, shared the same way */
    redsem__sentinel_watch *sentinel_watch; /* Sentinel: the lanes' shared watch (topo.h) */
    char *prefix;
    size_t prefix_len;
    pid_t pid; /* owner process */
    uint64_t serial; /* unique in the process: keys the per-thread error texts (pool.c) */
    /* The pool (pool.c): every lane made (freed with the client), the idle ones of each
     * kind (LIFO, so one thread keeps reusing one connection), request lanes made or being
     * made. */
    pthread_mutex_t pool_mu;
    redsem__lane **lanes;
    size_t nlanes, lanes_cap;
    redsem__lane *idle_req, *idle_wait;
    int nreq;
    struct pool_waiter *queue_head, *queue_tail; /* threads waiting for a request lane */
    atomic_int queued; /* how many (read without pool_mu by the shared connection) */
    bool drive_on;       /* one server (not a cluster): script calls go through drive */
    redsem__drive drive;
    uint64_t fault_epoch; /* bumped by a call that lost its connection */
    uint64_t pool_waits;
    uint64_t direct_grants; /* atomic adds (acquire.c), atomic loads */
    /* counters of event-loop engines (redsem__stats_attach), and of those gone */
    redsem__ctx **stats_ctx;
    size_t nstats_ctx, stats_ctx_cap;
    redsem_client_stats stats_gone;
    pthread_mutex_t renew_mu; /* serialises starting the renewer */
    /* The shared wait (wake.c): the threads waiting for a wake-up, one of which (the
     * leader) runs one BLPOP on all their lists and the control list wake_ctl. */
    pthread_mutex_t wake_mu;
    struct redsem__wentry *wv; /* the registered waiters (wake.c), wn of wcap */
    int wn, wcap, wnparked;
    bool wake_leading; /* a leader exists */
    bool wake_blocked; /* the leader is inside its BLPOP */
    bool wake_poked;   /* wake_ctl was pushed since that BLPOP started */
    int64_t wake_until, wake_hard; /* that BLPOP's timeout and hard deadline */
    char *wake_ctl;
    char *wake_ids;  /* this client's list of fair wake-ups: {prefix}wake:<tag>:ids */
    char *wake_bell; /* its bell (wake_ids + ":bell"), which the shared BLPOP watches */
    bool wake_drain_due; /* a bell may have been lost: the next lead drains first */
    uint64_t wake_skip;     /* the element a bell gave, which the next drain returns too */
    uint64_t *wake_recent;  /* the last elements drains gave (WAKE_RECENT_MAX hashes) */
    unsigned wake_recent_next;
    struct redsem__wake_pend *wake_pend; /* ids popped for waiters between attempts */
    /* the leader's BLPOP keys (copies: a waiter may leave meanwhile; NULL when free) and
     * their lengths, WAKE_KEYS_MAX each, made with the client */
    const char **wake_keys;
    size_t *wake_lens;
    redsem__renewer *renewer; /* NULL unless automatic renewal was enabled (atomic access) */
    const redsem__renew_ops *renew_ops; /* set with renewer, or with a loop's renewer */
    redsem__renewer *loop_renewers; /* the running event loops' renewers (under renew_mu) */
    struct redsem__metrics *metrics; /* what it recorded (record.c) */
};

/* Borrow a lane (request or wait) of c's pool, and give it back; rc: the call's outcome
 * (a lost connection makes the pool's other connections suspect). pool.c. */
int redsem__lane_get(redsem_client *c, bool for_wait, redsem__lane **ret);
void redsem__lane_put(redsem_client *c, redsem__lane *l, int rc);
/* The counters of a connection set that is not a lane (an event-loop engine, drive_loop.c):
 * attached, they are summed into redsem_client_get_stats() with the lanes'; detached (before
 * ctx goes), what they counted is kept in the client's. client.c, under the pool's lock. */
void redsem__stats_attach(redsem_client *c, redsem__ctx *ctx);
void redsem__stats_detach(redsem_client *c, redsem__ctx *ctx);
/* Make a lane of c's pool (request or wait), not connected yet: it connects on its first
 * request, or by redsem__topo_connect (client creation). REDSEM_OK or a fault (set on c). */
int redsem__lane_new(redsem_client *c, bool for_wait, redsem__lane **ret);
/* A borrowed lane's caps for one call: the calling thread's own (redsem__call_cap_set), and
 * its wait's (a wait for the lane, redsem__eval_wait_cap_set). */
void redsem__lane_caps(const redsem_client *c, redsem__lane *l);
/* drive_threads.c, from redsem_client_free(): free the shared connection's wake-ups and
 * output buffer (its lane is closed with the pool). */
void redsem__drive_free(redsem__drive *d);
/* Copy an error text (REDSEM__ERRMSG_LEN bytes at most). */
void redsem__text_copy(char *dst, const char *src);
/* wake.c: set up c's shared wait (its control list's name, the leader's key arrays).
 * REDSEM_OK or REDSEM_ENOMEM. */
int redsem__wake_init(redsem_client *c);
/* wake.c, from redsem_client_free(): free what redsem__wake_init() made; in a forked child
 * also the parent's parked waits and the key copies of its leader's round (no thread of the
 * child runs the shared wait: memory only). */
void redsem__wake_free(redsem_client *c);

/* Cap the deadlines of the calling thread's calls on c (0: no cap of its own): they wait
 * for a connection and for replies until cap_ns (CLOCK_MONOTONIC) at most, jump the queue of
 * threads waiting for a connection, and are never batched with other threads' calls. Set
 * by the renewer around each round of renewals and by an acquire leaving a queue; reset to 0
 * after (pool.c). */
void redsem__call_cap_set(const redsem_client *c, int64_t cap_ns);
/* The calling thread's cap on c set by redsem__call_cap_set (0: none). */
int64_t redsem__call_cap(const redsem_client *c);
/* The end of the command timeout of a script call of the calling thread that waited for the
 * shared connection's lane and now goes alone (redsem__eval), 0 to clear it: it caps that
 * call's wait for a request lane and its first attempt, not its retry window (pool.c). */
void redsem__eval_wait_cap_set(int64_t cap_ns);
/* The calling thread's error text for c: a buffer of REDSEM__ERRMSG_LEN bytes that the
 * thread's next call on c may overwrite (pool.c). */
char *redsem__errbuf(const redsem_client *c);
/* The renewer of c, or NULL (an atomic read: another thread may be starting it). */
redsem__renewer *redsem__renewer_of(const redsem_client *c);

/* Open a client (redsem_client_new and redsem_client_new_verbose). */
int redsem__client_open(const redsem_options *o, redsem_client **ret, char *err, size_t errlen);

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
     * c) or the call's code. Run by redsem__release (permit.c) on the calling thread. */
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
     * Run by a driver: redsem__attempt_run on the calling thread. */
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
} redsem__acquirer;

/* Parse the {status, a, b, now} reply of an acquire script into att. */
int redsem__parse_attempt(redsem_client *c, const struct redisReply *r, redsem__attempt *att,
                          const char *what);

/* wake.c: a script's reply that came with wake-ups for waiters it granted ({'wake', reply,
 * kind, target, element, ...}: prelude.lua's grant_heads, rate.lua): *reply becomes the
 * script's own reply (owned by the caller; the wrapper is freed), and the wake-ups are pushed
 * with wake_push.lua, whose KEYS name the lists: a kind-'i' target only if it is an id list
 * of this client's prefix (PREFIXwake:<16 hex>:ids, and not in a cluster), a kind-'s'
 * target (a holder id) as sigprefix + id. A wake-up that cannot be pushed (a fault, a
 * planted name) is dropped: the grant stands and its waiter's poll finds it; the calling
 * thread's error text is kept. Any other reply is left as it is. Returns REDSEM_OK. */
int redsem__wake_push(redsem_client *c, const char *sigprefix, struct redisReply **reply);
/* redsem__wake_push in parts, for a driver that sends the pushes itself. unwrap: a reply
 * with wake-ups becomes the script's own in *reply, and the wrapper is returned (owned by
 * the caller, freed with freeReplyObject); NULL (*reply untouched) if it has none. push_call:
 * build in wc the wake_push.lua call for the wake-ups of the wrapper r from its element
 * *from (2 at first) on, at most REDSEM__WAKE_PUSH_MAX of them, skipping names that are not
 * a waiter's list; *from: the element after the last one taken. false: none left. */
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
/* Waits registered in the client's shared wait now, parked ones included (wake.c; for the
 * white-box tests). */
int redsem__wake_waiters(redsem_client *c);

/* Whether any wait is registered in the client's shared wait now (wake.c); O(1). */
bool redsem__wake_any(redsem_client *c);
/* Wake the shared-wait waiters whose cancel flag is set (wake.c); may send one request. */
void redsem__wake_cancelled(redsem_client *c);
/* A parked wait (wake.c): as redsem__blpop(), but no thread sleeps while it lasts. It is
 * registered in the shared wait, and on_done(arg, rc, signaled) runs once when it ends
 * (popped, timed out, cut, cancelled, or the shared BLPOP failed: rc and the error text in
 * errmsg, a buffer of REDSEM__ERRMSG_LEN bytes that must live until then), under the wait's
 * lock, on the thread that leads the shared wait: it must only queue the work. When no
 * thread leads, the caller's thread leads (this call then returns when no parked wait is
 * left); when the lead must pass and only parked waits are left, need_lead(arg) asks for a
 * thread, which calls redsem__wake_lead() (false: this owner cannot, being freed; the next
 * parked wait's owner is asked). A lead taken here or there ends early when *stop
 * (may be NULL) is set, say by the owner being freed: redsem__wake_cancelled() then ends its
 * running BLPOP, and the role passes on. Returns REDSEM_OK (registered), 1 (cancel already
 * set: not registered, on_done not called), 2 (elem came already: not registered, on_done
 * not called; the wait is over, signaled) or REDSEM_ENOMEM. Not for a cluster client.
 * since_ns, elem: as redsem__blpop()'s. */
typedef void (*redsem__park_fn)(void *arg, int rc, bool signaled);
int redsem__wake_park(redsem_client *c, const char *key, size_t keylen, const char *elem,
                      int64_t wait_ms, int64_t hard_deadline_ns, int64_t since_ns,
                      const atomic_bool *cancel, char *errmsg,
                      struct redsem__wake_grant *grant, redsem__park_fn on_done,
                      bool (*need_lead)(void *arg), void *arg, const atomic_bool *stop);
/* Lead the shared wait on this thread while parked waits are left, nobody else leads and
 * *stop (may be NULL) is not set. */
void redsem__wake_lead(redsem_client *c, const atomic_bool *stop);

int redsem__acquire_loop(const redsem__acquirer *acq, const char *id, int64_t timeout_ms,
                         redsem__attempt *att);

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
/* acquire_step()'s "run the attempt s->att_mode (redsem__attempt_run), set s->att_rc, s->att
 * and s->att_info, and call again"; REDSEM__NAP: the same once the clock reaches
 * s->nap_until_ns (a locked attempt found the guard busy). An attempt's "next call due"
 * (redsem__acquirer). Internal codes, as REDSEM__WAIT. */
#define REDSEM__ATTEMPT (-1002)
#define REDSEM__NAP (-1003)
/* The blocking driver of one attempt: its calls on the calling thread (redsem__call_run),
 * each under cap_ns (0: none). REDSEM_OK with *att, or a code (info->maybe_applied). */
int redsem__attempt_run(const redsem__acquirer *q, const char *id, int mode, int64_t cap_ns,
                        redsem__attempt *att, redsem__req_info *info);
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
/* One script call on the loop: build(arg, call) builds it in place; reply(arg, rc, r, info)
 * takes its outcome (rc; on REDSEM_OK its reply r, borrowed) and returns the operation's
 * status, which done(arg, status, NULL) is given, as for an acquire. */
typedef int (*redsem__loop_reply)(void *arg, int rc, const struct redisReply *r,
                                  const redsem__req_info *info);
int redsem__loop_call(redsem__loop *l, void (*build)(void *arg, redsem__call *call),
                      redsem__loop_reply reply, redsem__loop_done done, void *arg);
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
size_t redsem__loop_pending(const redsem__loop *l);
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
    uint32_t limit_seen;         /* semaphore limit when granted (fair release hint) */
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

/* Release p on the server through client c, without touching renewal or its state: its
 * kind's release call on the calling thread (redsem__call_run). */
int redsem__release(redsem_client *c, redsem_permit *p);
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
