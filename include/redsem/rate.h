/* redsem - rate limits: at most N grants in any rolling window of W ms, on the server's clock.
 *
 * A rate is its own type, not a semaphore mode: a grant is not a holder (it cannot be
 * released, refreshed or renewed: it counts for exactly W ms from the moment the server made
 * it, never less), and the keys mean something else (a log of grant times, not leases). Its
 * keys are PREFIX{NAME}:rate, :rate:grants, :rate:queue, :rate:timeouts and
 * :rate:signal:<id>, apart from the semaphore NAME's and the lock NAME's, but in the same hash
 * tag (one Cluster slot): a rate and a semaphore may share a name, as `redsem run --rate R
 * --limit N NAME` does. See docs/ratelimits.md for the algorithm, its guarantees and how it
 * compares with token buckets, GCRA and fixed windows.
 *
 * Both limits ("at most 10 at once and 100 per minute"): take the rate grant first, then the
 * semaphore's permit (redsem_rate_acquire(), then redsem_sem_acquire()). That order cannot
 * deadlock (a grant is never waited for while a permit is held, and a grant needs nothing
 * given back) and never holds a permit while waiting for the rate. The grant's cost is that a
 * caller who then waits long for a permit has used a slot of the window meanwhile. */
#ifndef REDSEM_RATE_H
#define REDSEM_RATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "export.h"
#include "semaphore.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A rate limit handle: a name, N grants per window of W ms, on one client. Since: 0.3 */
typedef struct redsem_rate redsem_rate;

/** Largest N (grants per window) of a rate. Since: 0.3 */
#define REDSEM_RATE_MAX 1000000u
/** Smallest window, ms: the library's smallest lease (REDSEM_LEASE_MIN_MS). Since: 0.3 */
#define REDSEM_WINDOW_MIN_MS REDSEM_LEASE_MIN_MS
/** Largest window, ms (30 days, the largest lease). Since: 0.3 */
#define REDSEM_WINDOW_MAX_MS REDSEM_LEASE_MAX_MS

/**
 * One grant (REDSEM_OK), or when the next one can come (REDSEM_EBUSY). Filled by the
 * library in caller-owned memory. Since: 0.3
 */
typedef struct redsem_rate_grant {
    /** REDSEM_OK: the fencing token, strictly increasing over the grants of NAME (and the
     * tickets of its waiters); the same for an idempotent retry. 0 otherwise. */
    uint64_t token;
    /** REDSEM_OK: the server's time of the grant, us since the Unix epoch (TIME). The grant
     * counts in every window that contains this instant: until granted_us + W ms. */
    int64_t granted_us;
    /** The server's time when it answered, us since the epoch (0 if no reply). */
    int64_t server_us;
    /** REDSEM_EBUSY: ms until a request made now would be granted, counted from when the
     * call returned: exact when no waiter is queued (the oldest grant of the window lapses
     * then), a lower bound otherwise (exact while the waiters ahead claim their turns). -1
     * otherwise. */
    int64_t retry_after_ms;
    /** The holder identifier the call used (REDSEM_ID_LEN hex chars and a NUL): retry with
     * redsem_rate_acquire_as() and this identifier after REDSEM_EUNKNOWN. */
    char id[REDSEM_ID_BUFSIZE];
} redsem_rate_grant;

/** A rate's window as the server has it now (redsem_rate_status(), redsem_rate_inspect()).
 * Since: 0.3 */
typedef struct redsem_rate_info {
    bool exists;              /**< false: nothing recorded under NAME (it expired after a
                                   minute idle, or was never used); then all else is 0, but
                                   for redsem_rate_status() limit and window_ms are the
                                   handle's */
    uint32_t limit;           /**< N */
    int64_t window_ms;        /**< W */
    uint32_t in_window;       /**< grants made in (now - W, now] */
    size_t waiters;           /**< queued waiters (live wait leases) */
    int64_t next_free_ms;     /**< ms until a new request's turn: 0 = now (see retry_after_ms) */
    uint64_t last_token;      /**< the last fencing token or ticket drawn; 0 none */
    int64_t server_us;        /**< the server's time of this view, us since the epoch */
} redsem_rate_info;

