"""asyncio support, driven by the C library's event-loop API (redsem/async.h).

As pycares drives c-ares: the library names a descriptor to watch (loop.add_reader) and,
if it wants one, a timer (loop.call_later); when either fires, redsem_async_action() runs
the completion callbacks of the finished operations on the loop's thread, which resolve
asyncio futures. One redsem_async per (Client, event loop), made on first use.

It takes nothing from _core (which calls it): the clients, semaphores, locks and permits
it is given are used through their attributes (_node, _client, _async) and a semaphore's
or lock's _permit(), which wraps a granted C permit.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import select
import threading
import time
from typing import Any, Dict, Optional

from ._errors import Busy, Error, Unknown, error_for
from ._native import _cb_state, _Native, _str
from ._redsem import ffi, lib

_bindings: Dict[int, "_Binding"] = {}
_ops: Dict[int, "_Op"] = {}
_keys = itertools.count(1)
_lock = threading.RLock()  # re-entrant: a collection may close a binding inside


class _Op:
    __slots__ = ("binding", "future", "owner", "permit", "op", "pinned", "release")

    def __init__(self, binding: "_Binding", future: Optional["asyncio.Future[Any]"],
                 owner: Any = None, permit: Any = None) -> None:
        self.binding = binding
        self.future = future
        self.owner = owner      # the semaphore or lock: alive until the callback ran
        self.permit = permit    # refresh/release: the permit, alive until the callback ran
        self.op = 0
        self.pinned: Optional[_Native] = None  # the handle the C operation uses
        self.release = False  # a release: the permit is freed once it is given back


class _Binding:
    """One redsem_async bound to one asyncio loop, or (loop None) driven by the main
    thread's blocking waits (wait_interruptibly)."""

    def __init__(self, client: Any, loop: Optional[asyncio.AbstractEventLoop]) -> None:
        self.client = client
        self.loop = loop
        self.timer: Optional[asyncio.TimerHandle] = None
        self.deadline: Optional[float] = None  # loop None: when the timer is due
        self.fds: set = set()
        pa = ffi.new("redsem_async **")
        client._call(lib.redsem_async_new, pa)
        self.node = _Native(pa[0], lib.redsem_async_free, client._node)
        self.key = next(_keys)
        with _lock:
            _bindings[self.key] = self
        try:
            self.node.call("event-loop binding", lib.redsem_async_set_loop,
                           lib._redsem_on_socket, lib._redsem_on_timer,
                           ffi.cast("void *", self.key))
        except BaseException:
            self.close()
            raise

    def action(self, fd: int, events: int) -> None:
        self.node.read(lambda p: lib.redsem_async_action(p, fd, events), None)

    def cancel(self, op: int) -> None:
        self.node.read(lambda p: lib.redsem_async_cancel(p, op), None)

    def close(self) -> None:
        """Cancel what is pending (callbacks run now) and free; the loop's thread or a
        closed loop's."""
        self.node.close()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        with _lock:
            _bindings.pop(self.key, None)

    def start(self, future: "asyncio.Future[Any]", owner: Any, permit: Any,
              fn: Any, *args: Any, release: bool = False) -> _Op:
        """Start fn(async, handle, *args, cb, user, &op) on the owner's (semaphore, lock)
        or the permit's handle, pinned until the completion ran."""
        handle = owner._node if owner is not None else permit._node  # type: ignore[union-attr]
        hptr = handle.pin("permit" if owner is None else "handle")
        op = _Op(self, future, owner, permit)
        op.pinned = handle
        op.release = release
        key = next(_keys)
        with _lock:
            _ops[key] = op
        pop = ffi.new("uint64_t *")
        try:
            self.node.call("event-loop binding",
                           lambda a: fn(a, hptr, *args, lib._redsem_on_done,
                                        ffi.cast("void *", key), pop))
        except BaseException:
            with _lock:
                _ops.pop(key, None)
            handle.unpin()
            raise
        op.op = int(pop[0])
        return op


def _binding(client: Any) -> _Binding:
    loop = asyncio.get_running_loop()
    with client._async_lock:
        b = client._async.get(loop)
        if b is not None:
            return b
        stale = [lp for lp in client._async if lp is not None and lp.is_closed()]
        old = [client._async.pop(lp) for lp in stale]
    for ob in old:
        ob.close()
    b = _Binding(client, loop)
    with client._async_lock:
        client._async[loop] = b
    return b


