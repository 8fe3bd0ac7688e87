"""The asyncio client: the same API as coroutines, requests from many
tasks pipelined, errors raised in the awaiting task."""

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import sluice


def run(coro):
    return asyncio.run(coro)


# Every test of the API runs with the client's work on the I/O threads
# and on the event loop's thread.
IO = pytest.mark.parametrize("io", ["threads", "loop"])


@IO
def test_async_put_get_and_errors(node, io):
    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io=io) as c:
            k = f"/vol/aio/{uuid.uuid4().hex}"
            r = await c.put(k, b"v")
            o = await c.get(k)
            assert o.value == b"v" and o.version == r.version
            with pytest.raises(sluice.NotFound):
                await c.get(k + "-missing")
            # 200 puts from 16 tasks at once.
            async def writer(i):
                for j in range(200 // 16 + 1):
                    await c.put(f"{k}/{i}/{j}", b"x" * 100)

            await asyncio.gather(*(writer(i) for i in range(16)))
            keys = await c.list_keys("/vol", prefix=k + "/")
            assert len(keys) == 16 * (200 // 16 + 1)

    run(main())


@IO
def test_a_client_used_from_another_event_loop_says_which_loop_it_belongs_to(node, io):
    # asyncio said only "Event loop is closed" (the loop of an earlier
    # asyncio.run) or "... attached to a different loop".
    first = asyncio.new_event_loop()
    c = first.run_until_complete(sluice.AsyncClient.connect(node.addr, io=io))
    second = asyncio.new_event_loop()
    try:
        for method in (lambda: c.get("/vol/x"), lambda: c.put("/vol/x", b"v"), lambda: c.list_keys("/vol")):
            with pytest.raises(RuntimeError, match="belongs to the event loop it was connected on, not to this one"):
                second.run_until_complete(method())
        first.run_until_complete(c.put(f"/vol/aio/{uuid.uuid4().hex}", b"v"))  # its own loop: fine
        c.close()
        first.close()
        c2 = asyncio.run(sluice.AsyncClient.connect(node.addr, io=io))
        with pytest.raises(RuntimeError, match="connected on, which is closed"):
            second.run_until_complete(c2.get("/vol/x"))
        c2.close()
    finally:
        second.close()


@IO
def test_closing_a_client_ends_its_calls_in_flight(node, io):
    # Nothing turns a closed client's runtime or completes its futures:
    # its calls in flight (and its watches') end at once with an error.
    async def main():
        c = await sluice.AsyncClient.connect(node.addr, io=io)
        prefix = f"/vol/aioc/{uuid.uuid4().hex}"
        w = await c.watch(prefix + "-quiet")  # no put below reaches it
        waiting = asyncio.create_task(w.next(timeout=30))
        puts = [asyncio.create_task(c.put(f"{prefix}/{i}", b"x" * 100)) for i in range(64)]
        await asyncio.sleep(0)  # every call started
        c.close()
        results = await asyncio.wait_for(asyncio.gather(*puts, waiting, return_exceptions=True), 5)
        failed = [r for r in results if isinstance(r, Exception)]
        assert all(isinstance(r, sluice.ConnectionError) and "closed" in str(r) for r in failed), failed
        assert all(isinstance(r, sluice.PutResult) for r in results[:-1] if r not in failed)
        assert isinstance(results[-1], sluice.ConnectionError)
        with pytest.raises(sluice.ConnectionError, match="the client is closed"):
            await c.put(prefix + "/late", b"x")
        await w.close()  # a watch of a closed client closes quietly
        c.close()

    run(main())


@IO
def test_async_watch(node, io):
    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io=io) as c:
            prefix = f"/vol/aiow/{uuid.uuid4().hex}"
            w = await c.watch(prefix)
            await c.put(prefix + "/a", b"1")
            async for n in w:
                assert n.key == prefix + "/a" and n.kind == "put"
                break
            assert await w.next(timeout=0.05) is None
            await w.close()

    run(main())


@IO
def test_a_watch_next_cancelled_or_timed_out_loses_no_notification(node, io):
    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io=io) as c:
            prefix = f"/vol/aiowc/{uuid.uuid4().hex}"
            w = await c.watch(prefix)
            # asyncio.wait_for cancels the next() it gives up on.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(w.next(), 0.05)
            t = asyncio.ensure_future(w.next())
            await asyncio.sleep(0)  # let it start waiting
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            assert await w.next(timeout=0.05) is None
            for i in range(3):
                await c.put(f"{prefix}/{i}", b"v")
            got = [(await asyncio.wait_for(w.next(), 5)).key for _ in range(3)]
            assert got == [f"{prefix}/{i}" for i in range(3)]
            # One task at a time; close() ends the one waiting.
            t = asyncio.ensure_future(w.next())
            await asyncio.sleep(0)
            with pytest.raises(RuntimeError, match="another task"):
                await w.next()
            await asyncio.wait_for(w.close(), 5)
            assert await asyncio.wait_for(t, 5) is None
            assert await w.next() is None

    run(main())


