"""The blocking API against a private redis-server: every strategy, weights, the lock, the
rate limiter, status, renewal, errors."""

import math
import os
import threading
import time

import pytest

import redsem

STRATEGIES = ["basic", "fair", "locked"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_limit_is_kept(client, name, strategy):
    sem = client.semaphore(name, limit=2, lease=30.0, strategy=strategy)
    assert (sem.name, sem.strategy, sem.limit, sem.lease) == (name, strategy, 2, 30.0)
    a = sem.acquire(timeout=1.0)
    b = sem.acquire(timeout=1.0)
    assert a.held and b.held and a.token < b.token
    assert a.id != b.id and len(a.id) == 40 and a.weight == 1
    assert 0 < a.validity <= 30.0
    assert sem.try_acquire() is None
    with pytest.raises(redsem.Busy):
        sem.acquire(timeout=0.05)
    st = sem.status()
    assert st.exists and st.strategy == strategy and st.limit == 2
    assert st.holder_count == 2 and st.permits_in_use == 2
    assert {h.id for h in st.holders} == {a.id, b.id}
    a.release()
    assert not a.held and a.validity == 0.0
    with pytest.raises(redsem.StateError):
        a.release()
    with sem.acquire(timeout=1.0) as c:
        assert c.token > b.token
        assert sem.status().holder_count == 2
    assert not c.held
    b.release()
    assert sem.status().holder_count == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_weights(client, name, strategy):
    sem = client.semaphore(name, limit=3, strategy=strategy)
    p = sem.acquire(timeout=1.0, permits=2)
    assert p.weight == 2
    assert sem.try_acquire(permits=2) is None
    q = sem.try_acquire(permits=1)
    assert q is not None
    assert sem.status().permits_in_use == 3
    with pytest.raises(redsem.InvalidArgument):
        sem.acquire(timeout=0, permits=4)  # above the limit on the server
    p.release()
    q.release()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_blocked_acquire_gets_released_permit(client, name, strategy):
    """A thread blocked in acquire() does not hold the GIL: the main thread runs (status,
    release) meanwhile, and the waiter then gets the permit."""
    sem = client.semaphore(name, limit=1, strategy=strategy)
    held = sem.acquire(timeout=1.0)
    got = []

    def waiter():
        try:
            got.append(sem.acquire(timeout=60.0))
        except redsem.Error as e:
            got.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 30
    if strategy != "basic":  # queued waiters are listed
        while sem.status().waiter_count == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        time.sleep(0.2)
    held.release()
    t.join(60)
    assert isinstance(got[0], redsem.Permit), got
    got[0].release()


def test_holder_id_retry_is_idempotent(client, name):
    sem = client.semaphore(name, limit=2)
    hid = redsem.generate_id()
    p = sem.acquire(timeout=1.0, holder_id=hid)
    q = sem.acquire(timeout=1.0, holder_id=hid)  # the same grant, not a second one
    assert p.id == q.id == hid and p.token == q.token
    assert sem.status().holder_count == 1
    r = sem.adopt(hid)
    assert r.token == p.token
    q.close()
    r.close()
    p.release()
    with pytest.raises(redsem.Lost):
        sem.adopt(hid)


def test_conflict(client, name):
    client.semaphore(name, limit=2, strategy="fair")
    with pytest.raises(redsem.Conflict):
        client.semaphore(name, limit=3, strategy="fair")
    with pytest.raises(redsem.Conflict):
        client.semaphore(name, limit=2, strategy="basic")


def test_set_limit_and_inspect(client, name):
    assert not client.inspect(name).exists
    sem = client.semaphore(name, limit=1)
    sem.set_limit(2)
    p = sem.acquire(0)
    q = sem.acquire(0)
    st = client.inspect(name)
    assert st.exists and st.limit == 2 and st.holder_count == 2
    p.release()
    q.release()


def test_lock(client, name):
    lk = client.lock(name, lease=10.0)
    other = client.lock(name, lease=10.0)
    with lk.acquire(timeout=1.0) as p:
        assert other.try_acquire() is None
        with pytest.raises(redsem.Busy):
            other.acquire(timeout=0.05)
        st = lk.status()
        assert st.strategy == "lock" and st.holder_count == 1 and st.holders[0].id == p.id
        assert other.adopt(p.id).token == p.token
    q = other.acquire(timeout=1.0)
    assert q.token > p.token
    q.release()


def test_lock_token_retry(client, name):
    lk = client.lock(name)
    tok = redsem.generate_id()
    p = lk.acquire(0, token=tok)
    q = lk.acquire(0, token=tok)
    assert p.token == q.token and p.id == tok
    q.close()
    p.release()


def test_reentrant_lock(client, name):
    lk = client.lock(name, reentrant=True)
    assert lk.reentrant
    a = lk.acquire(timeout=1.0)
    b = lk.acquire(timeout=1.0)
    assert a.token == b.token and lk.status().hold_count == 2
    assert client.lock(name).try_acquire() is None
    b.release()
    assert lk.status().holder_count == 1
    a.release()
    assert lk.status().holder_count == 0


def test_rate(client, name):
    rate = client.rate(name, limit=2, window=5.0)
    assert (rate.limit, rate.window) == (2, 5.0)
    g1 = rate.acquire(timeout=0)
    with rate.acquire(timeout=0) as g2:
        assert g2.token > g1.token and len(g2.id) == 40
        assert abs(g2.granted_at - time.time()) < 60
    assert rate.try_acquire() is None
    with pytest.raises(redsem.Busy) as ei:
        rate.acquire(timeout=0)
    assert 0 < ei.value.retry_after <= 5.1
    st = rate.status()
    assert st.exists and st.in_window == 2 and st.limit == 2 and st.window == 5.0
    assert client.inspect_rate(name).in_window == 2
    with pytest.raises(redsem.Conflict):
        client.rate(name, limit=3, window=5.0)


def test_rate_waits(client, name):
    rate = client.rate(name, limit=1, window=0.2)
    a = rate.acquire(timeout=0)
    b = rate.acquire(timeout=30.0)  # granted once a's slot lapses
    assert b.granted_at >= a.granted_at + 0.19


def test_refresh_and_lost(client, name):
    sem = client.semaphore(name, limit=1, lease=0.2)
    p = sem.acquire(0)
    p.refresh()
    time.sleep(0.5)
    assert not p.held
    with pytest.raises(redsem.Lost):
        p.refresh()


def test_auto_renew_keeps_it(client, name):
    sem = client.semaphore(name, limit=1, lease=0.3)
    p = sem.acquire(0)
    p.auto_renew()
    time.sleep(1.0)
    assert p.held and p.validity > 0
    assert client.stats()["renewals"] >= 2
    p.release()


def test_lost_callback(server, client, name):
    sem = client.semaphore(name, limit=1, lease=0.5)
    p = sem.acquire(0)
    fired = threading.Event()
    seen = []

    def on_lost(permit, reason):
        seen.append((permit, reason, threading.current_thread() is threading.main_thread()))
        try:  # the library must not be called from here: refused, no deadlock
            permit.release()
        except redsem.StateError as e:
            seen.append(e)
        fired.set()

    p.auto_renew(0.1, on_lost)
    assert server.command(b"FLUSHALL") == b"+OK"
    assert fired.wait(30)
    assert seen[0][0] is p and seen[0][1] in (redsem.LostReason.EXPIRED,
                                              redsem.LostReason.DEADLINE)
    assert seen[0][2] is False  # on the renewer thread
    assert isinstance(seen[1], redsem.StateError)
    assert not p.held
    with pytest.raises((redsem.Lost, redsem.StateError)):
        p.release()


def test_threads_share_one_client(client, name):
    limit, nthreads, rounds = 3, 8, 15
    sem = client.semaphore(name, limit=limit, strategy="fair")
    lock = threading.Lock()
    state = {"cur": 0, "max": 0}
    errors = []

    def worker():
        try:
            for _ in range(rounds):
                with sem.acquire(timeout=60.0):
                    with lock:
                        state["cur"] += 1
                        state["max"] = max(state["max"], state["cur"])
                    time.sleep(0.002)
                    with lock:
                        state["cur"] -= 1
        except BaseException as e:  # noqa: B902
            errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errors
    assert 1 <= state["max"] <= limit
    assert sem.status().holder_count == 0


def test_fork_child_gets_forked_error(client, name):
    sem = client.semaphore(name, limit=1)
    p = sem.acquire(0)
    pid = os.fork()
    if pid == 0:  # the child: every call refused, nothing sent
        code = 0
        for call in (lambda: sem.acquire(0), p.refresh, p.release, client.ping):
            try:
                call()
                code = 1
            except redsem.ForkedError:
                pass
            except BaseException:
                code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert p.held
    p.release()


def test_client_close(server, name):
    c = redsem.Client(server.url)
    sem = c.semaphore(name, limit=1)
    p = sem.acquire(0)
    c.close()
    with pytest.raises(redsem.StateError):
        c.semaphore(name + "-x", limit=1)
    p.release()  # the handles made before stay usable
    c.close()


def test_url_forms(server):
    with redsem.Client(server.tcp_url, connect_timeout=5.0, command_timeout=5.0, retry=0.5,
                       max_connections=2, key_prefix="pytest:") as c:
        c.ping()
    # unreachable servers of every form: refused at connect, not as malformed URLs
    for url in ("redis://127.0.0.1:1", "rediss://127.0.0.1:1",
                "redis+sentinel://127.0.0.1:1/mymaster", "redis+cluster://127.0.0.1:1",
                "rediss+cluster://127.0.0.1:1,127.0.0.1:2",
                "unix:///nonexistent/redsem.sock"):
        with pytest.raises((redsem.ConnectionError, redsem.TimeoutError)):
            redsem.Client(url, connect_timeout=1.0, retry=0)


def test_tls_file_missing(tmp_path):
    with pytest.raises(redsem.InvalidArgument):
        redsem.Client("rediss://127.0.0.1:1", tls_ca=tmp_path / "none.crt")


def test_exception_hierarchy():
    assert issubclass(redsem.Busy, redsem.Error)
    assert issubclass(redsem.InvalidArgument, ValueError)
    assert issubclass(redsem.ConnectionError, ConnectionError)
    assert issubclass(redsem.TimeoutError, TimeoutError)
    for cls in (redsem.Lost, redsem.Unknown, redsem.Conflict, redsem.TLSError,
                redsem.ForkedError, redsem.StateError, redsem.ServerError):
        assert issubclass(cls, redsem.Error)
    e = redsem.Busy(-1)
    assert e.code == -1 and e.name == "REDSEM_EBUSY"


@pytest.mark.parametrize("call,exc", [
    (lambda c, n: c.semaphore(1, limit=1), TypeError),
    (lambda c, n: c.semaphore(n, limit="3"), TypeError),
    (lambda c, n: c.semaphore(n, limit=True), TypeError),
    (lambda c, n: c.semaphore(n, limit=1, lease=None), TypeError),
    (lambda c, n: c.semaphore(n, limit=1, strategy=2), TypeError),
    (lambda c, n: c.semaphore(n, limit=1, strategy="sloppy"), ValueError),
    (lambda c, n: c.semaphore(n, limit=0), redsem.InvalidArgument),
    (lambda c, n: c.semaphore(n, limit=-1), ValueError),
    (lambda c, n: c.semaphore(n, limit=2**40), ValueError),
    (lambda c, n: c.semaphore(n, limit=1, lease=-1), ValueError),
    (lambda c, n: c.semaphore(n, limit=1, lease=math.nan), ValueError),
    (lambda c, n: c.semaphore(n, limit=1, lease=math.inf), ValueError),
    (lambda c, n: c.semaphore(n, limit=1, lease=0.001), redsem.InvalidArgument),
    (lambda c, n: c.semaphore(n, limit=1, lease=1e300), ValueError),
    (lambda c, n: c.semaphore("", limit=1), redsem.InvalidArgument),
    (lambda c, n: c.semaphore("a\0b", limit=1), ValueError),
    (lambda c, n: c.semaphore("a{b}", limit=1), redsem.InvalidArgument),
    (lambda c, n: c.semaphore("x" * 513, limit=1), redsem.InvalidArgument),
    (lambda c, n: c.semaphore("naïve", limit=1), redsem.InvalidArgument),
    (lambda c, n: c.semaphore(n, limit=1).acquire(timeout="1"), TypeError),
    (lambda c, n: c.semaphore(n, limit=1).acquire(timeout=-0.5), ValueError),
    (lambda c, n: c.semaphore(n, limit=1).acquire(0, permits=0), redsem.InvalidArgument),
    (lambda c, n: c.semaphore(n, limit=1).acquire(0, holder_id="xyz"),
     redsem.InvalidArgument),
    (lambda c, n: c.semaphore(n, limit=1).acquire(0, holder_id=b"0" * 40), TypeError),
    (lambda c, n: c.semaphore(n, limit=1).adopt("0" * 39), redsem.InvalidArgument),
    (lambda c, n: c.semaphore(n, limit=1).status(max_entries=-1), ValueError),
    (lambda c, n: c.semaphore(n, limit=1).acquire(0).auto_renew(interval=1e6),
     redsem.InvalidArgument),
    (lambda c, n: c.semaphore(n, limit=1).acquire(0).auto_renew(on_lost=3), TypeError),
    (lambda c, n: c.lock(n, reentrant=1), TypeError),
    (lambda c, n: c.lock(n, reentrant=True).acquire(0, token="0" * 40),
     redsem.InvalidArgument),
    (lambda c, n: c.rate(n, limit=0, window=1.0), redsem.InvalidArgument),
    (lambda c, n: c.rate(n, limit=1, window=0), redsem.InvalidArgument),
    (lambda c, n: c.rate(n, limit=1, window="1m"), TypeError),
    (lambda c, n: redsem.Client("http://x"), redsem.InvalidArgument),
    (lambda c, n: redsem.Client("redis://h:99999"), redsem.InvalidArgument),
    (lambda c, n: redsem.Client(b"redis://x"), TypeError),
    (lambda c, n: redsem.Client(command_timeout=0), redsem.InvalidArgument),
    (lambda c, n: redsem.Client(max_connections=0), redsem.InvalidArgument),
    (lambda c, n: redsem.Client(key_prefix="{x}"), redsem.InvalidArgument),
])
def test_bad_input(client, name, call, exc):
    with pytest.raises(exc):
        call(client, name)


def test_doc_examples_parse():
    """Every ```python block of README.md and docs/python.md is valid Python."""
    import ast
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    n = 0
    for doc in ("README.md", os.path.join("docs", "python.md")):
        with open(os.path.join(root, doc)) as f:
            text = f.read()
        for block in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M):
            ast.parse(block)
            n += 1
    assert n >= 3


