/* redsem - counting semaphores. */
#ifndef REDSEM_SEMAPHORE_H
#define REDSEM_SEMAPHORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "export.h"
#include "permit.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A semaphore handle: a name, a strategy, a limit and a lease, on one client. Since: 0.1 */
typedef struct redsem_sem redsem_sem;

/**
 * The three strategies (Redis in Action, 6.3). All three keep at most `limit` unexpired
 * leases at any instant, read time only from the server (TIME inside the scripts), and run
 * every operation as one Lua script (EVALSHA), so each step is atomic on the server.
 *
 * BASIC (6.3.1): one sorted set holder -> lease deadline. Cheapest. Waiters are unordered:
 *   whoever retries first after a release wins ("barging"), so a busy client can starve
 *   others.
 * FAIR (6.3.2-6.3.3): requests are served in arrival order: a queue sorted set (waiters by
 *   arrival) and a timeout sorted set (deadlines). A new request is granted iff nobody waits
 *   and its permits fit; otherwise it waits in the queue, and every release hands the freed
 *   permits to the head of the queue while they fit (with weights:
 *   redsem_sem_acquire_n()). A waiter blocked in acquire keeps its place under a short wait
 *   lease that it renews, so permits go to waiters in arrival order and none starves.
 * LOCKED (6.3.4): the fair acquire performed while holding a short-lived guard lock
 *   PREFIX{NAME}:lock (SET NX PX, then compare-and-delete). Two more round trips per attempt
 *   and spurious failures when the guard is busy; see docs/design.md for what the guard buys
 *   now that every script is atomic (nothing) and what it costs.
 */
typedef enum redsem_strategy {
    REDSEM_STRATEGY_BASIC = 1,
    REDSEM_STRATEGY_FAIR = 2,
    REDSEM_STRATEGY_LOCKED = 3
} redsem_strategy;

/** Largest limit (permits) of a semaphore. */
#define REDSEM_LIMIT_MAX 1000000u
/** Smallest lease, ms (below this the drift margin of lease/100 + 2 ms eats the lease). */
#define REDSEM_LEASE_MIN_MS 10
/** Largest lease, ms (30 days). */
#define REDSEM_LEASE_MAX_MS 2592000000LL
/** Longest finite acquire timeout, ms (30 days). */
#define REDSEM_WAIT_MAX_MS 2592000000LL
/** Acquire timeout meaning "wait until a permit comes, however long". */
#define REDSEM_WAIT_FOREVER (-1)
/** Longest semaphore or lock name, bytes. */
#define REDSEM_NAME_MAX 512
/** Longest default wait lease of a queued fair/locked waiter, ms (renewed every third of it);
 * the default is this or the semaphore's lease, whichever is shorter. */
#define REDSEM_DEFAULT_WAIT_LEASE_MS 3000
/** Default lease of the locked strategy's guard lock, ms. */
#define REDSEM_DEFAULT_GUARD_LEASE_MS 1000

/**
 * redsem_strategy_name - "basic", "fair" or "locked"; "lock" for 0 (the status of a lock);
 * "?" for anything else. Returns a static string. Thread safety: any thread. Since: 0.1
 */
REDSEM_API const char *redsem_strategy_name(int strategy);

/**
 * redsem_strategy_parse - the strategy named "basic", "fair" or "locked" (exact, lower case).
 *
 * @name          borrowed; must not be NULL.
 * @ret_strategy  borrowed; must not be NULL; written on REDSEM_OK only.
 * Returns: REDSEM_OK; REDSEM_EINVAL. Thread safety: any thread. Since: 0.1
 */
REDSEM_API int redsem_strategy_parse(const char *name, redsem_strategy *ret_strategy);

