/* redsem - the topology layer: which node serves a key. A standalone server (one node at a
 * fixed address), a Sentinel-managed primary (one node whose address the Sentinels give: from
 * the client's subscription to their announcements, or asked at a reconnect while it is
 * down; sentinel.c), or a Redis Cluster (cluster.c: one node per primary, chosen
 * by the key's hash slot, redirections followed). Every key of one semaphore or lock shares a
 * hash tag, so one key routes a whole call. Not API. */
#ifndef REDSEM_TOPO_H
#define REDSEM_TOPO_H

#include "node/node.h"

enum { REDSEM__TOPO_SINGLE = 1, REDSEM__TOPO_SENTINEL = 2, REDSEM__TOPO_CLUSTER = 3 };

#define REDSEM__SLOTS 16384
/* CLUSTER: the nodes an engine's topology holds at once (primaries of the map, seeds, nodes in
 * use); a node that left the map is dropped (redsem__cluster_sweep), so addresses may change
 * any number of times over a client's life. */
#define REDSEM__CLUSTER_NODES_MAX 256
/* CLUSTER: a node out of the slot map (an old address, a demoted primary, an ASK target) that
 * is not a seed and has had no call for this long is dropped (its connection closed) at the
 * next routed call; a full table drops such nodes at once, however recently used. */
#define REDSEM__CLUSTER_DROP_MS 1000

typedef struct redsem__topo {
    int kind;
    redsem__node single; /* the one server; under Sentinel, the current primary */
    /* The URL's endpoint. SENTINEL: the Sentinels (tried in order; the first that answers
     * moves to the front, as the Redis "Sentinel clients" guide says), the primary's name,
     * their credentials. CLUSTER: the seed nodes and every node's credentials. */
    redsem__endpoint given;
    size_t first;
    /* SENTINEL: the client's watch of the Sentinels' announcements (sentinel.c), shared by
     * its engines, not owned; NULL: none (every resolve asks the Sentinels). */
    struct redsem__sentinel_watch *watch;
    redsem__ctx *ctx;
    /* CLUSTER: the nodes known (primaries of the slot map, seeds, ASK targets, nodes that
     * left the map and are not dropped yet), each with its own connection and script cache,
     * connected on first use; nodes has REDSEM__CLUSTER_NODES_MAX entries, of which the
     * first nnodes are used, NULL marking a dropped node's free entry (indices never move);
     * slots[s] is 1 + the index in nodes of the primary serving slot s, 0 if not known. The
     * topology belongs to one engine, used by one thread at a time: a node pointer is only
     * held within one call or step of the engine that owns the topology. */
    redsem__node_cfg cfg;
    redsem__node **nodes;
    size_t nnodes;
    uint16_t *slots;
    int64_t refreshed_ns; /* when the slot map was last read (CLUSTER SLOTS) */
    int64_t swept_ns;     /* when nodes out of the map were last dropped */
    /* the index in given.hosts of the seed that last gave an engine of the client the map:
     * an engine without a map yet asks it first (a seed that hangs costs one engine only);
     * the client's, shared by its engines; NULL: none */
    _Atomic size_t *seed_first;
    bool sweep_due;       /* a node was added or the map changed since */
} redsem__topo;


/* Set up the topology of ep without connecting. REDSEM_OK, EINVAL or ENOMEM (reason in err). */
int redsem__topo_init(redsem__topo *t, redsem__ctx *ctx, const redsem__endpoint *ep,
                      const redsem__node_cfg *cfg, char *err, size_t errlen);
void redsem__topo_close(redsem__topo *t);
/* The node that serves key (len bytes) as far as the topology knows now; key may be NULL for
 * a call that names no key. NULL only in a cluster whose map has no owner for its slot. */
redsem__node *redsem__topo_node(redsem__topo *t, const char *key, size_t len);

/* sentinel.c: the primary's address into n->ep (the node's resolve hook): the watch's, while
 * it is subscribed (no round trip); else the Sentinels of t are asked in turn, and the first
 * that answers also takes the watch's subscription. REDSEM_OK; REDSEM_ECONN (no Sentinel
 * answered, or none knows the primary: err says what each said); REDSEM_ETIMEDOUT;
 * REDSEM_EPERM (a Sentinel refused the credentials); REDSEM_ETLS (every Sentinel that was
 * reached refused TLS: its certificate did not verify); REDSEM_ENOMEM. */
int redsem__sentinel_resolve(void *topo, redsem__node *n, int64_t deadline_ns, char *err,
                             size_t errlen);
/* sentinel.c: the node's moved hook (node.h): reads the watch's pending announcements (at
 * most every few ms; else one atomic load), subscribes again when the subscription was lost
 * (on the next Sentinel, at most once a second; the calling request waits for it), and says
 * whether the primary moved away from n's address (err says where to). Thread-safe (the
 * watch's mutex). */