@IO
def test_closing_a_watch_with_a_cancelled_next_pending_returns_at_once(node, io):
    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io=io) as c:
            w = await c.watch(f"/vol/aiowq/{uuid.uuid4().hex}")  # nothing comes
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(w.next(), 0.05)
            # It waited for the lock the pending next() held, forever.
            await asyncio.wait_for(w.close(), 5)
            assert await asyncio.wait_for(w.next(), 5) is None

    run(main())


@IO
def test_cancelled_await_does_not_break_the_client(node, io):
    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io=io) as c:
            t = asyncio.ensure_future(c.get("/vol/x-" + uuid.uuid4().hex))
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            assert (await c.put("/vol/after-cancel", b"ok")).version > 0

    run(main())


@IO
def test_a_call_cancelled_in_flight_completes_nothing_and_reports_nothing(node, io, monkeypatch):
    # The task is cancelled while its call is on the wire: the call's
    # result, when it comes, finds its future cancelled and is dropped
    # quietly (an error completing any other future would be reported
    # through sys.unraisablehook).
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io=io) as c:
            k = "/vol/cancel-in-flight/" + uuid.uuid4().hex
            tasks = [asyncio.ensure_future(c.put(f"{k}/{i}", b"v" * 4096)) for i in range(8)]
            await asyncio.sleep(0)  # every task has started its call
            for t in tasks[::2]:
                t.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in done[::2]), done
            assert all(r.version > 0 for r in done[1::2]), done
            # The cancelled puts were sent all the same; their results arrive
            # and are dropped, and later calls are answered. (With io
            # "threads" a get issued now may reach the node before a
            # cancelled put that was handed over first: wait for each.)
            deadline = time.monotonic() + 10
            for i in range(0, 8, 2):
                while True:
                    try:
                        await c.get_size(f"{k}/{i}")
                        break
                    except sluice.NotFound:
                        assert time.monotonic() < deadline, f"the cancelled put {i} never landed"
                        await asyncio.sleep(0.01)
            assert (await c.put(f"{k}/after", b"ok")).version > 0

    run(main())
    assert reported == []


def test_a_future_that_refuses_its_result_is_reported_and_the_others_complete(node, monkeypatch):
    # What completes the futures (in the extension) sets each one's result;
    # a future that refuses it without being cancelled is reported through
    # sys.unraisablehook, a cancelled one is left quietly, and neither
    # keeps the other calls' futures from completing.
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    class Refusing:
        def __init__(self, cancelled):
            self._cancelled = cancelled

        def set_result(self, value):
            raise RuntimeError("this future refuses results")

        set_exception = set_result

        def cancelled(self):
            return self._cancelled

    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io="loop") as c:
            k = "/vol/refusing/" + uuid.uuid4().hex
            refusing, cancelled = Refusing(False), Refusing(True)
            ok = asyncio.get_running_loop().create_future()
            # The extension's own put, as AsyncClient.put calls it; the
            # runtime is turned here, without yielding to the loop.
            for i, fut in enumerate((refusing, cancelled, ok)):
                c._c.put(f"{k}/{i}", b"v", None, fut)
            deadline = time.monotonic() + 10
            running = 3
            while running:
                assert time.monotonic() < deadline, "the puts did not finish"
                running, _ = c._c._turn()
            assert (await ok).version > 0

    run(main())
    assert len(reported) == 1, reported
    assert reported[0].object.__class__.__name__ == "Refusing"
    assert reported[0].object._cancelled is False
    assert "refuses results" in str(reported[0].exc_value)


@IO
def test_a_bytes_value_is_sent_from_its_own_buffer(node, io):
    import sys

    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io=io) as c:
            k = f"/vol/aio-share/{uuid.uuid4().hex}"
            big = bytes(range(256)) * 4096  # 1 MB
            before = sys.getrefcount(big)
            fut = asyncio.get_running_loop().create_future()
            c._started(c._c.put(k, big, future=fut))
            # In flight, the client holds the object itself, not a copy.
            assert sys.getrefcount(big) == before + 1
            await fut
            # Done: the reference is given back (on the next call into
            # the extension, here the completion's).
            assert sys.getrefcount(big) == before
            assert (await c.get(k)).value == big
            # A bytearray can change under the caller's feet: copied.
            arr = bytearray(big)
            before = sys.getrefcount(arr)
            fut = asyncio.get_running_loop().create_future()
            c._started(c._c.put(k, arr, future=fut))
            assert sys.getrefcount(arr) == before
            arr[0] ^= 1
            await fut
            assert (await c.get(k)).value == big

    run(main())