/**
 * redsem_sem_open - open (creating on first use) the semaphore NAME.
 *
 * The strategy and limit are recorded on the server the first time the semaphore is used.
 * Opening an existing semaphore with another strategy or another limit fails with
 * REDSEM_ECONFLICT and a message saying what the server has, instead of silently admitting
 * more holders than intended; change the limit with redsem_sem_set_limit(). The lease is per
 * handle: holders of one semaphore may use different leases.
 *
 * @client     borrowed; must not be NULL; must outlive the semaphore.
 * @name       copied; must not be NULL; 1..REDSEM_NAME_MAX bytes of printable ASCII
 *             (0x21..0x7e) other than '{' and '}'.
 * @strategy   REDSEM_STRATEGY_BASIC, _FAIR or _LOCKED.
 * @limit      permits, 1..REDSEM_LIMIT_MAX.
 * @lease_ms   lease of each permit in ms, REDSEM_LEASE_MIN_MS..REDSEM_LEASE_MAX_MS: the
 *             server frees a permit this long after its grant or last refresh.
 * @ret_sem    owned-out; free with redsem_sem_free(). Must not be NULL.
 * Returns: REDSEM_OK; REDSEM_EINVAL (any argument out of range; nothing sent);
 *          REDSEM_ECONFLICT; REDSEM_ENOMEM; REDSEM_ECONN; REDSEM_ETIMEDOUT; REDSEM_ESERVER
 *          (e.g. WRONGTYPE: a key of that name is not ours; nothing is overwritten);
 *          REDSEM_EPERM; REDSEM_EPROTO; REDSEM_EFORKED.
 * Server: one EVALSHA of sem_open.lua: creates PREFIX{NAME}:meta (strategy, limit) if absent,
 *         with a TTL, else compares.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_sem_open(redsem_client *client, const char *name,
                                          redsem_strategy strategy, uint32_t limit,
                                          int64_t lease_ms, redsem_sem **ret_sem);

/**
 * redsem_sem_free - free the handle. NULL is a no-op. Permits from it should be freed first
 * (their leases are not released; they expire on the server). A permit of it still under
 * automatic renewal stops being renewed, as by redsem_permit_stop_renewal(): this waits for
 * a renewal of it in flight (at most until its lost deadline or one command timeout), and no
 * lost callback fires for it; its lease then runs out. Such a permit may afterwards only be
 * read (id, token, validity ...) and freed. May be called from a lost-lease callback
 * (renew.h). Server: none.
 * Thread safety: any thread, once no call on the handle, or on a permit of it, is running or
 * can start. Since: 0.1
 */
REDSEM_API void redsem_sem_free(redsem_sem *sem);

/**
 * redsem_sem_set_wait_lease_ms - lease of this handle's queued waiters (fair and locked).
 *
 * A waiter blocked in redsem_sem_acquire() keeps its place under this lease and renews it
 * every third of it; if the waiter dies, its place is dropped after at most this long. A
 * waiter that dies just as a permit is handed to it (it was at the head of the queue)
 * withholds that permit: on a client of one server without sync replicas for
 * the lease, as a holder that dies just after its grant (the permit is handed over with the
 * waiter's lease, which saves the woken waiter a round trip: docs/design.md section 5,
 * "Direct grants"); otherwise (a Redis Cluster, redsem_options_set_sync_replicas()) until
 * its wait lease ends, so a wait lease longer than the lease makes a crashed waiter cost more
 * than a crashed holder. No effect for the basic strategy (its waiters hold no place).
 *
 * @sem  borrowed; must not be NULL.
 * @ms   REDSEM_LEASE_MIN_MS..REDSEM_LEASE_MAX_MS; default the shorter of
 *       REDSEM_DEFAULT_WAIT_LEASE_MS and the semaphore's lease.
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL sem, or ms out of range). Server: none.
 * Thread safety: before the handle is shared: not while another thread uses it. Since: 0.1
 */
REDSEM_API int redsem_sem_set_wait_lease_ms(redsem_sem *sem, int64_t ms);