bool redsem__sentinel_moved(void *topo, redsem__node *n, char *err, size_t errlen);
/* sentinel.c: take the watch's subscription if it has none (lost, or never made), at most
 * every second: the Sentinels of t asked in turn as a resolve asks them, blocking the
 * calling thread up to n's connect timeout; nothing when it is up (one lock, a read of what
 * arrived). The blocking driver calls it before a call of a Sentinel client, outside the
 * engine's lock (drive_sync.c); the engine itself only reads the watch. */
void redsem__sentinel_keep(redsem__topo *t, redsem__node *n);

/* sentinel.c, shared by the blocking resolve and the loop's question (sentinel_loop.c):
 * the non-blocking reads of the watch: redsem__sentinel_watched is the resolve's first part
 * (the watch's address into n->ep while it is subscribed: REDSEM_OK; 1: not known, *first
 * the Sentinel to ask first; REDSEM_ENOMEM), redsem__sentinel_moved_nb the moved hook
 * without its subscribing again (never blocks). */
int redsem__sentinel_watched(void *topo, redsem__node *n, size_t *first, char *err,
                             size_t errlen);
bool redsem__sentinel_moved_nb(void *topo, redsem__node *n, char *err, size_t errlen);
/* The question's arguments (a initialised here): auth, the Sentinels' AUTH (their user and
 * password; only when the URL gives a password), else SENTINEL get-master-addr-by-name. */
void redsem__sentinel_args(const redsem__topo *t, bool auth, redsem__args *a);
/* AUTH's reply r: REDSEM_OK, or REDSEM_EPERM with "AUTH: <text>" in err. */
int redsem__sentinel_judge_auth(const struct redisReply *r, char *err, size_t errlen);
/* The question's reply r: REDSEM_OK with *host (new string) and *port; else ECONN (a nil:
 * "knows no primary named ..."; an error reply), EPERM (NOAUTH, NOPERM, WRONGPASS), EPROTO
 * (malformed) or ENOMEM, with the text in err. */
int redsem__sentinel_judge(const redsem__topo *t, const struct redisReply *r, char **host,
                           int *port, char *err, size_t errlen);
/* One round of questions over the Sentinels, from the first, each once, each given a fair
 * share of the time left (at least 100 ms): round_next names the next one to ask (false: all
 * asked, or the deadline passed), round_failed adds what it said to err ("Sentinel h:p: why;
 * ..."), round_end ends err with " (primary 'name')" and gives the round's code: ECONN, EPERM
 * (one refused the credentials), ETLS (every one refused TLS). */
typedef struct redsem__sentinel_round {
    size_t first, asked, used, refused_tls;
    int worst;
} redsem__sentinel_round;
void redsem__sentinel_round_begin(redsem__sentinel_round *r, size_t first, char *err);
bool redsem__sentinel_round_next(const redsem__topo *t, redsem__sentinel_round *r,
                                 int64_t deadline_ns, size_t *which, int64_t *share_ns);
void redsem__sentinel_round_failed(const redsem__topo *t, redsem__sentinel_round *r,
                                   size_t which, int rc, const char *why, char *err,
                                   size_t errlen);
int redsem__sentinel_round_end(const redsem__topo *t, const redsem__sentinel_round *r,
                               char *err, size_t errlen);

/* sentinel_loop.c: the primary's address asked of the Sentinels without blocking, for an
 * event loop (the loop engine's resolve step, drive_loop.c), as redsem__sentinel_resolve
 * asks them on a calling thread: the watch's address if it is subscribed; else each Sentinel
 * in turn (a round) is dialled (net/dial.c), asked on a pipe ([AUTH] SENTINEL
 * get-master-addr-by-name in one write) and its reply judged, the first that answers moving
 * to the front (t->first). The same codes and texts as the blocking resolve; it takes no
 * subscription (the watch is the blocking client's). Not thread-safe: one loop steps it. */
enum { REDSEM__ASK_IDLE = 0, REDSEM__ASK_DIALING = 1, REDSEM__ASK_ASKING = 2 };
typedef struct redsem__sentinel_ask {
    int state;              /* IDLE: not under way (done, failed, or never started) */
    redsem__topo *t;        /* borrowed */
    redsem__node *n;        /* its ep gets the address (borrowed) */
    redsem__sentinel_round round;
    size_t which;           /* the Sentinel asked now */
    int64_t deadline_ns;    /* the whole question's */
    int64_t share_ns;       /* this Sentinel's */
    redsem__endpoint ep;    /* this Sentinel's (host borrowed from t) */
    redsem__conn conn;
    redsem__dial dial;
    redsem__pipe pipe;
    redsem__preq q;
    size_t qlen;            /* its bytes (AUTH's password wiped) */
    bool auth, replied;
    unsigned gen;           /* bumped when its descriptors may have changed (only grows) */
    char err[512];          /* why it failed */
} redsem__sentinel_ask;
/* Start asking for n's address (n->ep.host, port) within deadline_ns. REDSEM_OK: under way
 * (a->state not IDLE), or done at once (IDLE: the watch knew it); else the failure (a->err). */
