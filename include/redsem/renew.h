/* redsem - automatic renewal, lost-lease notification, reentrant locks. */
#ifndef REDSEM_RENEW_H
#define REDSEM_RENEW_H

#include <stdbool.h>
#include <stdint.h>

#include "client.h"
#include "export.h"
#include "lock.h"
#include "permit.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * AUTOMATIC RENEWAL (the "watchdog" of the seeds, Redisson's lockWatchdogTimeout, for
 * semaphore permits as well as locks).
 *
 * Opt in per permit with redsem_permit_auto_renew(). The first time, the client starts ONE
 * background thread, the renewer. It sends its renewals on the client's own request
 * connections (it opens no connection of its own), where they go
 * ahead of other threads waiting for a connection and never wait for one, or for a reply,
 * past the moment a holder must be told it lost its permit. It keeps every renewed permit of the client in a timer queue ordered by next renewal time (the
 * seed's delay queue) and refreshes each one every interval_ms (default: a third of the
 * lease), by the same script as redsem_permit_refresh(), so a renewal can never re-create a
 * lease that expired or was released. A failed renewal (Redis unreachable, slow, restarting)
 * is retried with a short backoff until the permit's validity deadline.
 *
 * ON AN EVENT LOOP (async.h, where the loop engine runs: the default build): a
 * permit granted by a redsem_async there is renewed by that loop instead, with no thread:
 * its renewals are requests on the loop engine's connection, its next renewal is part of the
 * loop's timer, and its lost callback runs on the loop's thread (inside
 * redsem_async_action()), under the same rules, schedule and deadlines as below. Release,
 * free and stop_renewal of such a permit never wait for its renewal in flight (the caller may
 * be the loop's thread): its outcome is ignored, and a refresh cannot bring back a lease
 * released meanwhile. redsem_async_free() stops the renewal of the permits it still renews
 * (as redsem_permit_stop_renewal(), no callback; auto_renew later renews them on the
 * client's renewer thread). Its lost callback must not free its redsem_async or client.
 *
 * LOST-LEASE NOTIFICATION. The permit is declared lost, and the callback fires once, on the
 * renewer thread, as soon as either
 *   - a renewal finds the lease gone (REDSEM_LOST_EXPIRED: it expired or was taken over), or
 *   - the validity deadline comes without a successful renewal (REDSEM_LOST_DEADLINE: Redis
 *     unreachable or too slow). The deadline is lease - (lease/100 + 2 ms) after the last
 *     successful grant or renewal was sent, so the holder learns before the server can give
 *     the permit to anyone else.
 * After that redsem_permit_held() is false and redsem_permit_validity_ms() is 0; both are
 * cheap, lock-free and callable from any thread, so a worker can poll them between steps.
 *
 * WHAT THE CALLBACK MAY DO: read the permit (id, token, held, validity), set a flag, signal a
 * condition variable, write to a pipe, kill() a child process. It may also call
 * redsem_permit_release(), _refresh(), _stop_renewal(), _free() and _auto_renew() on its own
 * permit or on other permits of the client, and free its semaphore or lock handle
 * (redsem_sem_free(), redsem_lock_free()) or the client itself (redsem_client_free(): the
 * renewer thread then ends once the callback returns). Those that wait for a renewal in
 * flight do not wait there (the renewer thread runs the callback: nothing is in flight); a
 * permit freed there is not touched again by the renewer. It must return quickly: it delays
 * every other renewal of the client, and each call that goes to the server (a release, a
 * refresh) by a round trip or more. It must not wait for another thread that is itself
 * waiting in redsem_permit_release(), _free(), _stop_renewal(), redsem_sem_free(),
 * redsem_lock_free() or redsem_client_free() for this client's renewer (they may wait for
 * the round the callback is part of).
 *
 * RELEASE AND FREE stop renewal first and wait for a renewal in flight, so a lease is never
 * extended after redsem_permit_release() returned. Freeing the semaphore or lock handle, or
 * the client, stops the renewal of their permits the same way (see LIFETIME in permit.h).
 *
 * FORK: the renewer thread does not exist in a child process; a child's calls on inherited
 * handles return REDSEM_EFORKED, so it can neither renew nor release its parent's permits.
 */

/** Why a permit was declared lost. Since: 0.1 */
typedef enum redsem_lost_reason {
    REDSEM_LOST_EXPIRED = 1, /* a renewal found the lease gone on the server */
    REDSEM_LOST_DEADLINE = 2 /* the validity deadline passed without a successful renewal */
} redsem_lost_reason;

/**
 * Lost-lease callback; runs on the renewer thread, or on the loop's thread for a permit
 * renewed on an event loop (see the rules above).
 * @permit     view; the permit that was lost (still valid: the caller frees it).
 * @reason     why.
 * @user_data  the pointer given to redsem_permit_auto_renew().
 */
typedef void (*redsem_lost_fn)(redsem_permit *permit, redsem_lost_reason reason, void *user_data);

/**
 * redsem_permit_auto_renew - keep the permit's lease alive in the background until it is
 * released, freed, stopped, or lost.
 *
 * @permit       borrowed; must not be NULL; must be held.
 * @interval_ms  time between renewals: 0 means a third of the lease; otherwise
 *               1 .. lease - margin - 1 ms, where the refresh margin is lease/100 + 2 + e +
 *               min(e + 5, lease/10) ms and e = min(lease/50, 25), at least 1 (57 ms for a
 *               1 s lease): a renewal must reach the server while the lease still has the
 *               margin left (an interval in the last margin would lose the permit).
 * @on_lost      may be NULL (then poll redsem_permit_held()).
 * @user_data    passed to on_lost; kept (not copied) until the renewal ends (release, free,
 *               stop_renewal, lost, the free of its handle or client): it must stay valid
 *               until then. May be NULL.
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL permit, interval out of range); REDSEM_ESTATE
 *          (released, lost, or already under renewal); REDSEM_ENOMEM (also: the renewer
 *          thread could not be started; nothing started); REDSEM_EFORKED. Nothing is sent
 *          here, so no fault code.
 * Server: nothing now; later one EVALSHA of refresh.lua / lock_extend.lua per renewal, on
 *         the client's request connections (renewals due together share one round trip on one
 *         server without sync replicas; one by one in a Redis Cluster or with sync replicas);
 *         for a permit renewed on an event loop, on its loop engine's connection.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.1
 */
REDSEM_API int redsem_permit_auto_renew(redsem_permit *permit, int64_t interval_ms,
                                        redsem_lost_fn on_lost, void *user_data);

/**
 * redsem_permit_stop_renewal - stop renewing this permit (it stays held until its lease ends);
 * waits for a renewal in flight.
 *
 * Returns: REDSEM_OK (also if it was not renewed); REDSEM_EINVAL; REDSEM_EFORKED.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h), lost-lease callbacks included (there it does not wait). Since: 0.1
 */
REDSEM_API int redsem_permit_stop_renewal(redsem_permit *permit);

/** Renewer counters of a client, for operators and benchmarks. Since: 0.1 */
typedef struct redsem_renew_stats {
    uint64_t renewals;      /* successful renewals */
    uint64_t failures;      /* renewal attempts that failed (connection, timeout, ...) */
    uint64_t lost_expired;  /* permits declared lost: the lease was gone */
    uint64_t lost_deadline; /* permits declared lost: validity ran out without a renewal */
    int64_t max_lateness_ms; /* worst delay of a renewal behind its schedule */
    uint64_t round_trips;   /* the round trips the renewals took: renewals falling due
                               within 10 ms of each other go together, up to 16 in one
                               round trip on one server (with
                               redsem_options_set_sync_replicas(), one WAIT after them all);
                               in a Redis Cluster they go one by one (Since: 0.4) */
    uint64_t reserved[7];
} redsem_renew_stats;

/**
 * redsem_client_renew_stats - copy the renewer's counters (all zero if it never started).
 * @client, @ret_stats  borrowed; must not be NULL.
 * Returns: REDSEM_OK; REDSEM_EINVAL. Thread safety: any thread, at the same time as others (see
 * "Threads" in redsem/client.h). Since: 0.1
 */
REDSEM_API int redsem_client_renew_stats(redsem_client *client, redsem_renew_stats *ret_stats);

/**
 * redsem_lock_set_reentrant - make the lock reentrant for this handle (Redisson-style).
 *
 * The handle gets a random owner identity at redsem_lock_open(). With reentrancy on, an
 * acquire by the same handle while it holds the lock succeeds at once and increments a hold
 * count kept ON THE SERVER (field n of the hash PREFIX{NAME}:mutex:meta), so extend and
 * release keep working after a reconnect; each permit's release decrements it and the last
 * one frees the lock. Another handle (even in the same process) is a different owner and
 * never sees the lock as reentrant. All grants of one hold share the outer grant's fencing
 * token. Note: an acquire whose reply was lost (REDSEM_EUNKNOWN) may have incremented the
 * count; redsem_lock_status() tells the count.
 *
 * @on  true to enable; must be called before the first acquire on this handle.
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL). Server: none.
 * Thread safety: before the handle is shared: not while another thread uses it. Since: 0.1
 */
REDSEM_API int redsem_lock_set_reentrant(redsem_lock *lock, bool on);

#ifdef __cplusplus
}
#endif

#endif /* REDSEM_RENEW_H */