/**
 * redsem_sem_set_guard_lease_ms - lease of the locked strategy's guard lock, ms.
 *
 * @sem  borrowed; must not be NULL.
 * @ms   REDSEM_LEASE_MIN_MS..REDSEM_LEASE_MAX_MS; default REDSEM_DEFAULT_GUARD_LEASE_MS. A
 *       holder of the guard that dies blocks every acquire of this semaphore this long, and
 *       so does an acquire whose request timed out or lost its connection while it held the
 *       guard (it leaves the guard to expire rather than wait for the server again).
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL sem, or ms out of range). Server: none.
 * Thread safety: before the handle is shared: not while another thread uses it. Since: 0.1
 */
REDSEM_API int redsem_sem_set_guard_lease_ms(redsem_sem *sem, int64_t ms);

/**
 * Accessors of a semaphore handle. No server I/O; @sem borrowed, NULL gives "", 0, 0, 0.
 * Thread safety: any thread that may use the handle (read-only). Since: 0.1
 *
 * redsem_sem_name      - the name given to redsem_sem_open(); view valid until
 *                        redsem_sem_free().
 * redsem_sem_strategy  - REDSEM_STRATEGY_BASIC, _FAIR or _LOCKED.
 * redsem_sem_limit     - the limit in permits last seen on the server (a
 *                        redsem_sem_set_limit() by anyone is picked up by the next acquire).
 * redsem_sem_lease_ms  - this handle's lease, ms.
 */
REDSEM_API const char *redsem_sem_name(const redsem_sem *sem);
REDSEM_API redsem_strategy redsem_sem_strategy(const redsem_sem *sem);
REDSEM_API uint32_t redsem_sem_limit(const redsem_sem *sem);
REDSEM_API int64_t redsem_sem_lease_ms(const redsem_sem *sem);

