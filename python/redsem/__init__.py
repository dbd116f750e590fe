"""redsem: distributed counting semaphores, locks and rate limits on Redis.

A binding of the redsem C library (cffi, API mode): the same keys and semantics as C
programs and the ``redsem`` command, so they can share one limit. Durations are seconds
(floats); errors are exceptions under :class:`redsem.Error`. See docs/python.md.

    client = redsem.Client("redis://127.0.0.1:6379")
    db = client.semaphore("db-slots", limit=8, lease=30.0, strategy="fair")
    with db.acquire(timeout=5.0) as permit:     # redsem.Busy if no permit in time
        permit.auto_renew()
        run_query(token=permit.token)            # fencing token
"""

from ._version import __version__
from ._errors import (Busy, Cancelled, Conflict, ConnectionError, Error, ForkedError,
                      InvalidArgument, Lost, OutOfMemory, PermissionDenied, ProtocolError,
                      ReplicaError, ServerError, StateError, TimeoutError, TLSError, Unknown)
from ._core import (STRATEGIES, Client, Grant, Holder, Lock, LostReason, Permit, RateLimiter,
                    RateStatus, Semaphore, Status, Waiter, generate_id)
from ._aio import AsyncAcquire  # also registers the event-loop callbacks

__all__ = [
    "__version__", "Client", "Semaphore", "Lock", "RateLimiter", "Permit", "Grant", "Status",
    "Holder", "Waiter", "RateStatus", "LostReason", "AsyncAcquire", "STRATEGIES",
    "generate_id", "Error", "Busy", "Lost", "Unknown", "Cancelled", "InvalidArgument",
    "OutOfMemory", "ConnectionError", "TimeoutError", "ServerError", "PermissionDenied",
    "ProtocolError", "Conflict", "ForkedError", "StateError", "TLSError", "ReplicaError",
]
