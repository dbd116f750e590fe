/* redsem - the distributed lock (mutex). */
#ifndef REDSEM_LOCK_H
#define REDSEM_LOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "export.h"
#include "permit.h"
#include "semaphore.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * The lock of the Redis "Distributed Locks" page (single instance), with fencing tokens:
 * acquire is SET PREFIX{NAME}:mutex <token> NX PX <lease> (inside lock_acquire.lua, which on
 * success also draws the fencing token); release is compare-and-delete; extend
 * (redsem_permit_refresh()) is compare-and-pexpire. A grant is returned as a redsem_permit
 * whose identifier is the random token stored in the key.
 */
typedef struct redsem_lock redsem_lock;

/**
 * redsem_lock_open - a handle on the lock NAME (nothing is sent).
 *
 * @client    borrowed; must not be NULL; must outlive the lock.
 * @name      copied; must not be NULL; rules as redsem_sem_open().
 * @lease_ms  REDSEM_LEASE_MIN_MS..REDSEM_LEASE_MAX_MS: the key's PX.
 * @ret_lock  owned-out; free with redsem_lock_free(). Must not be NULL.
 * Returns: REDSEM_OK; REDSEM_EINVAL; REDSEM_ENOMEM; REDSEM_EFORKED.
 * Server: none. Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_lock_open(redsem_client *client, const char *name,
                                           int64_t lease_ms, redsem_lock **ret_lock);

/**
 * redsem_lock_free - free the handle; NULL is a no-op. Permits from it should be freed first
 * (a held lock is not released: its lease expires on the server). A permit of it still under
 * automatic renewal stops being renewed, exactly as in redsem_sem_free() (waits for a renewal
 * in flight; no lost callback; then only reading and redsem_permit_free()). May be called
 * from a lost-lease callback (renew.h). Server: none.
 * Thread safety: any thread, once no call on the handle, or on a permit of it, is running or
 * can start. Since: 0.1
 */
REDSEM_API void redsem_lock_free(redsem_lock *lock);

/**
 * redsem_lock_try_acquire - take the lock if it is free now; never waits.
 *
 * Exactly redsem_lock_acquire(lock, 0, ret_permit): arguments, ownership, return codes
 * (REDSEM_EBUSY when another owner holds it), server requests and thread rules as
 * documented there. Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_lock_try_acquire(redsem_lock *lock, redsem_permit **ret_permit);

/**
 * redsem_lock_acquire - take the lock, waiting up to timeout_ms.
 *
 * Waiting as redsem_sem_acquire() for the basic strategy: release pushes a wake-up to a list
 * the waiters block on (BLPOP), the expiry of the current lease wakes them when due, and a
 * jittered backoff covers lost wake-ups. Waiters are unordered.
 *
 * @lock        borrowed; must not be NULL.
 * @timeout_ms  0 (try once), 1..REDSEM_WAIT_MAX_MS, or REDSEM_WAIT_FOREVER.
 * @ret_permit  owned-out; free with redsem_permit_free(). Must not be NULL. Written only on
 *              REDSEM_OK.
 * Returns: REDSEM_OK; REDSEM_EBUSY (held by another owner, or not freed in time: expected);
 *          REDSEM_EUNKNOWN (the reply of an attempt was lost: the lock may have been taken
 *          under this call's token, named in redsem_client_errmsg(), and is then held until
 *          its lease expires; redsem_lock_acquire_as() with that token finds out,
 *          idempotently); REDSEM_EINVAL (NULL lock or ret_permit, timeout out of range);
 *          REDSEM_ENOMEM; REDSEM_ECONN; REDSEM_ETIMEDOUT; REDSEM_ESERVER; REDSEM_EPERM;
 *          REDSEM_EPROTO; REDSEM_EFORKED; REDSEM_EREPLICA (with
 *          redsem_options_set_sync_replicas(): granted, but fewer replicas acknowledged it in
 *          time; the lock was given back). Never REDSEM_ECONFLICT (a lock records no strategy
 *          or limit).
 * Server: per attempt one EVALSHA of lock_acquire.lua; BLPOP while waiting.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_lock_acquire(redsem_lock *lock, int64_t timeout_ms,
                                              redsem_permit **ret_permit);

/**
 * redsem_lock_acquire_as - redsem_lock_acquire() with a caller-chosen token (REDSEM_ID_LEN
 * lower-case hex chars), idempotent per token: if the lock is already held with this token,
 * the same grant is returned with its lease renewed. Not allowed on a reentrant handle
 * (REDSEM_EINVAL): there the token is the handle's owner identity.
 *
 * @lock        borrowed; must not be NULL.
 * @token       borrowed; must not be NULL; exactly REDSEM_ID_LEN lower-case hex chars, e.g.
 *              from redsem_id_generate() or redsem_permit_id().
 * @timeout_ms  as redsem_lock_acquire().
 * @ret_permit  owned-out; free with redsem_permit_free(). Must not be NULL. Written only on
 *              REDSEM_OK.
 * Returns: as redsem_lock_acquire(); REDSEM_EINVAL also for a NULL or malformed token and on
 *          a reentrant handle.
 * Server: as redsem_lock_acquire(), with this token.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_lock_acquire_as(redsem_lock *lock, const char *token,
                                                 int64_t timeout_ms, redsem_permit **ret_permit);

/**
 * redsem_lock_adopt - a local permit object for the lock's current owner token (see
 * redsem_sem_adopt()): its fencing token is the current grant's, its validity computed from
 * the lease the key has left.
 *
 * @lock        borrowed; must not be NULL.
 * @token       borrowed; must not be NULL; exactly REDSEM_ID_LEN lower-case hex chars.
 * @ret_permit  owned-out; free with redsem_permit_free(). Must not be NULL. Written only on
 *              REDSEM_OK.
 * Returns: REDSEM_OK; REDSEM_ELOST (the lock is not held with that token); REDSEM_EINVAL
 *          (NULL lock or ret_permit, a NULL or malformed token); REDSEM_ENOMEM; REDSEM_ECONN;
 *          REDSEM_ETIMEDOUT; REDSEM_ESERVER; REDSEM_EPERM; REDSEM_EPROTO; REDSEM_EFORKED.
 * Server: one EVALSHA of holder.lua (read-only). Thread safety: any thread, at the same time as
 * others (see "Threads" in redsem/client.h). Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_lock_adopt(redsem_lock *lock, const char *token,
                                            redsem_permit **ret_permit);

/**
 * redsem_lock_status - who holds the lock now (read-only).
 *
 * The status reports strategy 0 and limit 1; its holder (if any) is the owner token with
 * its fencing token and remaining lease, redsem_status_hold_count() the reentrant count.
 * Arguments and returns as redsem_sem_status(). Server: one EVALSHA of lock_status.lua.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.1
 */
REDSEM_API int redsem_lock_status(redsem_lock *lock, size_t max_entries,
                                  redsem_status **ret_status);

#ifdef __cplusplus
}
#endif

#endif /* REDSEM_LOCK_H */