@ffi.def_extern()
def _redsem_on_socket(async_: Any, fd: int, what: int, loop_data: Any) -> None:
    b = _bindings.get(int(ffi.cast("uintptr_t", loop_data)))
    if b is None:
        return
    try:
        if what & lib.REDSEM_WATCH_REMOVE:
            b.fds.discard(fd)
            if b.loop is not None:
                b.loop.remove_reader(fd)
        else:  # 0.4 asks for reading only; writability is not needed
            b.fds.add(fd)
            if b.loop is not None:
                b.loop.add_reader(fd, b.action, fd, lib.REDSEM_WATCH_IN)
    except Exception:  # a closed loop: nothing to watch any more
        pass


@ffi.def_extern()
def _redsem_on_timer(async_: Any, timeout_ms: int, loop_data: Any) -> None:
    b = _bindings.get(int(ffi.cast("uintptr_t", loop_data)))
    if b is None:
        return
    if b.loop is None:
        b.deadline = time.monotonic() + timeout_ms / 1000.0 if timeout_ms >= 0 else None
        return
    if b.timer is not None:
        b.timer.cancel()
        b.timer = None
    if timeout_ms >= 0:
        try:
            b.timer = b.loop.call_later(timeout_ms / 1000.0, b.action, -1, 0)
        except Exception:
            pass


@ffi.def_extern()
def _redsem_on_done(async_: Any, result: Any, user: Any) -> None:
    _cb_state.defer = True  # no handle is freed inside redsem_async_action()
    try:
        _done(result, user)
    finally:
        _cb_state.defer = False


def _done(result: Any, user: Any) -> None:
    with _lock:
        op = _ops.pop(int(ffi.cast("uintptr_t", user)), None)
    if op is None:
        return
    try:
        _complete(op, result)
    finally:
        if op.pinned is not None:
            op.pinned.unpin()


def _complete(op: _Op, result: Any) -> None:
    rc = result.rc
    fut = op.future
    permit = None
    if result.permit != ffi.NULL:
        permit = op.owner._permit(result.permit)
    if result.status != ffi.NULL:
        lib.redsem_status_free(result.status)
    if op.release and rc in (0, lib.REDSEM_ELOST):
        op.permit._node.close()  # type: ignore[union-attr]
    err = error_for(rc, _str(result.errmsg)) if rc != 0 else None
    if isinstance(err, Unknown):
        # the event-loop API takes no holder id, but its message names the one it used
        m = _HOLDER_RE.search(err.detail)
        err.holder_id = m.group(1) if m else None
    if fut is None or fut.done() or fut.get_loop().is_closed():
        # the awaiting task was cancelled meanwhile (or its loop is gone): never leave a
        # granted permit held
        if permit is not None:
            _release_quietly(op.binding, permit)
        elif isinstance(err, Unknown) and err.holder_id and op.owner is not None:
            _settle(op.owner, err.holder_id)
        return
    if err is None:
        fut.set_result(permit)
    elif rc == lib.REDSEM_ECANCELED:
        fut.cancel()
    else:
        fut.set_exception(err)


_HOLDER_RE = re.compile(r"holder ([0-9a-f]{40})")
settled = 0  # cancelled acquires with an unknown outcome settled by _settle (for the tests)


def _settle(owner: Any, holder_id: str) -> None:
    """A cancelled acquire whose outcome is unknown may hold (or, queued, be granted) a
    permit under holder_id: acquire again with that id, on a thread of its own (it blocks
    for a round trip), and release what it gets."""
    if getattr(owner, "reentrant", False):
        return  # a reentrant lock's acquire takes no token; its lease expires by itself

    def run() -> None:
        global settled
        try:
            if hasattr(owner, "strategy"):
                p = owner.acquire(timeout=0.05, holder_id=holder_id)
            else:
                p = owner.acquire(timeout=0.05, token=holder_id)
            p.release()
        except (Busy, Error):
            pass  # not granted (and out of the queue), or the lease is left to expire
        settled += 1

    threading.Thread(target=run, name="redsem-settle", daemon=True).start()


def _release_quietly(b: _Binding, permit: Any) -> None:
    """Give a permit nobody awaits any more back, without blocking the loop."""
    try:
        fut = b.loop.create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        b.start(fut, None, permit, lib.redsem_permit_release_async, release=True)
    except Error:
        permit.close()  # not startable (the binding is closing): the lease expires


