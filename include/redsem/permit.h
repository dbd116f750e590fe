/* redsem - a permit: one grant of a semaphore or of a lock. */
#ifndef REDSEM_PERMIT_H
#define REDSEM_PERMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * A permit is what a successful acquire returns, for a semaphore (redsem_sem_acquire()) or a
 * lock (redsem_lock_acquire()). It carries:
 *   - the holder identifier: 20 random bytes from libsodium, hex-encoded (40 chars);
 *   - the fencing token: a 64-bit number that strictly increases with every grant of that
 *     semaphore or lock, across all clients (Kleppmann, "How to do distributed locking").
 *     Tokens are not dense: each is max(previous + 1, the server's clock in microseconds),
 *     so they keep increasing even after the keys expired or the server restarted without
 *     persistence (as long as the server's clock does not step back);
 *   - the validity: a CLOCK_MONOTONIC deadline until which the holder may act on the
 *     resource. It is counted from the moment the granting request was sent (for a blocking
 *     acquire: the attempt that was granted, not the start of the wait), plus the lease,
 *     minus a drift margin of lease/100 + 2 ms (the Redis distributed-lock page). The server
 *     keeps the permit at least that long unless the server itself loses data.
 *
 * LIFETIME. A permit belongs to the semaphore or lock handle it came from and to that
 * handle's client: free the permit first, then the handle, then the client. Refresh, release,
 * auto_renew and stop_renewal need both alive. If the handle or the client is freed first,
 * the permit's automatic renewal, if any, stops there (waiting for a renewal in flight; no
 * lost callback), and the permit may afterwards only be read (id, token, weight, deadline,
 * validity, held) and freed with redsem_permit_free(). A permit's lost-lease callback may
 * release, refresh, stop renewing or free it, and free its handle or client (renew.h).
 *
 * Any thread may use a permit (see THREADS in client.h). Its use by two threads at
 * once is the caller's to order: a refresh and a release then race on the server, which
 * decides (redsem never corrupts memory, but the loser gets REDSEM_ELOST or REDSEM_ESTATE).
 */
typedef struct redsem_permit redsem_permit;

/**
 * redsem_permit_id - the holder identifier.
 *
 * @permit  borrowed; NULL gives "".
 * Returns: view of 40 lower-case hex chars, NUL-terminated; valid until redsem_permit_free().
 *          Pass it to redsem_sem_acquire_as() to retry an acquire idempotently.
 * Server: none. Thread safety: immutable: any thread, while the permit exists. Since: 0.1
 */
REDSEM_API const char *redsem_permit_id(const redsem_permit *permit);

/**
 * redsem_permit_token - the fencing token of this grant (see above); 0 for NULL.
 *
 * For a reentrant lock acquired again by its owner, the token of the outer grant.
 * Server: none. Thread safety: immutable: any thread, while the permit exists. Since: 0.1
 */
REDSEM_API uint64_t redsem_permit_token(const redsem_permit *permit);

/**
 * redsem_permit_weight - how many permits of its semaphore this permit object stands for.
 *
 * @permit  borrowed; NULL gives 0.
 * Returns: n of the redsem_sem_acquire_n() family that granted it; 1 for a permit from the
 *          other acquire calls and for a lock; for redsem_sem_adopt() the weight recorded on
 *          the server. Refresh, release, renewal and the fencing token apply to all n.
 * Server: none. Thread safety: immutable: any thread, while the permit exists. Since: 0.3
 */
REDSEM_API uint32_t redsem_permit_weight(const redsem_permit *permit);

/**
 * redsem_permit_deadline_ms - the validity deadline on redsem_monotonic_ms()'s clock (ms).
 *
 * Moved forward by each successful refresh. 0 for NULL. Server: none.
 * Thread safety: atomic: any thread, while the permit exists. Since: 0.1
 */
REDSEM_API int64_t redsem_permit_deadline_ms(const redsem_permit *permit);

/**
 * redsem_permit_validity_ms - milliseconds of validity left, on the monotonic clock.
 *
 * Returns: > 0 while the holder may still act; 0 once the deadline has passed, or after the
 *          permit was released or found lost; 0 for NULL. Cheap (no server round trip).
 * Thread safety: for a permit under automatic renewal, callable from any thread. Since: 0.1
 */
REDSEM_API int64_t redsem_permit_validity_ms(const redsem_permit *permit);

/**
 * redsem_permit_held - whether this holder still believes it holds the permit: it was not
 * released, no refresh found it lost, and the validity deadline has not passed.
 *
 * Server: none. Thread safety: as redsem_permit_validity_ms(). Since: 0.1
 */
REDSEM_API bool redsem_permit_held(const redsem_permit *permit);

/**
 * redsem_permit_refresh - extend the lease by the handle's lease_ms, counted from now.
 *
 * For a lock this is the compare-and-pexpire script: only the owner can extend. For a
 * semaphore, the holder's deadline is moved only if the entry still exists and has not
 * expired: an expired or released entry is never re-created (Redis in Action 6.3.3 notes the
 * refresh race; redsem reports it as lost instead).
 *
 * The refresh margin: a refresh applies only if the lease still has at least
 * lease/100 + 2 ms + e + min(e + 5 ms, lease/10) left on the server when the script runs,
 * where e = min(lease/50, 25 ms) is how early the renewer reports a loss (57 ms for a 1 s
 * lease, 157 ms for 10 s, 37 ms for 600 ms). So that a refresh delayed in a stalled server's
 * socket cannot revive a lease that its holder was already told is lost (docs/design.md
 * section 10). Seen from the holder: a refresh made with V ms of validity left fails with
 * REDSEM_ELOST if V < e + min(e + 5 ms, lease/10) + the time the request takes to reach
 * the server (45 ms + that delay for a 1 s lease). A fresh client's first refresh costs one
 * round trip, like any other (the script's body travels with it).
 *
 * @permit  borrowed; must not be NULL.
 * Returns: REDSEM_OK (validity moved to: send time + lease - drift); REDSEM_ELOST (expired,
 *          released, taken over, or less than the refresh margin left when the refresh ran
 *          on the server: the permit is marked lost and stays lost); REDSEM_ESTATE
 *          (already released or found lost); REDSEM_EINVAL; REDSEM_ECONN; REDSEM_ETIMEDOUT
 *          (the validity deadline is then unchanged); REDSEM_ESERVER; REDSEM_EPERM;
 *          REDSEM_EPROTO; REDSEM_EFORKED; REDSEM_EREPLICA (with
 *          redsem_options_set_sync_replicas(): refreshed on the primary, but fewer replicas
 *          acknowledged it in time; the validity deadline is unchanged).
 * Server: one EVALSHA (refresh.lua or lock_extend.lua; on the client's first call of that
 *         script, SCRIPT LOAD of its body pipelined before it, in the same round trip) on the
 *         permit's client.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h); also from the permit's own lost-lease callback (where it returns
 * REDSEM_ESTATE at once: the permit was found lost). Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_permit_refresh(redsem_permit *permit);

/**
 * redsem_permit_release - give the permit back.
 *
 * Removes only this holder's own entry (a lock: compare-and-delete). Releasing a reentrant
 * lock that was taken n times decrements the server-side hold count; the n-th release frees
 * it. Wakes one waiter if any is registered. Stops automatic renewal of this permit first,
 * waiting for a renewal in flight, so a lease is never extended after it was released.
 * From a lost-lease callback (of this permit or another of the client) it does not wait: the
 * renewer thread, which runs the callback, is not renewing anything then (the release's own
 * round trip delays the client's other renewals, as any call from a callback does).
 *
 * @permit  borrowed; must not be NULL. Still needs redsem_permit_free() afterwards.
 * Returns: REDSEM_OK; REDSEM_ELOST (the lease had run out, judged by this holder's validity
 *          deadline, which ends before the server's, or the server had no entry for it any
 *          more: expired and cleaned up, or taken over. Its own entry, if still there, is
 *          removed; nothing of anyone else's is touched); REDSEM_ESTATE (already released);
 *          REDSEM_EINVAL;
 *          REDSEM_ECONN; REDSEM_ETIMEDOUT; REDSEM_ESERVER; REDSEM_EPERM; REDSEM_EPROTO;
 *          REDSEM_EFORKED. After a connection-level failure the permit stays releasable; if
 *          it is never released, the lease expires on the server by itself.
 * Server: one EVALSHA (basic_release.lua, fair_release.lua or lock_release.lua); fair and
 *         locked, when the release granted queued waiters: one more, wake_push.lua, which
 *         pushes their wake-ups to their lists (design.md section 2).
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h), lost-lease callbacks included. Since: 0.1
 */
REDSEM_API int redsem_permit_release(redsem_permit *permit);

/**
 * redsem_permit_free - free the local permit object. NULL is a no-op.
 *
 * Does NOT release it on the server (call redsem_permit_release() first, or let the lease
 * expire). Stops its automatic renewal, if any, waiting for a renewal in flight (not from a
 * lost-lease callback, where none is). Needs neither its handle nor its client once they
 * were freed (see LIFETIME above).
 * Thread safety: any thread, once no call on the permit is running or can start; also from
 * its own lost-lease callback (the permit passed to the callback is then gone when the
 * callback returns; the renewer does not touch it again). Since: 0.1
 */
REDSEM_API void redsem_permit_free(redsem_permit *permit);

#ifdef __cplusplus
}
#endif

#endif /* REDSEM_PERMIT_H */