/**
 * redsem_sem_try_acquire - take a permit if one is free now; never waits.
 *
 * Exactly redsem_sem_acquire(sem, 0, ret_permit): arguments, ownership, return codes
 * (REDSEM_EBUSY when no permit is free), server requests and thread rules as documented
 * there. The fair and locked strategies grant a try only if nobody is queued (as in Redis in
 * Action 6.3.2 a try never barges ahead of queued waiters) and leave without writing
 * otherwise. Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_sem_try_acquire(redsem_sem *sem, redsem_permit **ret_permit);

/**
 * redsem_sem_acquire - take a permit, waiting up to timeout_ms for one to become free.
 *
 * Waiting does not poll: a release wakes one waiter through a Redis list it blocks on
 * (BLPOP), and a lease that expires wakes the waiters when it is due; a bounded, jittered
 * backoff covers lost wake-ups (50 ms doubling to 1 s; 0.75-1 s for fair and
 * locked waiters of a one-server client, whose wake-ups survive a lost BLPOP). Fair and locked waiters keep their
 * place in the queue (arrival order); basic waiters compete on every wake-up. The call
 * returns by its deadline plus a few ms (one reconnect and one round trip at most). A wait
 * cut short by a lost connection (REDSEM_ECONN) leaves the queue first, with one more
 * attempt on a new connection (which takes a permit handed over meanwhile), so that no
 * registration of it withholds a permit afterwards. A queued fair or locked waiter of a
 * one-server client is granted with its lease and takes the permit from its wake-up, with
 * no request of its own (a direct grant); such a waiter whose wait or attempt
 * fails with any fault leaves the queue first (one more attempt, in which a permit handed
 * over meanwhile is taken) and returns the fault, or, if it could not leave (a timeout: the
 * server is stalled), REDSEM_EUNKNOWN, since the server may still grant it. A queued waiter
 * whose deadline comes leaves the queue the same way before it returns REDSEM_EBUSY; a
 * locked waiter that finds the guard busy then pauses and tries again, for up
 * to one command timeout past its deadline, and if it still cannot leave, a waiter with
 * direct grants returns REDSEM_EUNKNOWN (still queued), the others REDSEM_EBUSY (their entry
 * lapses with its wait lease).
 *
 * @sem         borrowed; must not be NULL.
 * @timeout_ms  0 = try once (fair, locked: granted only if nobody is queued, as in the
 *              book); 1..REDSEM_WAIT_MAX_MS; REDSEM_WAIT_FOREVER.
 * @ret_permit  owned-out; free with redsem_permit_free() (after redsem_permit_release()).
 *              Must not be NULL. Written only on REDSEM_OK.
 * Returns: REDSEM_OK; REDSEM_EBUSY (no permit free, or none became free in time: expected);
 *          REDSEM_EUNKNOWN (the reply of a request that could have granted a permit was
 *          lost: a permit may have been granted in this holder's name within the command
 *          timeout + 100 ms, by the server's clock, and is then held until its lease
 *          expires; or, a fair or locked waiter, it failed while queued and could not leave:
 *          it may be granted until its wait lease ends; retry with redsem_sem_acquire_as(),
 *          the same identifier and a timeout of 1 ms or more to find out, idempotently: a
 *          try, timeout 0, does not leave a queue it is in);
 *          REDSEM_EINVAL; REDSEM_ENOMEM; REDSEM_ECONN; REDSEM_ETIMEDOUT; REDSEM_ESERVER
 *          (with Redis' text: WRONGTYPE, OOM ...; nothing stored is changed; "PARTIAL
 *          semaphore keys partly missing (evicted?)": the meta hash was lost while permits
 *          or waiters are still recorded, refused until they end);
 *          REDSEM_EPERM (NOPERM ...); REDSEM_ECONFLICT (the semaphore was re-created with
 *          another strategy); REDSEM_EPROTO; REDSEM_EFORKED; REDSEM_EREPLICA (with
 *          redsem_options_set_sync_replicas(): granted, but fewer replicas acknowledged it
 *          in time; the permit was given back).
 * Server: per attempt one EVALSHA of basic_acquire.lua or fair_acquire.lua (SCRIPT LOAD of
 *         its body pipelined before it on the client's first call of it; fair, locked: one
 *         more, wake_push.lua, when the attempt granted other waiters; locked: also
 *         guard_acquire.lua,
 *         SET NX PX of the guard, before; fair_acquire.lua checks the guard and deletes it;
 *         a busy guard is retried after 100 us doubling to 5 ms, jittered); while
 *         waiting, BLPOP on the semaphore's wake-up list (basic), or (fair, locked) on the
 *         bell of the client's id list shared by all its waiters (the list is
 *         drained with wake_drain.lua after a wake-up), or in a Redis Cluster on the
 *         waiter's own list.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_sem_acquire(redsem_sem *sem, int64_t timeout_ms,
                                             redsem_permit **ret_permit);

/**
 * redsem_sem_acquire_as - redsem_sem_acquire() with a holder identifier chosen by the caller.
 *
 * Acquire is idempotent per identifier: if this identifier already holds a live permit of
 * the semaphore (because an earlier call's reply was lost), the same permit is returned, its
 * lease renewed from now, with the same fencing token; a second permit is never taken.
 *
 * @holder_id  borrowed; must not be NULL; exactly REDSEM_ID_LEN lower-case hex chars, e.g.
 *             from redsem_id_generate() or redsem_permit_id().
 * Other arguments and returns as redsem_sem_acquire().
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_sem_acquire_as(redsem_sem *sem, const char *holder_id,
                                                int64_t timeout_ms, redsem_permit **ret_permit);

/**
 * redsem_sem_acquire_n - take n permits at once, as one permit object (weighted acquire),
 * waiting up to timeout_ms.
 *
 * All or nothing: the n permits are granted together or not at all, never some of them
 * (so two jobs needing 2 of a limit of 3 cannot deadlock as they can when each takes its
 * permits one by one). Refresh, release, renewal (redsem_permit_auto_renew()) and the
 * fencing token apply to the whole; redsem_permit_weight() returns n. n = 1 is
 * redsem_sem_acquire().
 * basic: granted iff the permits held + n <= limit; a waiter for many permits can be
 * overtaken by smaller requests (basic has no queue). fair and locked: strict arrival order
 * with weights: a request is granted iff the permits held + the permits wanted by the
 * waiters queued ahead of it + n <= limit, so a large request at the head of the queue is
 * never overtaken by smaller ones behind it (no starvation; the permits that free up
 * meanwhile stay free for it). Every step is O(log N) in holders and waiters (design.md,
 * "Weights"). A waiter that leaves the queue from the middle may hold the waiters behind it
 * back (never ahead) until the head of the queue moves past its place.
 *
 * @sem         borrowed; must not be NULL.
 * @n           1..the limit recorded on the server (checked by the script before it writes
 *              anything: this handle's redsem_sem_limit() may be stale).
 * @timeout_ms  as redsem_sem_acquire().
 * @ret_permit  owned-out; as redsem_sem_acquire().
 * Returns: as redsem_sem_acquire(), and REDSEM_EINVAL when n = 0 or n exceeds the limit on
 *          the server (nothing written; a queued waiter whose n exceeds a limit lowered
 *          while it waits leaves the queue and gets REDSEM_EINVAL).
 * Server: as redsem_sem_acquire(); the weight is one more argument of the acquire script;
 *         a weight above 1 is kept in the semaphore's meta hash (w:ID).
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.3
 */
