"""The asyncio client: the same API as coroutines, requests from many
tasks pipelined, errors raised in the awaiting task."""

import asyncio
import uuid

import pytest

import sluice


def run(coro):
    return asyncio.run(coro)


def test_async_put_get_and_errors(node):
    async def main():
        async with await sluice.AsyncClient.connect(node.addr) as c:
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


def test_async_watch(node):
    async def main():
        async with await sluice.AsyncClient.connect(node.addr) as c:
            prefix = f"/vol/aiow/{uuid.uuid4().hex}"
            w = await c.watch(prefix)
            await c.put(prefix + "/a", b"1")
            async for n in w:
                assert n.key == prefix + "/a" and n.kind == "put"
                break
            assert await w.next(timeout=0.05) is None
            await w.close()

    run(main())


def test_cancelled_await_does_not_break_the_client(node):
    async def main():
        async with await sluice.AsyncClient.connect(node.addr) as c:
            t = asyncio.ensure_future(c.get("/vol/x-" + uuid.uuid4().hex))
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            assert (await c.put("/vol/after-cancel", b"ok")).version > 0

    run(main())


def test_a_bytes_value_is_sent_from_its_own_buffer(node):
    import sys

    async def main():
        async with await sluice.AsyncClient.connect(node.addr) as c:
            k = f"/vol/aio-share/{uuid.uuid4().hex}"
            big = bytes(range(256)) * 4096  # 1 MB
            before = sys.getrefcount(big)
            fut = asyncio.get_running_loop().create_future()
            c._c.put(k, big, future=fut)
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
            c._c.put(k, arr, future=fut)
            assert sys.getrefcount(arr) == before
            arr[0] ^= 1
            await fut
            assert (await c.get(k)).value == big

    run(main())
