"""The blocking API: Client, Semaphore, Lock, RateLimiter, Permit, Grant, Status.

Every blocking call releases the GIL while it is in the C library (cffi does so around
each call in API mode), so threads sharing one Client wait in parallel.
"""

from __future__ import annotations

import enum
import math
import numbers
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import _aio
from ._errors import Busy, Error, Lost, StateError, error_for
from ._native import _cb_state, _Native, _str
from ._redsem import ffi, lib

Seconds = Union[int, float]
PathLike = Union[str, "os.PathLike[str]"]

STRATEGIES = ("basic", "fair", "locked")
_STRATEGY_CODES = {
    "basic": lib.REDSEM_STRATEGY_BASIC,
    "fair": lib.REDSEM_STRATEGY_FAIR,
    "locked": lib.REDSEM_STRATEGY_LOCKED,
}
_INT64_MAX_MS = 2**62


# --------------------------------------------------------------------------- argument checks


def _seconds_ms(value: Any, what: str, *, forever_ok: bool = False) -> int:
    """Seconds (a real number >= 0) as whole ms; None or inf is -1 (forever) if allowed.

    A positive value below 0.5 ms counts as 1 ms, never 0 (0 means "try once")."""
    t = type(value)
    if (t is int or t is float) and 0 <= value < 1e12:  # the common case, quickly
        ms = round(value * 1000)
        return 1 if ms == 0 and value > 0 else ms
    if value is None or (forever_ok and isinstance(value, float) and value == math.inf):
        if forever_ok:
            return lib.REDSEM_WAIT_FOREVER
        raise TypeError(f"{what} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{what} must be a number of seconds, not NaN")
    if v < 0:
        raise ValueError(f"{what} must be >= 0 seconds, not {value!r}")
    if math.isinf(v) or v * 1000 > _INT64_MAX_MS:
        raise ValueError(f"{what} is too large: {value!r} seconds")
    ms = round(v * 1000)
    return 1 if ms == 0 and v > 0 else ms