/**
 * redsem_rate_open - open (creating on first use) the rate limit NAME: at most @n grants in
 * any window of @window_ms.
 *
 * N and W are recorded on the server the first time; opening NAME with another N or W fails
 * with REDSEM_ECONFLICT (and the server's values in the message) instead of letting two
 * callers count against different limits.
 *
 * @client     borrowed; must not be NULL; must outlive the rate.
 * @name       copied; must not be NULL; 1..REDSEM_NAME_MAX bytes of printable ASCII
 *             (0x21..0x7e) other than '{' and '}'.
 * @n          grants per window, 1..REDSEM_RATE_MAX.
 * @window_ms  the window, ms, REDSEM_WINDOW_MIN_MS..REDSEM_WINDOW_MAX_MS.
 * @ret_rate   owned-out; free with redsem_rate_free(). Must not be NULL.
 * Returns: REDSEM_OK; REDSEM_EINVAL (any argument out of range; nothing sent);
 *          REDSEM_ECONFLICT (NAME records another N or W; nothing written); REDSEM_ENOMEM;
 *          REDSEM_ECONN; REDSEM_ETIMEDOUT; REDSEM_ESERVER (e.g. WRONGTYPE: a key of that name
 *          is not ours; nothing is overwritten); REDSEM_EPERM; REDSEM_EPROTO; REDSEM_EFORKED.
 * Server: one EVALSHA of rate.lua (mode open): creates PREFIX{NAME}:rate (N, W) with a TTL
 *         if absent, else compares.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.3
 */
REDSEM_API REDSEM_WUR int redsem_rate_open(redsem_client *client, const char *name, uint32_t n,
                                           int64_t window_ms, redsem_rate **ret_rate);

/**
 * redsem_rate_free - free the handle; NULL is a no-op. Grants are not affected (they lapse
 * by themselves). Server: none. Thread safety: any thread, once no call on the handle is running or
 * can start. Since: 0.3
 */
REDSEM_API void redsem_rate_free(redsem_rate *rate);

/**
 * redsem_rate_try_acquire - take a grant now, or say when the next one can come.
 *
 * Granted iff the grants made in the last W ms (server clock) plus the waiters queued are
 * fewer than N: a try never takes the slot of a queued waiter.
 *
 * @rate       borrowed; from redsem_rate_open(); must not be NULL.
 * @ret_grant  borrowed; caller-owned; must not be NULL; written on every return but
 *             REDSEM_EINVAL for a NULL rate or ret_grant (see redsem_rate_grant: the grant on
 *             REDSEM_OK, retry_after_ms on REDSEM_EBUSY).
 * Returns: REDSEM_OK; REDSEM_EBUSY (N grants in the window, or waiters queued: expected);
 *          REDSEM_EUNKNOWN (the reply was lost: a grant may have been made under
 *          ret_grant->id; redsem_rate_acquire_as() with it tells, idempotently);
 *          REDSEM_EINVAL; REDSEM_ENOMEM; REDSEM_ECONN; REDSEM_ETIMEDOUT; REDSEM_ESERVER;
 *          REDSEM_EPERM; REDSEM_ECONFLICT (NAME was re-created with another N or W);
 *          REDSEM_EPROTO; REDSEM_EFORKED; REDSEM_EREPLICA (with
 *          redsem_options_set_sync_replicas(): granted, but fewer replicas acknowledged it
 *          in time; the grant stays counted, so do not use it).
 * Server: one EVALSHA of rate.lua (mode try); then one of wake_push.lua if the call made
 *         queued waiters entitled to a slot (it wakes them on their lists).
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.3
 */
REDSEM_API REDSEM_WUR int redsem_rate_try_acquire(redsem_rate *rate, redsem_rate_grant *ret_grant);

