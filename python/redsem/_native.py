"""The C handles' lifetimes, shared by the blocking API (_core) and asyncio (_aio).

The C library wants a permit freed before its semaphore, a semaphore before its client,
and no handle freed from a lost-lease callback or an event-loop completion; _Native orders
that for Python's garbage collector and for threads.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Tuple

from ._errors import StateError, Unknown, error_for
from ._redsem import ffi, lib

def _str(p: Any) -> str:
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""


# --------------------------------------------------------------------------- native handles

class _State(threading.local):
    active = False  # this thread runs a lost-lease callback
    defer = False   # this thread runs an event-loop completion


_cb_state = _State()
_deferred: List[Tuple["_Native", Any]] = []
_tree_lock = threading.RLock()


def _in_callback() -> bool:
    st = _cb_state
    return st.active or st.defer


class _Native:
    """One C handle, freed once it was closed, no call on it is running (pins) and every
    handle made from it was freed (children).

    The C library wants a permit freed before its semaphore, a semaphore before its client,
    and no handle freed while a call on it runs; Python's garbage collector promises no
    order and threads may close a handle another one uses, so it is ordered here: an
    explicit close() while another thread is inside a call on the handle waits for that
    call to return, never frees memory under it."""

    __slots__ = ("ptr", "free", "parent", "root", "refs", "closed")

    def __init__(self, ptr: Any, free: Callable[[Any], None],
                 parent: Optional["_Native"] = None) -> None:
        self.ptr = ptr
        self.free = free
        self.parent = parent
        self.root: _Native = parent.root if parent is not None else self
        self.refs = 0
        self.closed = False
        if parent is not None:
            with _tree_lock:
                parent.refs += 1

    def pin(self, what: str) -> Any:
        """The pointer, kept from being freed until unpin()."""
        with _tree_lock:
            ptr = self.ptr
            if ptr is None or self.closed:
                raise StateError(lib.REDSEM_ESTATE, f"the {what} is closed")
            self.refs += 1
            return ptr

    def unpin(self) -> None:
        with _tree_lock:
            self.refs -= 1
            todo = _collect(self)
        if todo or _deferred:
            _finish(todo)

    def close(self) -> None:
        """Mark closed; free it now if nothing holds it. Idempotent."""
        with _tree_lock:
            self.closed = True
            todo = _collect(self)
        if todo or _deferred:
            _finish(todo)

    def call(self, what: str, fn: Callable[..., int], *args: Any,
             holder_id: Optional[str] = None) -> None:
        """fn(ptr, *args) with the handle pinned; a failure raises the mapped exception
        with the client's message for this thread (read before anything else runs)."""
        if _cb_state.active:
            raise StateError(lib.REDSEM_ESTATE, "a lost-lease callback must not call the library")
        ptr = self.pin(what)
        try:
            rc = fn(ptr, *args)
            if rc == 0:
                return
            root = self.root.ptr
            err = error_for(rc, _str(lib.redsem_client_errmsg(root)) if root else "")
        finally:
            self.unpin()
        if holder_id is not None and isinstance(err, Unknown):
            err.holder_id = holder_id
        raise err

    def read(self, fn: Callable[[Any], Any], dflt: Any) -> Any:
        """An accessor (no I/O) on the pinned handle; dflt once it is closed."""
        with _tree_lock:
            ptr = self.ptr
            if ptr is None:
                return dflt
            self.refs += 1
        try:
            return fn(ptr)
        finally:
            self.unpin()


def _collect(node: _Native) -> List[Tuple[_Native, Any]]:
    """Under the lock: take the node's pointer if it is to be freed now."""
    if node.closed and node.refs == 0 and node.ptr is not None:
        ptr, node.ptr = node.ptr, None
        return [(node, ptr)]
    return []


def _finish(todo: List[Tuple[_Native, Any]]) -> None:
    """Free (outside the lock); a parent's count drops only once its child is freed."""
    if _in_callback():
        # never free from a lost-lease callback, nor from an event-loop completion (a
        # garbage collection may run there; the C library forbids both): later
        with _tree_lock:
            _deferred.extend(todo)
        return
    if _deferred:
        with _tree_lock:
            todo = _deferred + todo
            del _deferred[:]
    i = 0
    while i < len(todo):  # in order: a parent joins the list after its child's free
        node, ptr = todo[i]
        i += 1
        node.free(ptr)
        parent, node.parent = node.parent, None
        if parent is not None:
            with _tree_lock:
                parent.refs -= 1
                if parent.closed and parent.refs == 0:
                    todo.extend(_collect(parent))