REDSEM_API REDSEM_WUR int redsem_sem_acquire_n(redsem_sem *sem, uint32_t n, int64_t timeout_ms,
                                               redsem_permit **ret_permit);

/**
 * redsem_sem_try_acquire_n - take n permits if they are free now; never waits.
 *
 * Exactly redsem_sem_acquire_n(sem, n, 0, ret_permit) (fair and locked: never ahead of
 * queued waiters). Since: 0.3
 */
REDSEM_API REDSEM_WUR int redsem_sem_try_acquire_n(redsem_sem *sem, uint32_t n,
                                                   redsem_permit **ret_permit);

/**
 * redsem_sem_acquire_as_n - redsem_sem_acquire_n() with a holder identifier chosen by the
 * caller: idempotent as redsem_sem_acquire_as().
 *
 * If the identifier already holds a live permit of the same weight n (an earlier call's
 * reply was lost), that permit is returned, its lease renewed, with the same token. If it
 * holds (or, queued, waits for) another weight, the call fails with REDSEM_EINVAL and
 * changes nothing: one identifier is one permit object; release it first.
 *
 * @holder_id  borrowed; must not be NULL; rules as redsem_sem_acquire_as().
 * Other arguments and returns as redsem_sem_acquire_n().
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.3
 */
REDSEM_API REDSEM_WUR int redsem_sem_acquire_as_n(redsem_sem *sem, const char *holder_id,
                                                  uint32_t n, int64_t timeout_ms,
                                                  redsem_permit **ret_permit);

/**
 * redsem_sem_adopt - a local permit object for a holder identifier that holds a permit now,
 * e.g. one acquired by another process (the CLI's `redsem release NAME ID`).
 *
 * The identifier is the capability: whoever knows it can refresh and release that permit.
 * The permit's token is the holder's, and its validity is computed from the lease the server
 * has left for it (minus the drift margin), counted from when this request was sent.
 *
 * @sem         borrowed; must not be NULL.
 * @holder_id   borrowed; REDSEM_ID_LEN lower-case hex chars; must not be NULL.
 * @ret_permit  owned-out; free with redsem_permit_free(). Written only on REDSEM_OK.
 * Returns: REDSEM_OK; REDSEM_ELOST (no live permit with that identifier); REDSEM_EINVAL;
 *          REDSEM_ENOMEM; REDSEM_ECONN; REDSEM_ETIMEDOUT; REDSEM_ESERVER; REDSEM_EPERM;
 *          REDSEM_EPROTO; REDSEM_EFORKED.
 * Server: one EVALSHA of holder.lua (read-only). Thread safety: any thread, at the same time as
 * others (see "Threads" in redsem/client.h). Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_sem_adopt(redsem_sem *sem, const char *holder_id,
                                           redsem_permit **ret_permit);

/**
 * redsem_sem_set_limit - change the semaphore's limit on the server, for every client.
 *
 * Raising it wakes as many waiters as there are new permits (fair, locked: hands the new
 * permits to the head of the queue while they fit). Lowering it revokes nothing:
 * existing holders keep their permits and new grants resume once fewer than the new limit
 * are held. Other handles pick the new limit up at their next acquire.
 *
 * @sem    borrowed; must not be NULL.
 * @limit  1..REDSEM_LIMIT_MAX.
 * Returns: REDSEM_OK; REDSEM_EINVAL; REDSEM_ECONFLICT (the server has another strategy);
 *          REDSEM_ECONN; REDSEM_ETIMEDOUT; REDSEM_ESERVER; REDSEM_EPERM; REDSEM_EPROTO;
 *          REDSEM_EFORKED.
 * Server: one EVALSHA of set_limit.lua (fair, locked: then one of wake_push.lua if it granted
 * waiters of other clients). Thread safety: any thread, at the same time as others
 * (see "Threads" in redsem/client.h). Since: 0.1
 */
