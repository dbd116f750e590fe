"""asyncio: acquire_async driven by the library's event-loop API from the asyncio loop,
`async with`, timeouts, and cancellation that never leaves a permit held."""

import asyncio
import random
import time

import pytest

import redsem

STRATEGIES = ["basic", "fair", "locked"]


async def _until(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_acquire_async(client, name, strategy):
    sem = client.semaphore(name, limit=2, strategy=strategy)

    async def main():
        p = await sem.acquire_async(timeout=5.0)
        assert p.held and p.weight == 1
        async with sem.acquire_async(timeout=5.0) as q:
            assert q.held and q.token > p.token
            assert sem.status().holder_count == 2
            with pytest.raises(redsem.Busy):
                await sem.acquire_async(timeout=0.1)
        assert not q.held
        await p.refresh_async()
        await p.release_async()
        assert not p.held
        w = await sem.acquire_async(timeout=0, permits=2)
        assert w.weight == 2
        await w.release_async()
        assert sem.status().holder_count == 0

    asyncio.run(main())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_waiters_are_woken(client, name, strategy):
    sem = client.semaphore(name, limit=1, strategy=strategy)

    async def main():
        held = await sem.acquire_async(timeout=1.0)
        tasks = [asyncio.ensure_future(sem.acquire_async(timeout=60.0)) for _ in range(3)]
        await asyncio.sleep(0.2)
        assert not any(t.done() for t in tasks)
        await held.release_async()
        for _ in range(3):
            done, _pending = await asyncio.wait(
                [t for t in tasks if not getattr(t, "_seen", False)],
                return_when=asyncio.FIRST_COMPLETED, timeout=60)
            for t in done:
                t._seen = True
                await t.result().release_async()
        assert all(t.done() for t in tasks)

    asyncio.run(main())


def test_lock_async(client, name):
    lk = client.lock(name, lease=10.0)

    async def main():
        async with lk.acquire_async(timeout=1.0) as p:
            assert lk.status().holders[0].id == p.id
            with pytest.raises(redsem.Busy):
                await client.lock(name).acquire_async(timeout=0)
        assert lk.status().holder_count == 0

    asyncio.run(main())


@pytest.mark.parametrize("strategy", STRATEGIES + ["lock"])
def test_cancel_waiting_acquire(client, name, strategy):
    if strategy == "lock":
        h = client.lock(name)
        status = h.status
    else:
        h = client.semaphore(name, limit=1, strategy=strategy)
        status = h.status
    blocker = h.acquire(timeout=1.0)

    async def main():
        task = asyncio.ensure_future(h.acquire_async(timeout=60.0))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        blocker.release()
        # the cancelled acquire left the queue and took nothing
        await asyncio.sleep(0.3)
        assert status().holder_count == 0
        p = await h.acquire_async(timeout=1.0)
        await p.release_async()

    asyncio.run(main())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cancel_races_never_leave_a_permit(client, name, strategy):
    """Tasks cancelled at random moments while permits come and go: afterwards no permit is
    held (a permit granted to a cancelled acquire is released)."""
    # leases far longer than the wait below: a permit left held would still be held
    sem = client.semaphore(name, limit=2, strategy=strategy, lease=300.0)
    rnd = random.Random(27)

    async def holder():
        for _ in range(20):
            async with sem.acquire_async(timeout=60.0):
                await asyncio.sleep(rnd.uniform(0, 0.01))

    async def main():
        workers = [asyncio.ensure_future(holder()) for _ in range(2)]
        for _ in range(40):
            t = asyncio.ensure_future(sem.acquire_async(timeout=60.0))
            await asyncio.sleep(rnd.uniform(0, 0.02))
            t.cancel()
            try:
                p = await t
                await p.release_async()
            except asyncio.CancelledError:
                pass
        await asyncio.gather(*workers)
        await _until(lambda: sem.status().holder_count == 0, timeout=20.0)

    asyncio.run(main())


def test_async_bad_input(client, name):
    sem = client.semaphore(name, limit=1)
    with pytest.raises(TypeError):
        sem.acquire_async(timeout="1")
    with pytest.raises(ValueError):
        sem.acquire_async(timeout=-1)

    async def main():
        with pytest.raises(redsem.InvalidArgument):
            await sem.acquire_async(timeout=0, permits=5)

    asyncio.run(main())


def test_async_threads_and_blocking_mix(client, name):
    """The blocking API on threads and asyncio on the loop share one client."""
    sem = client.semaphore(name, limit=1, strategy="fair")

    async def main():
        loop = asyncio.get_running_loop()
        p = await loop.run_in_executor(None, lambda: sem.acquire(timeout=5.0))
        t = asyncio.ensure_future(sem.acquire_async(timeout=30.0))
        await asyncio.sleep(0.1)
        await loop.run_in_executor(None, p.release)
        q = await asyncio.wait_for(t, 30)
        await q.release_async()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["fair", "lock"])
def test_async_unknown_carries_the_holder_id(server, name, kind):
    c = redsem.Client(server.url, command_timeout=0.2, retry=0)
    h = c.lock(name) if kind == "lock" else c.semaphore(name, limit=1, strategy=kind)
    h.acquire(0).release()

    async def main():
        # the loop's connection made first: the stall is the acquire's round trip's, not
        # its connect's (an engine on the loop connects at its first operation)
        await (await h.acquire_async(timeout=0)).release_async()
        loop = asyncio.get_running_loop()
        stall = loop.run_in_executor(None, server.command, b"DEBUG", b"SLEEP", b"1")
        await asyncio.sleep(0.2)
        with pytest.raises(redsem.Unknown) as ei:
            await h.acquire_async(timeout=0)
        await stall
        return ei.value.holder_id

    hid = asyncio.run(main())
    assert hid is not None and len(hid) == 40
    p = h.acquire(timeout=1.0, token=hid) if kind == "lock" else h.acquire(1.0, holder_id=hid)
    assert p.id == hid
    p.release()
    c.close()


def test_cancel_with_unknown_outcome_is_settled(server, name):
    """A task cancelled while its acquire's round trip is stalled: the outcome is unknown,
    so the binding acquires again with the same id afterwards and releases what it gets."""
    from redsem import _aio
    c = redsem.Client(server.url, command_timeout=0.3, retry=0)
    sem = c.semaphore(name, limit=1, strategy="fair", lease=300.0)
    sem.acquire(0).release()
    before = _aio.settled

    async def main():
        loop = asyncio.get_running_loop()
        stall = loop.run_in_executor(None, server.command, b"DEBUG", b"SLEEP", b"1")
        await asyncio.sleep(0.2)
        task = asyncio.ensure_future(sem.acquire_async(timeout=30.0))
        await asyncio.sleep(0.1)
        task.cancel()
        try:
            p = await task
            await p.release_async()
        except (asyncio.CancelledError, redsem.Error):
            pass
        await stall
        await _until(lambda: sem.status().holder_count == 0, timeout=20.0)

    asyncio.run(main())
    deadline = time.monotonic() + 20
    while _aio.settled == before and time.monotonic() < deadline:
        time.sleep(0.05)
    print("settled", _aio.settled - before)
    assert sem.status().holder_count == 0
    c.close()
