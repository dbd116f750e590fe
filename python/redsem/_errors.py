"""The exception hierarchy: one class per REDSEM_E* code, all under redsem.Error."""

from __future__ import annotations

import builtins
from typing import Dict, Optional, Type

from ._redsem import ffi, lib

__all__ = [
    "Error", "Busy", "Lost", "Unknown", "Cancelled", "InvalidArgument", "OutOfMemory",
    "ConnectionError", "TimeoutError", "ServerError", "PermissionDenied", "ProtocolError",
    "Conflict", "ForkedError", "StateError", "TLSError", "ReplicaError",
]


class Error(Exception):
    """Base of every redsem error.

    Attributes:
        code: the C library's status (a negative REDSEM_E* value).
        name: its symbolic name, e.g. ``"REDSEM_EBUSY"``.
        detail: the library's run-time detail (Redis' own error text, the OS's ...), or "".
    """

    code: int = 0

    def __init__(self, code: int, detail: str = "", message: Optional[str] = None) -> None:
        self.code = code
        self.name = ffi.string(lib.redsem_err_name(code)).decode()
        self.detail = detail
        if message is None:
            message = ffi.string(lib.redsem_strerror(code)).decode()
            if detail:
                message = f"{message}: {detail}"
        super().__init__(message)


class Busy(Error):
    """No permit (or rate grant) was free, or none became free before the timeout.

    ``retry_after`` (rate limiters only) is the number of seconds until a request made now
    would be granted, or None.
    """

    retry_after: Optional[float] = None


class Lost(Error):
    """The lease was lost: it expired, was released, or is held by another holder."""


class Unknown(Error):
    """The outcome is unknown: the reply of a request that could have granted was lost.

    ``holder_id`` is the identifier the request used: acquire again with
    ``holder_id=err.holder_id`` (and a timeout of at least 0.001 s) to find out,
    idempotently. None where the library gives none (a reentrant lock).
    """

    holder_id: Optional[str] = None


class Cancelled(Error):
    """The operation was cancelled."""


class InvalidArgument(Error, ValueError):
    """An argument was out of range or malformed (also a ValueError)."""


class OutOfMemory(Error, MemoryError):
    """The library ran out of memory."""


class ConnectionError(Error, builtins.ConnectionError):
    """Cannot connect to Redis, or the connection was lost (also the builtin ConnectionError)."""


class TimeoutError(Error, builtins.TimeoutError):
    """Redis did not answer within the command timeout (also the builtin TimeoutError)."""


class ServerError(Error):
    """Redis answered with an error reply (``detail`` has its text)."""


class PermissionDenied(Error, builtins.PermissionError):
    """Redis refused: authentication failed or an ACL denied a command."""


class ProtocolError(Error):
    """Redis sent a reply redsem did not expect."""


class Conflict(Error):
    """The name exists on the server with another strategy, limit or rate."""


class ForkedError(Error):
    """A handle was used in a process other than the one that created it (after os.fork())."""


class StateError(Error):
    """The operation is not valid in the handle's current state (e.g. already released)."""


class TLSError(Error):
    """TLS: the server's certificate was refused (unknown CA, expired, name mismatch)."""


class ReplicaError(Error):
    """Fewer replicas than required acknowledged the write in time."""


_BY_CODE: Dict[int, Type[Error]] = {
    lib.REDSEM_EBUSY: Busy,
    lib.REDSEM_ELOST: Lost,
    lib.REDSEM_EUNKNOWN: Unknown,
    lib.REDSEM_ECANCELED: Cancelled,
    lib.REDSEM_EINVAL: InvalidArgument,
    lib.REDSEM_ENOMEM: OutOfMemory,
    lib.REDSEM_ECONN: ConnectionError,
    lib.REDSEM_ETIMEDOUT: TimeoutError,
    lib.REDSEM_ESERVER: ServerError,
    lib.REDSEM_EPERM: PermissionDenied,
    lib.REDSEM_EPROTO: ProtocolError,
    lib.REDSEM_ECONFLICT: Conflict,
    lib.REDSEM_EFORKED: ForkedError,
    lib.REDSEM_ESTATE: StateError,
    lib.REDSEM_ETLS: TLSError,
    lib.REDSEM_EREPLICA: ReplicaError,
}


def error_for(code: int, detail: str = "") -> Error:
    """The exception for a status code (a code this binding does not know gives Error)."""
    return _BY_CODE.get(code, Error)(code, detail)