def test_versions_agree():
    """The stand-alone project (meson-python) and pyproject.toml carry the main version."""
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")

    def version(path, pattern):
        with open(os.path.join(root, path)) as f:
            return re.search(pattern, f.read()).group(1)

    main = version("meson.build", r"version:\s*'([^']+)'")
    assert redsem.__version__ == main
    assert version(os.path.join("python", "meson.build"), r"version:\s*'([^']+)'") == main
    assert version(os.path.join("python", "pyproject.toml"), r'version\s*=\s*"([^"]+)"') == main


def test_callback_may_not_call_other_handles(server, client, name):
    sem = client.semaphore(name, limit=2, lease=0.5)
    p = sem.acquire(0)
    seen = []
    fired = threading.Event()

    def on_lost(permit, reason):
        for call in (lambda: sem.acquire(0), client.ping, client.stats):
            try:
                call()
                seen.append("called")
            except redsem.StateError:
                seen.append("refused")
        fired.set()

    p.auto_renew(0.1, on_lost)
    assert server.command(b"FLUSHALL") == b"+OK"
    assert fired.wait(30)
    assert seen == ["refused"] * 3
    p.close()


def test_close_while_another_thread_waits(client, name):
    """close() of a handle another thread is blocked on frees nothing under it: the waiter
    finishes normally, later calls raise StateError (no crash)."""
    sem = client.semaphore(name, limit=1, strategy="fair")
    held = sem.acquire(0)
    out = []

    def waiter():
        try:
            out.append(sem.acquire(timeout=1.0))
        except redsem.Error as e:
            out.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    sem.close()  # the waiter is inside the C call on this handle
    with pytest.raises(redsem.StateError):
        sem.acquire(0)
    with pytest.raises(redsem.StateError):
        sem.status()
    t.join(60)
    assert isinstance(out[0], redsem.Busy)
    held.release()  # the permit keeps its (closed) semaphore alive until it is freed