def test_async_calls_stay_on_the_loops_thread(node):
    # A client with io="loop" runs its calls on a runtime that
    # the loop's own thread turns: no runtime thread is started for them
    # (the shared runtime's threads are named sluice-io), and the loop's
    # thread does not sleep on any thread but its own selector. In a fresh
    # interpreter, so that no other test started the shared runtime.
    script = f"""
import asyncio, os, sluice
async def main():
    async with await sluice.AsyncClient.connect({node.addr!r}, io="loop") as c:
        assert c._driven
        async def writer(i):
            for j in range(40):
                await c.put(f"/vol/aio-thread/{{i}}/{{j}}", b"x" * 1000)
                assert (await c.get(f"/vol/aio-thread/{{i}}/{{j}}")).value == b"x" * 1000
        await asyncio.gather(*(writer(i) for i in range(8)))
        w = await c.watch("/vol/aio-thread")
        await c.put("/vol/aio-thread/w", b"1")
        assert (await w.next(timeout=5)).key == "/vol/aio-thread/w"
        await w.close()
asyncio.run(main())
names = []
for t in os.listdir("/proc/self/task"):
    try:
        names.append(open(f"/proc/self/task/{{t}}/comm").read().strip())
    except FileNotFoundError:
        pass  # a thread that ended meanwhile (asyncio.run's executor)
print(names)
assert "sluice-io" not in names, names
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def _runtime_wakeups(epfd):
    """How many times the runtime behind epoll descriptor `epfd` was
    signalled: the count of the eventfd registered in it (tokio's waker,
    which counts up on every signal and is never read back)."""
    targets = [
        int(line.split()[1])
        for line in open(f"/proc/self/fdinfo/{epfd}")
        if line.startswith("tfd:")
    ]
    counts = []
    for fd in targets:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:[eventfd]":
                continue
        except FileNotFoundError:
            continue
        for line in open(f"/proc/self/fdinfo/{fd}"):
            if line.startswith("eventfd-count:"):
                counts.append(int(line.split()[1], 16))
    assert len(counts) == 1, counts
    return counts[0]


@pytest.mark.parametrize("timeout", [10.0, 0.1])
def test_driven_calls_do_not_signal_their_runtime(node, timeout):
    # Each call arms a timer for its timeout. With no timer in the wheel
    # when the runtime last parked, tokio signals the runtime's eventfd for
    # every timer armed (a system call per call, and a wake-up of the
    # loop's selector); the client keeps a timer due sooner than any
    # call's deadline (a short timeout included), so a call's timer
    # signals nothing.
    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io="loop", timeout=timeout) as c:
            epfd, driven = c._c._completion_fd()
            assert driven
            await c.put("/vol/aio-wake/warm", b"v")
            before = _runtime_wakeups(epfd)
            for round in range(20):
                rs = await asyncio.gather(
                    *(c.put(f"/vol/aio-wake/{round}/{i}", b"v") for i in range(8))
                )
                assert all(r.version > 0 for r in rs)
            # 160 calls; the anchor's own timer may be re-armed now and then.
            assert _runtime_wakeups(epfd) - before < 20

    run(main())


def test_an_async_client_on_threads_runs_on_the_shared_runtime(node):
    async def main():
        with pytest.raises(ValueError, match="io must be"):
            await sluice.AsyncClient.connect(node.addr, io="fibers")
        c = await sluice.AsyncClient.connect(node.addr, io="threads")
        try:
            assert not c._driven
            k = f"/vol/aio-shared/{uuid.uuid4().hex}"
            rs = await asyncio.gather(*(c.put(f"{k}/{i}", b"v") for i in range(32)))
            assert all(r.version > 0 for r in rs)
            assert (await c.get(f"{k}/7")).value == b"v"
        finally:
            c.close()

    run(main())


def test_a_driven_call_times_out_while_no_socket_is_ready():
    # The node stops answering (SIGSTOP): no socket of the client becomes
    # ready, yet the request's timeout fires (the loop turns the client's
    # runtime on a short tick while calls run), and once the node goes on
    # the client works again.
    from conftest import Node

    d = Path(tempfile.mkdtemp(prefix="sluice-py-stop-"))
    n = Node(d / "data")
    try:

        async def main():
            async with await sluice.AsyncClient.connect(n.addr, io="loop", timeout=0.3) as c:
                await c.put("/vol/stop/a", b"1")
                os.kill(n.proc.pid, signal.SIGSTOP)
                try:
                    # Stopping is asynchronous: wait until every thread is.
                    deadline = time.monotonic() + 10
                    while not all(
                        open(f"/proc/{n.proc.pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0] == "T"
                        for t in os.listdir(f"/proc/{n.proc.pid}/task")
                    ):
                        assert time.monotonic() < deadline, "the node did not stop"
                        time.sleep(0.001)
                    t0 = time.monotonic()
                    with pytest.raises(sluice.Timeout):
                        await asyncio.wait_for(c.put("/vol/stop/b", b"2"), 10)
                    waited = time.monotonic() - t0
                    assert 0.25 <= waited < 2.0, waited
                finally:
                    os.kill(n.proc.pid, signal.SIGCONT)
                assert (await c.put("/vol/stop/c", b"3")).version > 0

        run(main())
    finally:
        n.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_the_default_io_follows_the_cores_this_process_may_use(node, monkeypatch):
    async def driven():
        async with await sluice.AsyncClient.connect(node.addr) as c:
            await c.put("/vol/aio-auto", b"1")
            return c._driven

    for cores, io in ((1, "loop"), (2, "loop"), (3, "threads"), (16, "threads")):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert sluice.default_io() == io
        assert run(driven()) == (io == "loop")


@IO
def test_a_large_value_in_flight_does_not_hold_the_event_loop(node, io):
    # While 16 MB arrive, the loop's other tasks keep running: with
    # io="loop" a turn stops once the sockets have nothing, and after at
    # most a bounded number of looks at them when data keeps coming.
    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io=io) as c:
            k = f"/vol/aio-big/{uuid.uuid4().hex}"
            big = os.urandom(16 << 20)
            await c.put(k, big)
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0)
                    ticks += 1

            t = asyncio.ensure_future(ticker())
            await asyncio.sleep(0)
            try:
                before = ticks
                assert (await c.get(k)).value == big
                assert ticks - before >= 2, ticks - before
            finally:
                t.cancel()

    run(main())


def test_the_async_client_has_the_blocking_clients_methods_and_arguments():
    # AsyncClient passed some calls to the extension as they came, with
    # none of Client's checks and conversions: get_size(timestamp=...)
    # was a TypeError, get_size(version=-1) an OverflowError,
    # history(end=None) a TypeError, list_keys took no version or time,
    # and policy was missing. Every method of Client is a coroutine of the
    # same signature on AsyncClient (watch has no callback: iterate it).
    import inspect

    sync_only = {"close", "node_id", "cluster_epoch"}
    for name, f in inspect.getmembers(sluice.Client, inspect.isfunction):
        if name.startswith("_") or name in sync_only:
            continue
        af = getattr(sluice.AsyncClient, name, None)
        assert af is not None, f"AsyncClient has no {name}"
        assert inspect.iscoroutinefunction(af), name
        want = inspect.signature(f)
        if name == "watch":
            want = want.replace(
                parameters=[p for p in want.parameters.values() if p.name != "callback"]
            )
        got = inspect.signature(af)
        assert [(p.name, p.kind, p.default) for p in got.parameters.values()] == [
            (p.name, p.kind, p.default) for p in want.parameters.values()
        ], name
        assert af.__doc__, f"AsyncClient.{name} has no docstring"


@IO
def test_async_reads_by_time_and_version_check_their_arguments(node, io):
    async def main():
        async with await sluice.AsyncClient.connect(node.addr, io=io) as c:
            pool = f"/apers-{uuid.uuid4().hex[:8]}"
            await c.create_object_pool(pool, "persistent")
            k = f"{pool}/k"
            r1 = await c.put(k, b"old")
            r2 = await c.put(k, b"newer")
            t = (r1.timestamp_us + r2.timestamp_us) // 2
            assert await c.get_size(k, timestamp=t / 1e6) == 3
            assert await c.get_size(k, timestamp_us=t) == 3
            assert await c.get_size(k, version=r2.version) == 5
            h = await c.history(k, end=None)
            assert [o.value.tobytes() for o in h] == [b"newer", b"old"]
            assert await c.list_keys_in_object_pool(pool, timestamp=t / 1e6) == [k]
            assert await c.list_keys(pool, version=r1.version - 1) == []
            with pytest.raises(ValueError, match="versions start at 1"):
                await c.get_size(k, version=-1)
            with pytest.raises(ValueError, match="not both"):
                await c.get_size(k, timestamp=1.0, timestamp_us=1)
            with pytest.raises(ValueError, match="timestamp=-1.0 is before the epoch"):
                await c.list_keys(pool, timestamp=-1.0)
            me = await c.policy("whoami")
            assert me == c._blocking.policy("whoami"), me

    run(main())