REDSEM_API int redsem_sem_set_limit(redsem_sem *sem, uint32_t limit);

/** Introspection result (opaque). Since: 0.1 */
typedef struct redsem_status redsem_status;

/**
 * redsem_sem_status - what the server holds for this semaphore now (read-only).
 *
 * @sem          borrowed; must not be NULL.
 * @max_entries  how many holders and how many waiters to list, 0..REDSEM_LIMIT_MAX; the
 *               counts are exact whatever this is.
 * @ret_status   owned-out; free with redsem_status_free(). Must not be NULL.
 * Returns: REDSEM_OK (also for a semaphore that does not exist yet: zero holders);
 *          REDSEM_EINVAL; REDSEM_ENOMEM; REDSEM_ECONN; REDSEM_ETIMEDOUT; REDSEM_ESERVER;
 *          REDSEM_EPERM; REDSEM_EPROTO; REDSEM_EFORKED.
 * Server: one EVALSHA of status.lua (no writes; works on a read-only ACL user).
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.1
 */
REDSEM_API int redsem_sem_status(redsem_sem *sem, size_t max_entries,
                                 redsem_status **ret_status);

/**
 * redsem_sem_inspect - redsem_sem_status() by name, without a handle: reads the strategy and
 * limit recorded on the server and records nothing (a semaphore nobody uses stays absent).
 *
 * @client       borrowed; must not be NULL.
 * @name         borrowed; rules as redsem_sem_open().
 * @max_entries  as redsem_sem_status().
 * @ret_status   owned-out; free with redsem_status_free(). redsem_status_exists() is false
 *               (and the counts 0) when the server has no record of NAME.
 * Returns: REDSEM_OK; REDSEM_EINVAL; REDSEM_ENOMEM; REDSEM_ECONN; REDSEM_ETIMEDOUT;
 *          REDSEM_ESERVER; REDSEM_EPERM; REDSEM_EPROTO; REDSEM_EFORKED.
 * Server: one EVALSHA of status.lua (read-only). Thread safety: any thread, at the same time as
 * others (see "Threads" in redsem/client.h). Since: 0.1
 */
REDSEM_API int redsem_sem_inspect(redsem_client *client, const char *name, size_t max_entries,
                                  redsem_status **ret_status);

/** redsem_status_free - free a status; NULL is a no-op.
 * Thread safety: a status is immutable: any thread may read it until it is freed (once).
 * Since: 0.1 */
REDSEM_API void redsem_status_free(redsem_status *status);