def test_release_and_refresh_race(client, name):
    """Two threads on one permit: the server decides, the loser gets an exception."""
    sem = client.semaphore(name, limit=50)
    for _ in range(20):
        p = sem.acquire(0)
        errs = []

        def refresher():
            for _ in range(5):
                try:
                    p.refresh()
                except (redsem.Lost, redsem.StateError) as e:
                    errs.append(e)

        t = threading.Thread(target=refresher)
        t.start()
        try:
            p.release()
        except (redsem.Lost, redsem.StateError):
            pass
        t.join(60)
        assert not p.held
    assert sem.status().holder_count == 0


@pytest.mark.parametrize("kind", ["fair", "lock"])
def test_unknown_carries_the_holder_id(server, name, kind):
    """A stalled server (DEBUG SLEEP) makes the acquire's reply late: redsem.Unknown with the
    identifier, and an acquire with it then finds out idempotently."""
    c = redsem.Client(server.url, command_timeout=0.2, retry=0)
    h = c.lock(name) if kind == "lock" else c.semaphore(name, limit=1, strategy=kind)
    h.acquire(0).release()  # scripts loaded, connection open
    t = threading.Thread(target=server.command, args=(b"DEBUG", b"SLEEP", b"1"))
    t.start()
    time.sleep(0.2)
    with pytest.raises(redsem.Unknown) as ei:
        h.acquire(timeout=0)
    t.join(30)
    hid = ei.value.holder_id
    assert hid is not None and len(hid) == 40
    if kind == "lock":
        p = h.acquire(timeout=1.0, token=hid)
    else:
        p = h.acquire(timeout=1.0, holder_id=hid)
    assert p.id == hid
    p.release()
    c.close()


@pytest.mark.parametrize("kind", STRATEGIES + ["lock"])
def test_signal_interrupts_a_wait_on_the_main_thread(client, name, kind):
    """An exception raised by a signal handler (KeyboardInterrupt on Ctrl-C) ends a blocking
    wait on the main thread at once; the acquire is cancelled and leaves nothing behind."""
    import signal

    assert threading.current_thread() is threading.main_thread()

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()

    h = client.lock(name) if kind == "lock" else client.semaphore(name, limit=1, strategy=kind,
                                                                  lease=300.0)
    held = h.acquire(0)
    old = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    t0 = time.monotonic()
    try:
        timer.start()
        with pytest.raises(Interrupted):
            h.acquire(timeout=20.0)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, old)
    assert time.monotonic() - t0 < 10
    held.release()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        st = h.status()
        if st.holder_count == 0 and st.waiter_count == 0:
            break
        time.sleep(0.05)
    assert (st.holder_count, st.waiter_count) == (0, 0)
    p = h.acquire(timeout=5.0)  # the main thread's wait path, granted
    p.release()