/**
 * redsem_rate_acquire - take a grant, waiting in FIFO order for up to @timeout_ms.
 *
 * A waiter takes a ticket in the queue and is granted when fewer than N grants of the last
 * W ms plus the waiters ahead of it remain, that is when its turn's slot lapses: the reply
 * says when, and the waiter blocks (BLPOP on its own list) until that instant on the
 * server's clock, not polling (the wait loop of redsem_sem_acquire(), with its jittered
 * backoff of 50 ms doubling to 1 s as a safety net). A waiter ahead that leaves the queue
 * wakes the waiter that it makes entitled. The queue entry is kept under a wait lease
 * (REDSEM_DEFAULT_WAIT_LEASE_MS, renewed every third of it): a waiter that dies loses its
 * place after that.
 *
 * @rate        borrowed; must not be NULL.
 * @timeout_ms  0 tries once (as redsem_rate_try_acquire()); 1..REDSEM_WAIT_MAX_MS;
 *              REDSEM_WAIT_FOREVER.
 * @ret_grant   as redsem_rate_try_acquire().
 * Returns: as redsem_rate_try_acquire(); REDSEM_EBUSY also when the turn did not come in
 *          time (the queue entry is removed; retry_after_ms says when it would have).
 * Server: per attempt one EVALSHA of rate.lua (then one of wake_push.lua if it made other
 *         waiters entitled to a slot); while waiting, BLPOP on
 *         PREFIX{NAME}:rate:signal:<id>.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.3
 */
REDSEM_API REDSEM_WUR int redsem_rate_acquire(redsem_rate *rate, int64_t timeout_ms,
                                              redsem_rate_grant *ret_grant);

/**
 * redsem_rate_acquire_as - redsem_rate_acquire() with a holder identifier chosen by the caller.
 *
 * Idempotent per identifier: if this identifier has a grant of NAME made less than W ms ago
 * (an earlier call's reply was lost), that grant is returned (same token, same granted_us)
 * and no second grant is made. Later than W after it, the identifier gets a new grant.
 *
 * @holder_id  borrowed; must not be NULL; exactly REDSEM_ID_LEN lower-case hex chars (from
 *             redsem_id_generate() or a grant's id).
 * Other arguments and returns as redsem_rate_acquire().
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.3
 */
REDSEM_API REDSEM_WUR int redsem_rate_acquire_as(redsem_rate *rate, const char *holder_id,
                                                 int64_t timeout_ms, redsem_rate_grant *ret_grant);

/**
 * redsem_rate_status - the rate's window now (read-only).
 *
 * @rate      borrowed; must not be NULL.
 * @ret_info  borrowed; caller-owned; must not be NULL; written on REDSEM_OK.
 * Returns: REDSEM_OK; REDSEM_EINVAL; REDSEM_ECONFLICT; REDSEM_ECONN; REDSEM_ETIMEDOUT;
 *          REDSEM_ESERVER; REDSEM_EPERM; REDSEM_EPROTO; REDSEM_EFORKED.
 * Server: one EVALSHA of rate.lua (mode status), O(log n).
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.3
 */
REDSEM_API REDSEM_WUR int redsem_rate_status(redsem_rate *rate, redsem_rate_info *ret_info);

/**
 * redsem_rate_inspect - redsem_rate_status() of the rate NAME, whatever its N and W, without
 * a handle (`redsem status`). A name with no rate gives exists = false.
 *
 * @client    borrowed; must not be NULL.
 * @name      borrowed; must not be NULL; a valid name (see redsem_rate_open()); REDSEM_EINVAL
 *            otherwise.
 * @ret_info  borrowed; caller-owned; must not be NULL; written on REDSEM_OK.
 * Returns: as redsem_rate_status() (REDSEM_ECONFLICT: not a rate's key).
 * Server: one EVALSHA of rate.lua (mode status); records nothing.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.3
 */
REDSEM_API REDSEM_WUR int redsem_rate_inspect(redsem_client *client, const char *name,
                                              redsem_rate_info *ret_info);

/**
 * Accessors of a rate handle. No server I/O; @rate borrowed, NULL gives "", 0, 0.
 * Thread safety: immutable: any thread, while the handle exists. Since: 0.3
 *
 * redsem_rate_name       - the name given to redsem_rate_open(); view valid until
 *                          redsem_rate_free().
 * redsem_rate_limit      - N, as given to redsem_rate_open().
 * redsem_rate_window_ms  - W, ms, as given to redsem_rate_open().
 */
REDSEM_API const char *redsem_rate_name(const redsem_rate *rate);
REDSEM_API uint32_t redsem_rate_limit(const redsem_rate *rate);
REDSEM_API int64_t redsem_rate_window_ms(const redsem_rate *rate);

#ifdef __cplusplus
}
#endif

#endif /* REDSEM_RATE_H */