/**
 * Accessors of a status (a snapshot: no server I/O). @status borrowed; NULL gives 0 / false.
 * Thread safety: a status is immutable; any thread may read it until it is freed. Since: 0.1
 *
 * redsem_status_strategy       - the strategy recorded on the server; 0 for a lock, or when
 *                                the semaphore does not exist (redsem_status_exists()).
 * redsem_status_exists         - whether the server has a record of it at all.
 * redsem_status_limit          - limit (permits) recorded on the server; 1 for a lock; 0 if
 *                                it does not exist.
 * redsem_status_holder_count   - exact number of live (unexpired) holders.
 * redsem_status_waiter_count   - exact number of live registered or queued waiters.
 * redsem_status_holders_listed - how many holders are listed (at most max_entries; fair
 *                                and locked with very many waiters: possibly fewer, as
 *                                status reads at most 4 x max_entries + 1024 deadlines).
 * redsem_status_waiters_listed - how many waiters are listed (at most max_entries).
 * redsem_status_hold_count     - a lock's reentrant hold count (0 if free or not
 *                                reentrant-held); 0 for a semaphore.
 * redsem_status_permits_in_use - permits held by the live holders, their weights summed
 *                                (redsem_sem_acquire_n()); equals the holder count when
 *                                every holder holds one. Since: 0.3
 */
REDSEM_API int redsem_status_strategy(const redsem_status *status);
REDSEM_API bool redsem_status_exists(const redsem_status *status);
REDSEM_API uint32_t redsem_status_limit(const redsem_status *status);
REDSEM_API size_t redsem_status_holder_count(const redsem_status *status);
REDSEM_API size_t redsem_status_waiter_count(const redsem_status *status);
REDSEM_API size_t redsem_status_holders_listed(const redsem_status *status);
REDSEM_API size_t redsem_status_waiters_listed(const redsem_status *status);
REDSEM_API uint32_t redsem_status_hold_count(const redsem_status *status);
REDSEM_API uint64_t redsem_status_permits_in_use(const redsem_status *status);

/**
 * redsem_status_server - the address of the Redis node that serves the semaphore or lock, as
 * the client knew it when the status was read: "host:port" ("[v6]:port"), or the socket path
 * of a unix:// URL. Under Sentinel the primary's address; in a Redis Cluster the primary
 * serving the hash slot of the name's keys (after any redirection the status call followed).
 *
 * @status  borrowed; NULL gives "".
 * Returns: a view valid until redsem_status_free(); "" if the address is not known.
 * Thread safety: a status is immutable: any thread may read it until it is freed (once).
 * Since: 0.3
 */
REDSEM_API const char *redsem_status_server(const redsem_status *status);

/**
 * redsem_status_holder - the i-th listed holder (by lease deadline; lock: the owner).
 *
 * @i                 0..holders_listed-1.
 * @ret_id            borrowed, may be NULL; receives a view valid until redsem_status_free().
 * @ret_token         may be NULL; the holder's fencing token.
 * @ret_remaining_ms  may be NULL; lease left, by the server's clock, ms.
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL status or i out of range).
 * Thread safety: a status is immutable: any thread may read it until it is freed (once). Since: 0.1
 */
REDSEM_API int redsem_status_holder(const redsem_status *status, size_t i, const char **ret_id,
                                    uint64_t *ret_token, int64_t *ret_remaining_ms);

/**
 * redsem_status_holder_weight - how many permits the i-th listed holder holds.
 *
 * @status  borrowed; NULL gives 0.
 * @i       0..holders_listed-1; out of range gives 0.
 * Returns: the holder's weight, >= 1 (1 for a lock's owner).
 * Thread safety: a status is immutable: any thread may read it until it is freed (once).
 * Since: 0.3
 */
REDSEM_API uint32_t redsem_status_holder_weight(const redsem_status *status, size_t i);

/**
 * redsem_status_waiter - the i-th listed waiter: fair/locked in queue order, with the wait
 * lease left; basic and lock waiters are registered too (unordered, by wait deadline).
 *
 * Arguments as redsem_status_holder(); ret_ticket receives the waiter's place in the queue
 * (fair/locked: its end position, each waiter ahead counting its weight; 0 for
 * basic and lock waiters).
 * Thread safety: a status is immutable: any thread may read it until it is freed (once). Since: 0.1
 */
REDSEM_API int redsem_status_waiter(const redsem_status *status, size_t i, const char **ret_id,
                                    uint64_t *ret_ticket, int64_t *ret_remaining_ms);


#ifdef __cplusplus
}
#endif

#endif /* REDSEM_SEMAPHORE_H */
