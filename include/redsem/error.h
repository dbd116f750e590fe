/* redsem - status codes. */
#ifndef REDSEM_ERROR_H
#define REDSEM_ERROR_H

#include <stdbool.h>

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Every redsem call that can fail returns an int status: REDSEM_OK (0) on success, a negative
 * REDSEM_E* value otherwise. The list below is the single source of the enum, of
 * redsem_strerror() and of redsem_err_name() (the libuv UV_ERRNO_MAP pattern).
 *
 * Codes -1 .. -9 are EXPECTED OUTCOMES of a correct program talking to a healthy server
 * (no permit free, lease lost, reply lost); codes <= -10 are FAULTS (bad arguments, network,
 * server refusals). redsem_is_fault() tells them apart.
 *
 * Values are never renumbered; a retired code keeps its number as a placeholder.
 */
#define REDSEM_ERRNO_MAP(XX)                                                                   \
    XX(OK, 0, "success")                                                                       \
    XX(EBUSY, -1, "no permit is free (or none became free before the timeout)")               \
    XX(ELOST, -2, "lease lost: it expired, was released, or is held by another holder")       \
    XX(EUNKNOWN, -3,                                                                           \
       "outcome unknown: the request may have been applied but its reply was lost")          \
    XX(ECANCELED, -4, "the operation was cancelled (redsem_async_cancel or redsem_async_free)") \
    XX(EINVAL, -10, "invalid argument")                                                        \
    XX(ENOMEM, -11, "out of memory")                                                           \
    XX(ECONN, -12, "cannot connect to Redis, or the connection was lost")                     \
    XX(ETIMEDOUT, -13, "Redis did not answer within the command timeout")                     \
    XX(ESERVER, -14, "Redis answered with an error reply")                                     \
    XX(EPERM, -15, "Redis refused: authentication failed or ACL permission denied")            \
    XX(EPROTO, -16, "unexpected reply from Redis")                                             \
    XX(ECONFLICT, -17, "the name exists on the server with another strategy, limit or rate")   \
    XX(EFORKED, -18, "handle used in a process other than the one that created it (fork)")    \
    XX(ESTATE, -19, "operation not valid in the handle's current state")                      \
    XX(ETLS, -20, "TLS: the server's certificate was refused (unknown CA, expired, name mismatch)") \
    XX(EREPLICA, -21, "fewer replicas than required acknowledged the write in time")          \
    XX(EEVICTION, -22,                                                                         \
       "the server may evict keys (maxmemory with a policy other than noeviction)")            \
    XX(ERANGE, -23, "the caller's buffer is too small (the call reports the size it needs)")

/** Status codes; see REDSEM_ERRNO_MAP for the meaning of each. Since: 0.1 */
typedef enum redsem_err {
#define REDSEM__ERR_ENUM(name, value, text) REDSEM_##name = (value),
    REDSEM_ERRNO_MAP(REDSEM__ERR_ENUM)
#undef REDSEM__ERR_ENUM
} redsem_err;

/**
 * redsem_strerror - fixed English description of a status code.
 *
 * @code  any int; values that are not redsem codes give "unknown redsem status".
 * Returns: a static string; never NULL; never free it. For the run-time detail of the last
 *          failure on a client (Redis' own error text, errno text) use redsem_client_errmsg().
 * Thread safety: callable from any thread, any time. Since: 0.1
 */
REDSEM_API const char *redsem_strerror(int code);

/**
 * redsem_err_name - the symbolic name of a status code, e.g. "REDSEM_EBUSY".
 *
 * @code  any int; values that are not redsem codes give "REDSEM_E?".
 * Returns: a static string; never NULL; never free it.
 * Thread safety: callable from any thread, any time. Since: 0.1
 */
REDSEM_API const char *redsem_err_name(int code);

/**
 * redsem_is_fault - whether a status is a fault (<= -10) rather than success or an expected
 * outcome (REDSEM_EBUSY, REDSEM_ELOST, REDSEM_EUNKNOWN, REDSEM_ECANCELED: the caller's own
 * cancellation).
 *
 * Thread safety: callable from any thread, any time. Since: 0.1
 */
REDSEM_API bool redsem_is_fault(int code);

#ifdef __cplusplus
}
#endif

#endif /* REDSEM_ERROR_H */