def _count(value: Any, what: str, lo: int = 0, hi: int = 2**32 - 1) -> int:
    """An int argument (bool refused) within the C type's range; the library checks the rest."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    v = int(value)
    if not lo <= v <= hi:
        raise ValueError(f"{what} must be in {lo}..{hi}, not {v}")
    return v


def _text(value: Any, what: str, *, none_ok: bool = False) -> Any:
    """A str argument as NUL-terminated bytes (ffi.NULL for None if allowed)."""
    if value is None and none_ok:
        return ffi.NULL
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{what} must not contain NUL characters")
    return value.encode("utf-8", "surrogateescape")


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _left(ms: int, t0: float) -> int:
    """What is left of a timeout of ms (REDSEM_WAIT_FOREVER stays) since t0 (monotonic)."""
    if ms == lib.REDSEM_WAIT_FOREVER:
        return ms
    return max(1, ms - int((time.monotonic() - t0) * 1000))


def _closed(what: str) -> Any:
    raise StateError(lib.REDSEM_ESTATE, f"the {what} is closed")


# --------------------------------------------------------------------------- results


class LostReason(enum.Enum):
    """Why a renewed permit was declared lost."""

    EXPIRED = 1  #: a renewal found the lease gone on the server (expired or taken over)
    DEADLINE = 2  #: the validity deadline came without a successful renewal


@dataclass(frozen=True)
class Holder:
    """A holder listed by a status: ``remaining`` is lease left in seconds (server clock)."""

    id: str
    token: int
    remaining: float
    weight: int = 1


@dataclass(frozen=True)
class Waiter:
    """A waiter listed by a status: ``ticket`` its place (fair/locked), ``remaining`` the
    seconds left of its wait lease."""

    id: str
    ticket: int
    remaining: float


@dataclass(frozen=True)
class Status:
    """A snapshot of a semaphore or lock on the server (no I/O once made).

    ``strategy`` is "basic", "fair", "locked", "lock" or None (does not exist);
    ``holder_count``/``waiter_count`` are exact, ``holders``/``waiters`` at most
    ``max_entries`` of them; ``hold_count`` is a reentrant lock's count; ``server`` the
    node that serves the name ("host:port" or a socket path)."""

    exists: bool
    strategy: Optional[str]
    limit: int
    holder_count: int
    waiter_count: int
    permits_in_use: int
    hold_count: int
    server: str
    holders: List[Holder] = field(default_factory=list)
    waiters: List[Waiter] = field(default_factory=list)


def _status_from(st: Any, lock: bool) -> Status:
    try:
        holders = []
        pid = ffi.new("const char **")
        ptok = ffi.new("uint64_t *")
        prem = ffi.new("int64_t *")
        for i in range(lib.redsem_status_holders_listed(st)):
            if lib.redsem_status_holder(st, i, pid, ptok, prem) == 0:
                holders.append(Holder(_str(pid[0]), int(ptok[0]), prem[0] / 1000.0,
                                      int(lib.redsem_status_holder_weight(st, i))))
        waiters = []
        for i in range(lib.redsem_status_waiters_listed(st)):
            if lib.redsem_status_waiter(st, i, pid, ptok, prem) == 0:
                waiters.append(Waiter(_str(pid[0]), int(ptok[0]), prem[0] / 1000.0))
        exists = bool(lib.redsem_status_exists(st))
        code = lib.redsem_status_strategy(st)
        strategy = None if not exists else ("lock" if lock or code == 0 else
                                            _str(lib.redsem_strategy_name(code)))
        return Status(exists, strategy, int(lib.redsem_status_limit(st)),
                      int(lib.redsem_status_holder_count(st)),
                      int(lib.redsem_status_waiter_count(st)),
                      int(lib.redsem_status_permits_in_use(st)),
                      int(lib.redsem_status_hold_count(st)),
                      _str(lib.redsem_status_server(st)), holders, waiters)
    finally:
        lib.redsem_status_free(st)


@dataclass(frozen=True)
class RateStatus:
    """A rate limiter's window on the server now: ``in_window`` grants in the last
    ``window`` seconds, ``waiters`` queued, ``next_free`` seconds until a new request's turn
    (0: now), ``last_token`` the last fencing token drawn, ``server_time`` the server's clock
    (seconds since the epoch)."""

    exists: bool
    limit: int
    window: float
    in_window: int
    waiters: int
    next_free: float
    last_token: int
    server_time: float


def _rate_status_from(info: Any) -> RateStatus:
    return RateStatus(bool(info.exists), int(info.limit), info.window_ms / 1000.0,
                      int(info.in_window), int(info.waiters), info.next_free_ms / 1000.0,
                      int(info.last_token), info.server_us / 1e6)


# --------------------------------------------------------------------------- client


class Client:
    """The connections to one Redis deployment (one request and one wait connection per
    server), shared by every thread of the process. ``max_connections`` is an upper bound
    kept for compatibility: the client opens one request connection per server.

    ``url`` (default ``redis://127.0.0.1:6379``) takes every form of the C library:
    ``redis://[user:password@]host[:port][/db]``, ``rediss://`` (TLS),
    ``unix:///path/to.sock[?db=N]``, ``redis+sentinel://host[:port][,...]/MASTER``,
    ``rediss+sentinel://``, ``redis+cluster://host[:port][,...]`` and ``rediss+cluster://``
    (see docs/python.md). Durations are seconds (floats). The client connects now.

    Raises: TypeError/ValueError for arguments of the wrong type or range;
    redsem.InvalidArgument (a ValueError) for a malformed URL or an unreadable TLS file;
    redsem.ConnectionError, redsem.TimeoutError, redsem.TLSError, redsem.PermissionDenied,
    redsem.ServerError, redsem.ProtocolError when the server cannot be reached or refuses.
    """

    def __init__(self, url: Optional[str] = None, *, tls_ca: Optional[PathLike] = None,
                 tls_ca_dir: Optional[PathLike] = None, tls_cert: Optional[PathLike] = None,
                 tls_key: Optional[PathLike] = None, tls_server_name: Optional[str] = None,
                 tls_insecure_skip_verify: bool = False,
                 connect_timeout: Optional[Seconds] = None,
                 command_timeout: Optional[Seconds] = None, retry: Optional[Seconds] = None,
                 max_connections: Optional[int] = None, key_prefix: Optional[str] = None,
                 sync_replicas: int = 0, sync_timeout: Optional[Seconds] = None) -> None:
        self._pid = os.getpid()
        popt = ffi.new("redsem_options **")
        _check(lib.redsem_options_new(popt))
        opt = ffi.gc(popt[0], lib.redsem_options_free)
        if url is not None:
            _check(lib.redsem_options_set_url(opt, _text(url, "url")), detail="bad URL")
        if tls_ca is not None or tls_ca_dir is not None:
            _check(lib.redsem_options_set_tls_ca(opt, _text(tls_ca, "tls_ca", none_ok=True),
                                                 _text(tls_ca_dir, "tls_ca_dir", none_ok=True)))
        if tls_cert is not None or tls_key is not None:
            _check(lib.redsem_options_set_tls_cert(
                opt, _text(tls_cert, "tls_cert", none_ok=True),
                _text(tls_key, "tls_key", none_ok=True)))
        if tls_server_name is not None:
            _check(lib.redsem_options_set_tls_server_name(
                opt, _text(tls_server_name, "tls_server_name")))
        if not isinstance(tls_insecure_skip_verify, bool):
            raise TypeError("tls_insecure_skip_verify must be a bool")
        if tls_insecure_skip_verify:
            _check(lib.redsem_options_set_tls_insecure_skip_verify(opt, True))
        if connect_timeout is not None:
            _check(lib.redsem_options_set_connect_timeout_ms(
                opt, _seconds_ms(connect_timeout, "connect_timeout")))
        if command_timeout is not None:
            _check(lib.redsem_options_set_command_timeout_ms(
                opt, _seconds_ms(command_timeout, "command_timeout")))
        if retry is not None:
            _check(lib.redsem_options_set_retry_ms(opt, _seconds_ms(retry, "retry")))
        if max_connections is not None:
            _check(lib.redsem_options_set_max_connections(
                opt, _count(max_connections, "max_connections", 0, 2**31 - 1)))
        if key_prefix is not None:
            _check(lib.redsem_options_set_key_prefix(opt, _text(key_prefix, "key_prefix")))
        replicas = _count(sync_replicas, "sync_replicas", 0, 2**31 - 1)
        if replicas:
            _check(lib.redsem_options_set_sync_replicas(
                opt, replicas, _seconds_ms(sync_timeout if sync_timeout is not None else 0.5,
                                           "sync_timeout")))
        pc = ffi.new("redsem_client **")
        buf = ffi.new("char[]", 512)
        rc = lib.redsem_client_new_verbose(opt, pc, buf, 512)
        if rc != 0:
            raise error_for(rc, _str(buf))
        self._node = _Native(pc[0], lib.redsem_client_free)
        self._async: Dict[Any, Any] = {}
        self._async_lock = threading.Lock()

    # -- lifetime

    def close(self) -> None:
        """Close the client: no new handle can be made; its connections are closed once
        every semaphore, lock, rate limiter and permit made from it is gone (their calls
        keep working until then). Idempotent."""
        with self._async_lock:
            bindings = list(self._async.values())
            self._async.clear()
        for b in bindings:
            b.close()
        self._node.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_node", None) is not None:
            self.close()

    def _call(self, fn: Callable[..., int], *args: Any) -> None:
        self._node.call("client", fn, *args)

    # -- handles

    def semaphore(self, name: str, limit: int, *, lease: Seconds = 30.0,
                  strategy: str = "fair", wait_lease: Optional[Seconds] = None,
                  guard_lease: Optional[Seconds] = None) -> "Semaphore":
        """Open (creating on first use) the counting semaphore ``name``.

        Args:
            name: 1..512 printable ASCII characters other than '{' and '}'.
            limit: permits, 1..1,000,000; recorded on the server the first time.
            lease: seconds each permit lasts without a refresh (0.01 .. 30 days).
            strategy: "basic", "fair" (arrival order) or "locked"; recorded on the server.
            wait_lease: seconds a queued fair/locked waiter keeps its place unrenewed.
            guard_lease: seconds of the locked strategy's guard lock.
        Raises: redsem.Conflict (the server records another strategy or limit: nothing
            changed), redsem.InvalidArgument, TypeError, redsem.ServerError (a key of that
            name is not redsem's), and the connection errors of the class doc.
        Server: one script call (creates the semaphore's record if absent)."""
        return Semaphore(self, name, limit, lease, strategy, wait_lease, guard_lease)

    def lock(self, name: str, *, lease: Seconds = 30.0, reentrant: bool = False) -> "Lock":
        """A handle on the lock ``name`` (nothing is sent).

        Args:
            name: as for semaphore().
            lease: seconds the lock lasts without a refresh (0.01 .. 30 days).
            reentrant: this handle may take the lock again while it holds it (a hold count
                kept on the server; each permit's release decrements it).
        Raises: redsem.InvalidArgument, TypeError, redsem.ForkedError."""
        return Lock(self, name, lease, reentrant)

    def rate(self, name: str, limit: int, window: Seconds) -> "RateLimiter":
        """Open (creating on first use) the rate limit ``name``: at most ``limit`` grants in
        any rolling window of ``window`` seconds (0.01 .. 30 days), on the server's clock.

        Raises: redsem.Conflict (another limit or window recorded), redsem.InvalidArgument,
        TypeError, and the connection errors of the class doc."""
        return RateLimiter(self, name, limit, window)

    # -- client-wide calls

    def ping(self) -> None:
        """One round trip to the server (PING), reconnecting first if needed.

        Raises: redsem.ConnectionError, redsem.TimeoutError, redsem.PermissionDenied,
        redsem.ServerError, redsem.ForkedError."""
        self._call(lib.redsem_client_ping)

    def stats(self) -> Dict[str, int]:
        """The client's counters (requests, connects, script_loads, noscript, retries,
        wakeups, redirects, pool_waits, pipelined, direct_grants) and the renewer's
        (renewals, renew_failures, lost_expired, lost_deadline, renew_round_trips, and
        max_lateness in seconds). No I/O."""
        s = ffi.new("redsem_client_stats *")
        self._call(lib.redsem_client_get_stats, s)
        r = ffi.new("redsem_renew_stats *")
        self._call(lib.redsem_client_renew_stats, r)
        out: Dict[str, Any] = {k: int(getattr(s, k)) for k in (
            "requests", "connects", "script_loads", "noscript", "retries", "wakeups",
            "redirects", "pool_waits", "pipelined", "direct_grants")}
        out.update(renewals=int(r.renewals), renew_failures=int(r.failures),
                   lost_expired=int(r.lost_expired), lost_deadline=int(r.lost_deadline),
                   renew_round_trips=int(r.round_trips),
                   max_lateness=r.max_lateness_ms / 1000.0)
        return out

    def inspect(self, name: str, max_entries: int = 16) -> Status:
        """Status of the semaphore ``name`` without opening it (records nothing).

        ``max_entries`` (0..1,000,000) holders and waiters are listed; counts are exact.
        Raises: redsem.InvalidArgument, TypeError, connection errors."""
        ps = ffi.new("redsem_status **")
        self._call(lib.redsem_sem_inspect, _text(name, "name"),
                   _count(max_entries, "max_entries"), ps)
        return _status_from(ps[0], False)

    def inspect_rate(self, name: str) -> RateStatus:
        """Status of the rate limit ``name`` whatever its limit and window (records nothing).

        Raises: redsem.Conflict (not a rate's key), redsem.InvalidArgument, TypeError,
        connection errors."""
        info = ffi.new("redsem_rate_info *")
        self._call(lib.redsem_rate_inspect, _text(name, "name"), info)
        return _rate_status_from(info)


def _check(rc: int, detail: str = "") -> None:
    if rc != 0:
        raise error_for(rc, detail)


def _new_id() -> str:
    # the format of redsem_id_generate() (20 bytes of a CSPRNG, lower-case hex), from the
    # OS's generator as libsodium's randombytes_buf() reads it: no C call on the hot path
    return os.urandom(20).hex()


def generate_id() -> str:
    """A fresh holder identifier: 40 lower-case hex characters (20 random bytes from
    libsodium's randombytes_buf(), as the C library makes them)."""
    buf = ffi.new("char[]", lib.REDSEM_ID_BUFSIZE)
    _check(lib.redsem_id_generate(buf))
    return ffi.string(buf).decode()


# --------------------------------------------------------------------------- permits

_lost_registry: Dict[int, Tuple["weakref.ref[Permit]", Callable[["Permit", LostReason], Any]]] = {}
_lost_next = [1]
_lost_lock = threading.RLock()  # re-entrant: a collection may finalize a permit inside


@ffi.def_extern()
def _redsem_on_lost(permit: Any, reason: int, user_data: Any) -> None:
    key = int(ffi.cast("uintptr_t", user_data))
    with _lost_lock:
        entry = _lost_registry.pop(key, None)
    if entry is None:
        return
    obj = entry[0]()
    if obj is None:
        return
    _cb_state.active = True
    try:
        entry[1](obj, LostReason(reason))
    finally:
        _cb_state.active = False


class Permit:
    """One grant of a semaphore (possibly of several permits) or of a lock.

    A context manager: ``with sem.acquire(timeout=5.0) as permit:`` releases it at the end
    of the block. Attributes: ``id`` (the holder identifier, 40 hex chars), ``token`` (the
    fencing token: strictly increasing over the grants of the name), ``weight`` (permits
    it stands for). A permit dropped without release() is freed without releasing (its
    lease expires on the server); its renewal, if any, stops."""

    __slots__ = ("_node", "_owner", "_client", "id", "token", "weight", "_renew_key",
                 "__weakref__")

    def __init__(self, owner: Any, client: Client, ptr: Any, id: Optional[str] = None,
                 weight: int = 0) -> None:
        self._node = _Native(ptr, lib.redsem_permit_free, owner._node)
        self._owner = owner  # keeps the semaphore or lock (and its client) alive
        self._client = client
        self.id: str = id if id is not None else _str(lib.redsem_permit_id(ptr))
        self.token: int = int(lib.redsem_permit_token(ptr))
        self.weight: int = weight if weight else int(lib.redsem_permit_weight(ptr))
        self._renew_key = 0

    def __repr__(self) -> str:
        return f"<redsem.Permit id={self.id} token={self.token} held={self.held}>"

    @property
    def held(self) -> bool:
        """Whether this holder still believes it holds the permit: not released, not found
        lost, validity left. No I/O; any thread."""
        return bool(self._node.read(lib.redsem_permit_held, False))

    @property
    def validity(self) -> float:
        """Seconds of validity left on the monotonic clock (0.0 once lost or released).
        Act on the resource only while it is > 0. No I/O."""
        return self._node.read(lib.redsem_permit_validity_ms, 0) / 1000.0

    @property
    def deadline(self) -> float:
        """The validity deadline, in seconds on time.monotonic()'s clock (CLOCK_MONOTONIC)."""
        return self._node.read(lib.redsem_permit_deadline_ms, 0) / 1000.0

    def refresh(self) -> None:
        """Extend the lease by the handle's lease, counted from now.

        Raises: redsem.Lost (expired, released or taken over: the permit stays lost),
        redsem.StateError (already released), redsem.ConnectionError, redsem.TimeoutError,
        redsem.ServerError, redsem.ReplicaError, redsem.ForkedError."""
        self._node.call("permit", lib.redsem_permit_refresh)

    def release(self) -> None:
        """Give the permit back (stopping its renewal first) and free it.

        Raises: redsem.Lost (the lease had run out or was taken over: nothing of anyone
        else's was touched), redsem.StateError (already released), redsem.ConnectionError,
        redsem.TimeoutError (the permit stays releasable), redsem.ForkedError."""
        self._unregister()
        try:
            self._node.call("permit", lib.redsem_permit_release)
        except (Lost, StateError):
            self._node.close()  # lost: its own entry was removed; nothing left to release
            raise
        self._node.close()

    def auto_renew(self, interval: Optional[Seconds] = None,
                   on_lost: Optional[Callable[["Permit", LostReason], Any]] = None) -> None:
        """Keep the lease alive from the client's renewer thread until released or lost
        (a permit acquired through asyncio on a one-server client, with the default loop
        engine: from its event loop, whose thread then runs on_lost).

        Args:
            interval: seconds between renewals; None: a third of the lease. At most the
                lease minus the refresh margin (InvalidArgument otherwise).
            on_lost: called once as ``on_lost(permit, reason)`` if the permit is lost
                (reason a LostReason). It runs on the renewer thread, holding the GIL: it
                must be quick and must not call the library (set an event, signal a
                worker); calls on the permit from it raise redsem.StateError.
        Raises: redsem.StateError (released, lost, or already renewed),
            redsem.InvalidArgument, TypeError, redsem.ForkedError."""
        ms = 0 if interval is None else _seconds_ms(interval, "interval")
        if interval is not None and ms == 0:
            raise ValueError("interval must be > 0 seconds (None: a third of the lease)")
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be callable")
        key = 0
        if on_lost is not None:
            with _lost_lock:
                key = _lost_next[0]
                _lost_next[0] += 1
                _lost_registry[key] = (weakref.ref(self), on_lost)
        try:
            self._node.call("permit", lib.redsem_permit_auto_renew, ms,
                            lib._redsem_on_lost if key else ffi.NULL, ffi.cast("void *", key))
        except BaseException:
            with _lost_lock:
                _lost_registry.pop(key, None)
            raise
        self._renew_key = key

    def stop_renewal(self) -> None:
        """Stop renewing (the permit stays held until its lease ends); waits for a renewal
        in flight. Raises: redsem.ForkedError."""
        self._node.call("permit", lib.redsem_permit_stop_renewal)
        self._unregister()

    def _unregister(self) -> None:
        if self._renew_key:
            with _lost_lock:
                _lost_registry.pop(self._renew_key, None)
            self._renew_key = 0

    async def release_async(self) -> None:
        """release() for asyncio: awaits the release without blocking the event loop.
        Raises as release()."""
        await _aio.release_async(self)

    async def refresh_async(self) -> None:
        """refresh() for asyncio, without blocking the event loop. Raises as refresh()."""
        await _aio.refresh_async(self)

    def close(self) -> None:
        """Free the local permit without releasing it (its lease expires on the server);
        stops its renewal. Idempotent."""
        self._unregister()
        self._node.close()

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._node.ptr is None:
            return
        if exc_type is None:
            self.release()
            return
        try:  # an exception is already on its way: do not hide it
            self.release()
        except Error:
            self.close()

    def __del__(self) -> None:
        node = getattr(self, "_node", None)
        if node is not None and node.ptr is not None:
            self._unregister()
            node.close()


# --------------------------------------------------------------------------- semaphore


class Semaphore:
    """A counting semaphore: at most ``limit`` permits held at once across every client.

    Made by Client.semaphore(). Properties: ``name``, ``strategy``, ``limit`` (as last seen
    on the server), ``lease`` (seconds)."""

    __slots__ = ("_node", "_client", "__weakref__")

    def __init__(self, client: Client, name: str, limit: int, lease: Seconds, strategy: str,
                 wait_lease: Optional[Seconds], guard_lease: Optional[Seconds]) -> None:
        if not isinstance(strategy, str):
            raise TypeError(f"strategy must be a str, not {type(strategy).__name__}")
        if strategy not in _STRATEGY_CODES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, "
                             f"not {strategy!r}")
        bname = _text(name, "name")
        n = _count(limit, "limit")
        lease_ms = _seconds_ms(lease, "lease")
        wl = None if wait_lease is None else _seconds_ms(wait_lease, "wait_lease")
        gl = None if guard_lease is None else _seconds_ms(guard_lease, "guard_lease")
        ps = ffi.new("redsem_sem **")
        client._call(lib.redsem_sem_open, bname, _STRATEGY_CODES[strategy], n, lease_ms, ps)
        self._client = client
        self._node = _Native(ps[0], lib.redsem_sem_free, client._node)
        if wl is not None:
            self._node.call("semaphore", lib.redsem_sem_set_wait_lease_ms, wl)
        if gl is not None:
            self._node.call("semaphore", lib.redsem_sem_set_guard_lease_ms, gl)

    def __repr__(self) -> str:
        return f"<redsem.Semaphore {self.name!r} {self.strategy} limit={self.limit}>"

    def _get(self, fn: Callable[[Any], Any]) -> Any:
        return self._node.read(fn, None) if not self._node.closed else _closed("semaphore")

    @property
    def name(self) -> str:
        return self._get(lambda p: _str(lib.redsem_sem_name(p)))

    @property
    def strategy(self) -> str:
        return self._get(lambda p: _str(lib.redsem_strategy_name(lib.redsem_sem_strategy(p))))

    @property
    def limit(self) -> int:
        return int(self._get(lib.redsem_sem_limit))

    @property
    def lease(self) -> float:
        return self._get(lib.redsem_sem_lease_ms) / 1000.0

    def acquire(self, timeout: Optional[Seconds] = None, *, permits: int = 1,
                holder_id: Optional[str] = None) -> Permit:
        """Take ``permits`` permits at once (all or none), waiting up to ``timeout`` seconds.

        Args:
            timeout: seconds to wait; 0 tries once; None (or math.inf) waits however long.
            permits: the weight, 1..the limit.
            holder_id: retry an earlier acquire idempotently (after redsem.Unknown): the
                same holder gets the same permit back, never a second one.
        Returns: a Permit (a context manager that releases it).
        Raises: redsem.Busy (no permit in time), redsem.Unknown (the outcome is unknown:
            retry with ``holder_id=err.holder_id``), redsem.InvalidArgument (permits above
            the limit on the server, a malformed holder_id), TypeError, ValueError,
            redsem.Conflict, redsem.ConnectionError, redsem.TimeoutError,
            redsem.ServerError, redsem.ReplicaError, redsem.ForkedError.
        Blocks without the GIL; any thread. On the main thread a wait ends at once on
        Ctrl-C (KeyboardInterrupt, or a signal handler's exception), the acquire cancelled
        and nothing left held (not with holder_id)."""
        ms = _seconds_ms(timeout, "timeout", forever_ok=True)
        n = _count(permits, "permits")
        hid = _new_id() if holder_id is None else holder_id
        bid = _text(hid, "holder_id")
        pp = ffi.new("redsem_permit **")
        if ms != 0 and holder_id is None and _on_main_thread():
            # a wait on the main thread: a try now, then the interruptible wait
            t0 = time.monotonic()
            try:
                self._node.call("semaphore", lib.redsem_sem_acquire_as_n, bid, n, 0, pp,
                                holder_id=hid)
            except Busy:
                return _aio.wait_interruptibly(self, lib.redsem_sem_acquire_async, n,
                                          _left(ms, t0))
            return Permit(self, self._client, pp[0], hid, n)
        self._node.call("semaphore", lib.redsem_sem_acquire_as_n, bid, n, ms, pp, holder_id=hid)
        return Permit(self, self._client, pp[0], hid, n)

    def try_acquire(self, *, permits: int = 1) -> Optional[Permit]:
        """Take ``permits`` permits if free now (fair/locked: only if nobody is queued).

        Returns: a Permit, or None if none is free. Raises as acquire() (never Busy)."""
        try:
            return self.acquire(0, permits=permits)
        except Busy:
            return None

    def adopt(self, holder_id: str) -> Permit:
        """A Permit for a holder that holds a permit now (e.g. one another process took):
        the identifier is the capability. Raises: redsem.Lost (no such live permit),
        redsem.InvalidArgument, connection errors."""
        pp = ffi.new("redsem_permit **")
        self._node.call("semaphore", lib.redsem_sem_adopt, _text(holder_id, "holder_id"), pp)
        return Permit(self, self._client, pp[0])

    def _permit(self, ptr: Any) -> Permit:
        """A Permit for a C permit of this semaphore (the event-loop API's grants: _aio)."""
        return Permit(self, self._client, ptr)

    def set_limit(self, limit: int) -> None:
        """Change the limit on the server, for every client (raising it wakes waiters;
        lowering it revokes nothing). Raises: redsem.InvalidArgument, redsem.Conflict,
        connection errors."""
        self._node.call("semaphore", lib.redsem_sem_set_limit, _count(limit, "limit"))

    def status(self, max_entries: int = 16) -> Status:
        """What the server holds now (read-only): exact counts, at most ``max_entries``
        holders and waiters listed. Raises: redsem.InvalidArgument, connection errors."""
        ps = ffi.new("redsem_status **")
        self._node.call("semaphore", lib.redsem_sem_status, _count(max_entries, "max_entries"),
                        ps)
        return _status_from(ps[0], False)

    def acquire_async(self, timeout: Optional[Seconds] = None, *,
                      permits: int = 1) -> "Any":
        """acquire() for asyncio: ``await sem.acquire_async(timeout=5.0)`` or
        ``async with sem.acquire_async(timeout=5.0) as permit:``. Cancelling the task
        cancels the acquire; a permit granted meanwhile is released, never left held.
        Raises as acquire()."""
        return _aio.AsyncAcquire(self, _seconds_ms(timeout, "timeout", forever_ok=True),
                            _count(permits, "permits", 1))

    def close(self) -> None:
        """Free the handle once its permits are gone (they stay valid). Idempotent."""
        self._node.close()

    def __del__(self) -> None:
        node = getattr(self, "_node", None)
        if node is not None:
            node.close()


# --------------------------------------------------------------------------- lock


class Lock:
    """A distributed lock (mutex) with fencing tokens; made by Client.lock().

    ``with lock.acquire(timeout=5.0):`` holds it for the block. Properties: ``name``,
    ``lease`` (seconds), ``reentrant``."""

    __slots__ = ("_node", "_client", "name", "lease", "reentrant", "__weakref__")

    def __init__(self, client: Client, name: str, lease: Seconds, reentrant: bool) -> None:
        if not isinstance(reentrant, bool):
            raise TypeError("reentrant must be a bool")
        bname = _text(name, "name")
        lease_ms = _seconds_ms(lease, "lease")
        pl = ffi.new("redsem_lock **")
        client._call(lib.redsem_lock_open, bname, lease_ms, pl)
        self._client = client
        self._node = _Native(pl[0], lib.redsem_lock_free, client._node)
        self.name: str = name
        self.lease: float = lease_ms / 1000.0
        self.reentrant: bool = reentrant
        if reentrant:
            self._node.call("lock", lib.redsem_lock_set_reentrant, True)

    def __repr__(self) -> str:
        return f"<redsem.Lock {self.name!r}>"

    def acquire(self, timeout: Optional[Seconds] = None, *,
                token: Optional[str] = None) -> Permit:
        """Take the lock, waiting up to ``timeout`` seconds (0: try once; None: forever).

        ``token`` retries an earlier acquire idempotently (after redsem.Unknown; not on a
        reentrant handle). Returns a Permit (a context manager releasing it).
        Raises: redsem.Busy, redsem.Unknown (``holder_id`` is the token to retry with),
        redsem.InvalidArgument, TypeError, ValueError, connection errors,
        redsem.ReplicaError, redsem.ForkedError. Blocks without the GIL; any thread. On the
        main thread a wait ends at once on Ctrl-C, the acquire cancelled (not with token)."""
        ms = _seconds_ms(timeout, "timeout", forever_ok=True)
        pp = ffi.new("redsem_permit **")
        if ms != 0 and token is None and _on_main_thread():
            # a wait on the main thread: a try now, then the interruptible wait
            t0 = time.monotonic()
            try:
                return self.acquire(0)
            except Busy:
                return _aio.wait_interruptibly(self, lib.redsem_lock_acquire_async, _left(ms, t0))
        if self.reentrant and token is None:
            self._node.call("lock", lib.redsem_lock_acquire, ms, pp)
        else:
            tok = _new_id() if token is None else token
            self._node.call("lock", lib.redsem_lock_acquire_as, _text(tok, "token"), ms, pp,
                            holder_id=tok)
            return Permit(self, self._client, pp[0], tok, 1)
        return Permit(self, self._client, pp[0])

    def try_acquire(self) -> Optional[Permit]:
        """Take the lock if it is free now; None if another owner holds it."""
        try:
            return self.acquire(0)
        except Busy:
            return None

    def adopt(self, token: str) -> Permit:
        """A Permit for the lock's current owner token. Raises: redsem.Lost (not held with
        that token), redsem.InvalidArgument, connection errors."""
        pp = ffi.new("redsem_permit **")
        self._node.call("lock", lib.redsem_lock_adopt, _text(token, "token"), pp)
        return Permit(self, self._client, pp[0])

    def _permit(self, ptr: Any) -> Permit:
        """A Permit for a C permit of this lock (the event-loop API's grants: _aio)."""
        return Permit(self, self._client, ptr)

    def status(self, max_entries: int = 16) -> Status:
        """Who holds the lock now (strategy "lock", limit 1, hold_count for reentrancy)."""
        ps = ffi.new("redsem_status **")
        self._node.call("lock", lib.redsem_lock_status, _count(max_entries, "max_entries"), ps)
        return _status_from(ps[0], True)

    def acquire_async(self, timeout: Optional[Seconds] = None) -> "Any":
        """acquire() for asyncio (``await`` or ``async with``); cancelling the task cancels
        it and never leaves the lock held. Raises as acquire()."""
        return _aio.AsyncAcquire(self, _seconds_ms(timeout, "timeout", forever_ok=True), 1)

    def close(self) -> None:
        """Free the handle once its permits are gone. Idempotent."""
        self._node.close()

    def __del__(self) -> None:
        node = getattr(self, "_node", None)
        if node is not None:
            node.close()


# --------------------------------------------------------------------------- rate


@dataclass(frozen=True)
class Grant:
    """One rate-limit grant: ``token`` (fencing token), ``granted_at`` (the server's time of
    the grant, seconds since the epoch: it counts in every window containing that instant),
    ``id`` (the holder identifier used). A context manager for symmetry with permits: a
    grant has nothing to give back, so leaving the block does nothing."""

    token: int
    granted_at: float
    id: str

    def __enter__(self) -> "Grant":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class RateLimiter:
    """At most ``limit`` grants in any rolling window of ``window`` seconds (server clock);
    made by Client.rate()."""

    __slots__ = ("_node", "_client", "name", "limit", "window", "__weakref__")

    def __init__(self, client: Client, name: str, limit: int, window: Seconds) -> None:
        bname = _text(name, "name")
        n = _count(limit, "limit")
        wms = _seconds_ms(window, "window")
        pr = ffi.new("redsem_rate **")
        client._call(lib.redsem_rate_open, bname, n, wms, pr)
        self._client = client
        self._node = _Native(pr[0], lib.redsem_rate_free, client._node)
        self.name: str = name
        self.limit: int = n
        self.window: float = wms / 1000.0

    def __repr__(self) -> str:
        return f"<redsem.RateLimiter {self.name!r} {self.limit}/{self.window}s>"

    def acquire(self, timeout: Optional[Seconds] = None, *,
                holder_id: Optional[str] = None) -> Grant:
        """Take a grant, waiting in arrival order up to ``timeout`` seconds (0: try once;
        None: forever).

        Raises: redsem.Busy (``retry_after``: seconds until a request made now would be
        granted), redsem.Unknown (``holder_id``: retry with it, idempotently),
        redsem.Conflict, redsem.InvalidArgument, TypeError, ValueError, connection errors,
        redsem.ReplicaError (granted but not replicated: do not use it)."""
        ms = _seconds_ms(timeout, "timeout", forever_ok=True)
        hid = _new_id() if holder_id is None else holder_id
        g = ffi.new("redsem_rate_grant *")
        try:
            self._node.call("rate limiter", lib.redsem_rate_acquire_as, _text(hid, "holder_id"),
                            ms, g, holder_id=hid)
        except Busy as err:
            err.retry_after = g.retry_after_ms / 1000.0 if g.retry_after_ms >= 0 else None
            raise
        return Grant(int(g.token), g.granted_us / 1e6, ffi.string(g.id).decode())

    def try_acquire(self) -> Optional[Grant]:
        """A grant now, or None (see acquire() for the errors)."""
        try:
            return self.acquire(0)
        except Busy:
            return None

    def status(self) -> RateStatus:
        """The window on the server now (read-only)."""
        info = ffi.new("redsem_rate_info *")
        self._node.call("rate limiter", lib.redsem_rate_status, info)
        return _rate_status_from(info)

    def close(self) -> None:
        """Free the handle (grants are not affected). Idempotent."""
        self._node.close()

    def __del__(self) -> None:
        node = getattr(self, "_node", None)
        if node is not None:
            node.close()