class AsyncAcquire:
    """What Semaphore.acquire_async() and Lock.acquire_async() return: await it for a
    Permit, or use it as ``async with`` (the permit is released at the end of the block)."""

    def __init__(self, owner: Any, timeout_ms: int, permits: int) -> None:
        self._owner = owner
        self._timeout_ms = timeout_ms
        self._permits = permits
        self._permit: Any = None

    async def _run(self) -> Any:
        owner = self._owner
        b = _binding(owner._client)
        fut: "asyncio.Future[Any]" = b.loop.create_future()
        if hasattr(owner, "strategy"):
            op = b.start(fut, owner, None, lib.redsem_sem_acquire_async, self._permits,
                         self._timeout_ms)
        else:
            op = b.start(fut, owner, None, lib.redsem_lock_acquire_async, self._timeout_ms)
        try:
            return await fut
        except asyncio.CancelledError:
            # cancel the acquire; a permit it was granted meanwhile is released by the
            # completion callback (the future is done), so none is left held
            b.cancel(op.op)
            raise

    def __await__(self) -> Any:
        return self._run().__await__()

    async def __aenter__(self) -> Any:
        self._permit = await self._run()
        return self._permit

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        p, self._permit = self._permit, None
        if p is None or p._node.ptr is None:
            return
        if exc_type is None:
            await release_async(p)
            return
        try:
            await release_async(p)
        except Error:
            p.close()


async def release_async(permit: Any) -> None:
    """Permit.release() without blocking the loop; raises as release()."""
    permit._unregister()
    b = _binding(permit._client)
    fut: "asyncio.Future[Any]" = b.loop.create_future()
    b.start(fut, None, permit, lib.redsem_permit_release_async, release=True)
    await asyncio.shield(fut)


async def refresh_async(permit: Any) -> None:
    """Permit.refresh() without blocking the loop; raises as refresh()."""
    b = _binding(permit._client)
    fut: "asyncio.Future[Any]" = b.loop.create_future()
    b.start(fut, None, permit, lib.redsem_permit_refresh_async)
    await asyncio.shield(fut)


# --------------------------------------------------------------------------- blocking waits


class _NoLoop:
    @staticmethod
    def is_closed() -> bool:
        return False


class _Waiter:
    """The future of a blocking wait (the completion runs on the waiting thread)."""

    __slots__ = ("finished", "result", "exc")

    def __init__(self) -> None:
        self.finished = False
        self.result: Any = None
        self.exc: Optional[BaseException] = None

    def done(self) -> bool:
        return self.finished

    def get_loop(self) -> Any:
        return _NoLoop

    def set_result(self, value: Any) -> None:
        self.result, self.finished = value, True

    def set_exception(self, exc: BaseException) -> None:
        self.exc, self.finished = exc, True

    def cancel(self) -> None:
        self.finished = True


def _main_binding(client: Any) -> _Binding:
    with client._async_lock:
        b = client._async.get(None)
        if b is None:
            b = _Binding(client, None)
            client._async[None] = b
        return b


def _drive(b: _Binding, w: _Waiter) -> None:
    """Wait for the descriptor (and the timer, if one is asked for) and run completions."""
    while not w.finished:
        fds = list(b.fds)
        timeout = None if b.deadline is None else max(0.0, b.deadline - time.monotonic())
        ready = select.select(fds, [], [], timeout)[0] if fds else []
        if b.deadline is not None and time.monotonic() >= b.deadline:
            b.deadline = None
            b.action(-1, 0)
        for fd in ready:
            b.action(fd, lib.REDSEM_WATCH_IN)


def wait_interruptibly(owner: Any, fn: Any, *args: Any) -> Any:
    """A blocking acquire's wait, made through the event-loop API and driven here with
    select(), so that an exception of a signal handler (KeyboardInterrupt on Ctrl-C)
    interrupts it: the acquire is then cancelled, a permit granted meanwhile released and
    an unknown outcome settled, before the exception goes on. Main thread only (signal
    handlers run there; one thread drives the binding)."""
    b = _main_binding(owner._client)
    w = _Waiter()
    op = b.start(w, owner, None, fn, *args)  # type: ignore[arg-type]
    try:
        _drive(b, w)
    except BaseException:
        b.cancel(op.op)
        while True:  # its completion follows within about a round trip
            try:
                _drive(b, w)
                break
            except BaseException:  # another signal: keep cleaning up
                continue
        p, w.result = w.result, None
        if p is not None:  # a permit granted meanwhile
            try:
                p.release()
            except Error:
                p.close()
        elif isinstance(w.exc, Unknown) and w.exc.holder_id:
            _settle(owner, w.exc.holder_id)
        raise
    if w.exc is not None:
        raise w.exc
    if w.result is None:  # cancelled by someone else: not expected
        raise error_for(lib.REDSEM_ECANCELED)
    return w.result