int redsem__sentinel_ask_start(redsem__sentinel_ask *a, redsem__topo *t, redsem__node *n,
                               int64_t deadline_ns);
/* What it waits for, as redsem__dial_wants (at most REDSEM__DIAL_SOCKS + 1 descriptors). */
int redsem__sentinel_ask_wants(const redsem__sentinel_ask *a, struct pollfd *w, int max,
                               int64_t *deadline_ns);
/* Do what is due (ready: n descriptors, revents as poll()'s; its deadlines are checked).
 * REDSEM_OK (under way, or done: IDLE, n->ep set), or the failure with its text in a->err. */
int redsem__sentinel_ask_step(redsem__sentinel_ask *a, const struct pollfd *ready, int n);
/* The caller's deadline (earlier than the question's) passed: it ends as the blocking
 * resolve's round ends then (ECONN, what each Sentinel said in a->err). */
int redsem__sentinel_ask_timeout(redsem__sentinel_ask *a);
/* End a question under way (nothing stays open). */
void redsem__sentinel_ask_cancel(redsem__sentinel_ask *a);

/* The watch (sentinel.c): one subscription to +switch-master on one Sentinel and the address
 * it names, shared by every engine of a client (each engine's topology points to it). Made
 * before the engines (NULL: out of memory), freed after them; in a forked child its memory
 * and connection are freed and its mutex left alone (the parent's threads may have held
 * it). */
typedef struct redsem__sentinel_watch redsem__sentinel_watch;
redsem__sentinel_watch *redsem__sentinel_watch_new(void);
void redsem__sentinel_watch_free(redsem__sentinel_watch *w);

/* cluster.c: the hash slot of a key (CRC16-XMODEM of its hash tag, or of the whole key
 * without one, mod 16384: the Redis Cluster specification's HASH_SLOT). */
int redsem__key_slot(const char *key, size_t len);
#define REDSEM__CLUSTER_REFRESH_MS 100
/* Set up a cluster topology from ep's seeds, without connecting. */
int redsem__cluster_init(redsem__topo *t, const redsem__endpoint *ep, const redsem__node_cfg *cfg,
                         char *err, size_t errlen);
/* Replace the slot map by a CLUSTER SLOTS reply r (not freed) that node asked (a node of t:
 * its host stands for an empty one) gave; nodes are made for new addresses, and nodes out of
 * the map dropped if the table is full. REDSEM_OK; REDSEM_EPROTO (a malformed reply, the map
 * unchanged); REDSEM_ESERVER (no slot served, or more than REDSEM__CLUSTER_NODES_MAX nodes in
 * the map); REDSEM_ENOMEM; with the reason in err. Used by cluster.c and the tests. */
int redsem__cluster_read_map(redsem__topo *t, redsem__node *asked, const struct redisReply *r,
                             char *err, size_t errlen);
/* The node at host:port, made (not connected) if new (node_at: a free entry or a new one, or
 * one freed by dropping the nodes out of the map when the table is full); its index in
 * *ret_index. REDSEM_OK, REDSEM_ENOMEM, REDSEM_EINVAL (a TLS file) or REDSEM_ESERVER (the
 * table full of nodes in use), with the reason in t's context. */
int redsem__cluster_node_at(redsem__topo *t, const char *host, int port, size_t *ret_index);
/* Judge a redirection d a node of t gave a call (its REDSEM__EREDIRECT), as every routed
 * call does (the engine's, drive_loop.c): REDSEM_OK: send
 * the call to t->nodes[*ret_index] now, with ASKING first if *asking (an ASK); for a MOVED
 * the map's entry for d->slot points there (set it again after a refresh); *hops counts the
 * redirections of the call (start at 0). REDSEM_ESERVER: nothing ran and nowhere to go yet
 * (TRYAGAIN, CLUSTERDOWN, UNBLOCKED, or more than 16 redirections: the text in t's context):
 * send again after a pause within the retry window. Else node_at's failure. *refresh: the
 * map should be read again (rate-limited by the caller). Counts stats.redirects. */
int redsem__cluster_redirected(redsem__topo *t, const redsem__redirect *d, int *hops,
                               size_t *ret_index, bool *asking, bool *refresh);
/* The engine's part of the table's upkeep (drive_loop.c): touch marks node i used now (a
 * call goes to it); sweep drops the nodes out of the map idle for REDSEM__CLUSTER_DROP_MS
 * (not the seeds), at most every REDSEM__CLUSTER_DROP_MS, and says whether it looked (then
 * the caller closes what it held of the nodes now NULL). */
void redsem__cluster_touch(redsem__topo *t, size_t i);
bool redsem__cluster_sweep(redsem__topo *t);
/* The nodes t holds now (not NULL entries). */
size_t redsem__cluster_live_nodes(const redsem__topo *t);
void redsem__cluster_close(redsem__topo *t);
redsem__node *redsem__cluster_node(redsem__topo *t, const char *key, size_t len);

#endif /* REDSEM_TOPO_H */
