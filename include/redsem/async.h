/* redsem - the event-loop API: acquire, refresh, release and status without blocking the
 * caller, completed by callbacks that run on the application's loop. */
#ifndef REDSEM_ASYNC_H
#define REDSEM_ASYNC_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "client.h"
#include "permit.h"
#include "semaphore.h"
#include "lock.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * THE PATTERN (libcurl's multi_socket, c-ares' socket callbacks): a redsem_async is bound to
 * one client and to one loop. The library tells the loop which descriptors to watch and for
 * what (redsem_async_socket_fn), and when it wants a timer (redsem_async_timer_fn); the loop
 * tells the library when one is ready (redsem_async_action()), and the completion callbacks
 * of finished operations run inside that call, on the loop's thread. Ready-made adapters
 * bind it to libuv, libevent and libev in two lines: <redsem/adapters/libuv.h>,
 * <redsem/adapters/libevent.h>, <redsem/adapters/libev.h> (header-only, like hiredis').
 *
 * HOW IT RUNS. Every operation runs on the loop itself, for a client of any kind (one
 * server over unix, TCP or TLS; Sentinel; Cluster): its requests go on non-blocking
 * connections of the redsem_async's own (several in flight on each, replies read as they
 * arrive), its waits on one BLPOP connection, its connects without blocking (a host name is
 * resolved with c-ares), and its timeouts on a timerfd. The loop watches one descriptor, an
 * epoll set of all of these, and needs no timer of its own. The library starts no thread
 * for it. The operations are the same as their blocking twins (redsem_sem_acquire_n and the
 * others): the same scripts, retries, not-after times, fencing tokens and guarantees. Permits
 * granted here are renewed on the loop too (redsem_permit_auto_renew: its lost callback runs
 * on the loop's thread). An operation started from a callback of redsem_async_action()
 * starts at once; one started anywhere else (another thread, or the loop's thread between
 * two reports) is started by the loop's next report, in order, its timeout counted from its
 * call. What the engine does not do yet (a Redis Cluster client's waiters poll): see
 * docs/design.md section 16.
 *
 * CALLBACKS run once per operation, on the thread that calls redsem_async_action() (or
 * redsem_async_free()), never inside the call that started the operation. A callback may
 * start new operations, cancel others, and free the permit or status it was given; it must
 * not call redsem_async_free() on its own redsem_async.
 *
 * THREADS. The redsem_async_* calls may come from any thread; callbacks run where
 * redsem_async_action() runs. Handles given to an operation (semaphore, lock, permit) must
 * stay valid until its callback has run.
 */

/** Opaque: one client's operations on one loop. Since: 0.4 */
typedef struct redsem_async redsem_async;

/** Kept for the API only: nothing reads it, and the event-loop API starts no thread
 * (NEWS.md, 0.7.0, says what it was). Since: 0.4 */
#define REDSEM_ASYNC_WORKERS_MAX 64

/** What redsem_async_socket_fn asks the loop to watch (bits). */
enum {
    REDSEM_WATCH_IN = 1,     /* readable */
    REDSEM_WATCH_OUT = 2,    /* writable */
    REDSEM_WATCH_REMOVE = 4, /* stop watching this descriptor (alone) */
};

/**
 * redsem_async_socket_fn - the loop's part: watch fd for `what` (REDSEM_WATCH_IN and/or
 * REDSEM_WATCH_OUT, replacing what was asked for it before), or stop watching it
 * (REDSEM_WATCH_REMOVE). When it is ready, call redsem_async_action(async, fd, events).
 * loop_data: as given to redsem_async_set_loop(). Called from redsem_async_set_loop() and
 * redsem_async_free() (at present one descriptor, watched for REDSEM_WATCH_IN).
 */
typedef void (*redsem_async_socket_fn)(redsem_async *async, int fd, int what, void *loop_data);

/**
 * redsem_async_timer_fn - the loop's part: call redsem_async_action(async, -1, 0) once,
 * timeout_ms (>= 0) from now, replacing any timer asked for before; timeout_ms -1: no timer.
 * Called from redsem_async_set_loop() (at present -1, once) and redsem_async_free() (-1).
 */
typedef void (*redsem_async_timer_fn)(redsem_async *async, int64_t timeout_ms, void *loop_data);

/**
 * redsem_result - what a completion callback is given (a view: valid during the callback).
 * @op      the operation's id, as returned when it was started.
 * @rc      its status: the codes of its blocking twin, or REDSEM_ECANCELED (cancelled by
 *          redsem_async_cancel() or redsem_async_free()).
 * @errmsg  the error text (as redsem_client_errmsg() would give it); "" on REDSEM_OK.
 * @permit  acquires, on REDSEM_OK: owned-out, the caller's to free (redsem_permit_free());
 *          else NULL.
 * @status  status, on REDSEM_OK: owned-out (redsem_status_free()); else NULL.
 */
typedef struct redsem_result {
    uint64_t op;
    int rc;
    const char *errmsg;
    redsem_permit *permit;
    redsem_status *status;
} redsem_result;

/** The completion callback: runs once per operation (see CALLBACKS above). */
typedef void (*redsem_async_cb)(redsem_async *async, const redsem_result *result, void *user);

/**
 * redsem_async_new - bind an event-loop API to a client.
 *
 * @client       borrowed; must outlive the redsem_async. Other threads may keep using it.
 * @ret_async    owned-out; free with redsem_async_free(). Must not be NULL.
 *
 * Nothing is sent and no thread is started, now or later.
 * Returns REDSEM_OK, REDSEM_EINVAL (NULL argument), REDSEM_ENOMEM, REDSEM_EFORKED (client
 * made by another process), or REDSEM_ECONN (no pipe: the process is out of descriptors).
 * Thread safety: any thread. Since: 0.4
 */
REDSEM_API REDSEM_WUR int redsem_async_new(redsem_client *client, redsem_async **ret_async);

/**
 * redsem_async_set_loop - hand the loop's callbacks over (once, before the first operation;
 * the adapters do it for you).
 *
 * @socket_fn   required. Called at once for the descriptor to watch.
 * @timer_fn    may be NULL (redsem asks for no timer: its deadlines make the one descriptor
 *              readable when they are due, through a timerfd behind it); if given, called
 *              at once with -1.
 * @loop_data   passed back to both, never read by redsem (may be NULL).
 *
 * Makes the engine (nothing is sent: its connections open at the first operation).
 * Returns REDSEM_OK, REDSEM_EINVAL (NULL async or socket_fn; a client of a kind the engine
 * does not take), REDSEM_ESTATE (a loop was set already), REDSEM_ENOMEM, REDSEM_ECONN (no
 * timerfd: the process is out of descriptors) or REDSEM_EFORKED (a forked child: nothing
 * recorded or called). Thread safety: the loop's thread. Since: 0.4
 */
REDSEM_API int redsem_async_set_loop(redsem_async *async, redsem_async_socket_fn socket_fn,
                                     redsem_async_timer_fn timer_fn, void *loop_data);

/**
 * redsem_async_action - the loop's report: fd (as asked for by socket_fn) is ready with
 * `events` (REDSEM_WATCH_IN/OUT bits), or fd -1: the timer fired. Runs the callbacks of every
 * operation finished by now, on the calling thread, in the order they finished: starts the
 * operations queued by other threads, writes and reads what the engine's sockets take
 * without blocking, runs what its timers made due.
 *
 * Returns the number of callbacks run (>= 0), REDSEM_EINVAL (NULL async, or an fd it did not
 * ask for) or REDSEM_EFORKED. Never blocks on the network. Thread safety: one thread at a
 * time (the loop's). Since: 0.4
 */
REDSEM_API int redsem_async_action(redsem_async *async, int fd, int events);

/**
 * redsem_async_pending - operations started and not completed yet (their callbacks not run).
 * @async  borrowed; NULL gives 0. In a forked child: the count at the time of fork(), which
 *         never changes there (nothing runs or completes in the child).
 * Thread safety: any thread. Since: 0.4
 */
REDSEM_API size_t redsem_async_pending(redsem_async *async);

/**
 * redsem_async_cancel - cancel an operation: its callback will report REDSEM_ECANCELED.
 *
 * An operation not started yet (queued for the loop's next report) is dropped (nothing
 * sent). A running acquire stops waiting: it leaves the semaphore's queue (an attempt
 * already under way first, then one more; a locked acquire whose guard is busy tries again
 * for up to a command timeout, as redsem_sem_acquire() at its deadline) and a permit granted
 * to it meanwhile is released; its callback follows within about a round trip. A running
 * try-acquire,
 * refresh, release or status cannot be cancelled (it ends by itself within its command
 * timeout).
 *
 * Returns REDSEM_OK (its callback will report REDSEM_ECANCELED; or REDSEM_EUNKNOWN if the
 * acquire's last round trip had an unknown outcome, or its wait failed while it was queued
 * and it could not leave the queue: it may then hold a permit until its lease ends, as
 * redsem_sem_acquire() says), REDSEM_ESTATE (too late: it
 * finished or is past cancelling; its callback reports its own result), REDSEM_EINVAL (NULL
 * async, or no pending operation has this id) or REDSEM_EFORKED (a forked child: nothing is
 * cancelled). Never blocks on the network. Thread safety: any thread.
 * Since: 0.4
 */
REDSEM_API int redsem_async_cancel(redsem_async *async, uint64_t op);

/**
 * redsem_async_free - cancel what is pending, complete every callback, and free. NULL: no-op.
 *
 * Operations not started yet and acquires that wait are cancelled as by
 * redsem_async_cancel(); operations that cannot be cancelled are waited for (at most their
 * command timeout). Then every callback not run yet runs, once, on the calling thread, before
 * this returns; socket_fn is told REDSEM_WATCH_REMOVE and timer_fn -1. Permits handed out
 * stay valid (they belong to the client). Thread safety: the loop's thread, never from a
 * callback. In a forked child: frees memory only. Since: 0.4
 */
REDSEM_API void redsem_async_free(redsem_async *async);

/**
 * redsem_sem_acquire_async - redsem_sem_acquire_n() without blocking.
 *
 * @async, @sem     borrowed; sem must belong to the async's client and stay valid until
 *                  the callback has run.
 * @n               permits (1..the limit), as redsem_sem_acquire_n().
 * @timeout_ms      0: try once (redsem_sem_try_acquire_n()); 1..REDSEM_WAIT_MAX_MS or
 *                  REDSEM_WAIT_FOREVER: wait, as redsem_sem_acquire_n(), counted from this
 *                  call (an acquire still waiting for its turn to start at its deadline
 *                  makes one try then).
 * @cb              required; gets the permit (owned-out) on REDSEM_OK.
 * @user            passed to cb (may be NULL).
 * @ret_op          the operation's id, for redsem_async_cancel() (may be NULL).
 *
 * Server: what redsem_sem_acquire_n() does (the strategy's acquire script, its BLPOP
 * wait). Returns REDSEM_OK (started: cb will run once), or without starting anything (cb not
 * called): REDSEM_EINVAL (NULL async, sem or cb; n 0; a timeout out of range; sem of
 * another client; n above the limit is the server's to refuse: the callback then gets
 * REDSEM_EINVAL, nothing taken), REDSEM_ENOMEM, REDSEM_EFORKED, REDSEM_ESTATE (no loop
 * set, or the redsem_async is being freed). Thread safety: any thread. Algorithm: that of the strategy (docs/design.md).
 * Since: 0.4
 */
REDSEM_API REDSEM_WUR int redsem_sem_acquire_async(redsem_async *async, redsem_sem *sem,
                                                   uint32_t n, int64_t timeout_ms,
                                                   redsem_async_cb cb, void *user,
                                                   uint64_t *ret_op);

/**
 * redsem_lock_acquire_async - redsem_lock_acquire() (timeout_ms 0: redsem_lock_try_acquire())
 * without blocking. Arguments and returns as redsem_sem_acquire_async() (no n). Since: 0.4
 */
REDSEM_API REDSEM_WUR int redsem_lock_acquire_async(redsem_async *async, redsem_lock *lock,
                                                    int64_t timeout_ms, redsem_async_cb cb,
                                                    void *user, uint64_t *ret_op);

/**
 * redsem_permit_refresh_async, redsem_permit_release_async - redsem_permit_refresh() and
 * redsem_permit_release() without blocking; the callback gets their status.
 *
 * @permit  borrowed; must stay valid until the callback has run (free it there or after).
 * Other arguments and returns as redsem_sem_acquire_async(). Since: 0.4
 */
REDSEM_API REDSEM_WUR int redsem_permit_refresh_async(redsem_async *async,
                                                      redsem_permit *permit,
                                                      redsem_async_cb cb, void *user,
                                                      uint64_t *ret_op);
REDSEM_API REDSEM_WUR int redsem_permit_release_async(redsem_async *async,
                                                      redsem_permit *permit,
                                                      redsem_async_cb cb, void *user,
                                                      uint64_t *ret_op);

/**
 * redsem_sem_status_async, redsem_lock_status_async - redsem_sem_status() and
 * redsem_lock_status() without blocking; the callback gets the status (owned-out).
 * @max_entries as redsem_sem_status(). Other arguments and returns as
 * redsem_sem_acquire_async(). Since: 0.4
 */
REDSEM_API REDSEM_WUR int redsem_sem_status_async(redsem_async *async, redsem_sem *sem,
                                                  size_t max_entries, redsem_async_cb cb,
                                                  void *user, uint64_t *ret_op);
REDSEM_API REDSEM_WUR int redsem_lock_status_async(redsem_async *async, redsem_lock *lock,
                                                   size_t max_entries, redsem_async_cb cb,
                                                   void *user, uint64_t *ret_op);

#ifdef __cplusplus
}
#endif

#endif /* REDSEM_ASYNC_H */
