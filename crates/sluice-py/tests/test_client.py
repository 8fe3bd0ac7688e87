"""The blocking client against a real node: the Cascade-named API, values
without copies, every error as its class, watch."""

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import inspect

import pytest

import sluice


def key(prefix="/vol/py"):
    return f"{prefix}/{uuid.uuid4().hex}"


def test_put_get_remove_and_versions(client):
    k = key()
    r1 = client.put(k, b"one")
    r2 = client.put(k, "two")
    assert r2.version > r1.version and r2.timestamp_us >= r1.timestamp_us
    version, ts = r2  # unpacks as Cascade's (version, timestamp)
    assert (version, ts) == (r2.version, r2.timestamp_us)
    o = client.get(k)
    assert o.key == k and o.version == r2.version and o.value == b"two"
    assert o.previous_version_by_key == r1.version
    assert bytes(o.value) == b"two" and o.value.decode() == "two"
    assert client.get_size(k) == 3
    rm = client.remove(k)
    assert rm.version > r2.version
    with pytest.raises(sluice.NotFound) as e:
        client.get(k)
    assert k in str(e.value) and e.value.kind == "not_found" and e.value.details["key"] == k


def test_puts_accept_any_buffer(client):
    np = pytest.importorskip("numpy")
    k = key()
    for v, want in [
        (b"bytes", b"bytes"),
        (bytearray(b"arr"), b"arr"),
        (memoryview(b"view"), b"view"),
        ("text é", "text é".encode()),
        (np.arange(4, dtype=np.uint16), np.arange(4, dtype=np.uint16).tobytes()),
        # Not contiguous: sent in C order, as tobytes() gives it.
        (np.arange(10, dtype=np.int32)[::3], np.arange(10, dtype=np.int32)[::3].tobytes()),
        (np.arange(6, dtype=np.uint8).reshape(2, 3).T, bytes([0, 3, 1, 4, 2, 5])),
        (memoryview(b"abcdef")[::2], b"ace"),
    ]:
        client.put(k, v)
        assert client.get(k).value.tobytes() == want
    with pytest.raises(TypeError, match="bytes-like"):
        client.put(k, 42)


def test_a_buffer_of_python_objects_is_refused_not_stored_as_addresses(client):
    np = pytest.importorskip("numpy")
    k = key()
    client.put(k, b"before")
    # Its buffer's bytes are this process's pointers to the objects.
    for v in [
        np.array(["a", None], dtype=object),
        np.zeros(2, dtype=[("x", "<f8"), ("label", object)]),
    ]:
        with pytest.raises(TypeError, match="Python objects"):
            client.put(k, v)
        with pytest.raises(TypeError, match="Python objects"):
            client.trigger_put(k, v)
    assert client.get(k).value == b"before"
    # A field whose name has an O is data.
    rec = np.zeros(2, dtype=[("Oxygen", "<f8")])
    client.put(k, rec)
    assert client.get(k).value.tobytes() == rec.tobytes()


def test_results_pickle_for_multiprocessing(client):
    # "cannot pickle 'sluice.Object' object": a result could not be sent
    # to a multiprocessing pool or a Ray task.
    import pickle

    k = key()
    r = client.put(k, b"\x00value")
    o = client.get(k)
    w = client.watch(k)
    client.put(k, b"second")
    n = w.next(timeout=5)
    w.close()
    for x in (o, r, o.value, n):
        y = pickle.loads(pickle.dumps(x))
        assert type(y) is type(x) and repr(y) == repr(x)
    o2 = pickle.loads(pickle.dumps(o))
    assert (o2.key, o2.version, o2.timestamp_us, o2.previous_version_by_key, o2.removed) == (
        o.key, o.version, o.timestamp_us, o.previous_version_by_key, o.removed)
    assert o2.value == b"\x00value" and tuple(pickle.loads(pickle.dumps(r))) == tuple(r)
    assert pickle.loads(pickle.dumps(n)).value == b"second"


def test_a_read_names_a_version_or_a_time_not_both(client):
    k = key()
    r = client.put(k, b"v")
    with pytest.raises(ValueError, match="not both"):
        client.get(k, version=r.version, timestamp_us=r.timestamp_us)
    with pytest.raises(ValueError, match="not both"):
        client.get_size(k, version=r.version, timestamp_us=r.timestamp_us)
    with pytest.raises(ValueError, match="linearizable"):
        client.get(k, version=r.version, linearizable=True)
    assert client.get(k, version=r.version).value == b"v"
    with pytest.raises(ValueError, match="not both"):
        client.watch(k, from_version=r.version, from_time_us=r.timestamp_us)


def test_values_are_shared_not_copied(client):
    np = pytest.importorskip("numpy")
    k = key()
    payload = np.random.default_rng(1).integers(0, 255, 1 << 20, dtype=np.uint8)
    client.put(k, payload)
    v = client.get(k).value
    before = sys.getrefcount(v)
    a = np.frombuffer(v, dtype=np.uint8)
    b = np.frombuffer(v, dtype=np.uint8)
    # Both arrays point at the bytes the value holds: no copy was made.
    assert a.ctypes.data == v.address == b.ctypes.data
    assert memoryview(v).readonly and len(memoryview(v)) == len(v) == 1 << 20
    # Each array keeps the value alive through its buffer export.
    assert sys.getrefcount(v) == before + 2
    assert np.array_equal(a, payload)
    with pytest.raises(ValueError):
        a[0] = 1  # read-only


def test_a_value_indexes_and_slices_as_bytes_do(client):
    k = key()
    data = bytes(range(10))
    client.put(k, data)
    v = client.get(k).value
    for i in (0, 3, 9, -1, -10):
        assert v[i] == data[i]
    for sl in (slice(2, 5), slice(None, 4), slice(-3, None), slice(None, None, 3), slice(8, 2), slice(8, 2, -2), slice(100, 200)):
        assert v[sl] == data[sl] and type(v[sl]) is bytes
    assert list(v) == list(data)
    for bad in (10, -11):
        with pytest.raises(IndexError):
            v[bad]
    with pytest.raises(TypeError):
        v["a"]


def test_a_large_bytes_put_leaves_no_reference_behind(client):
    # The blocking put sends the object's own buffer and gives its
    # reference back before it returns; the stored value is the same.
    k = key()
    big = bytes(range(256)) * 4096
    before = sys.getrefcount(big)
    for _ in range(3):
        client.put(k, big)
        assert sys.getrefcount(big) == before
    client.trigger_put(k, big)
    assert sys.getrefcount(big) == before
    assert client.get(k).value == big


def test_conditional_writes_raise_version_conflict(client):
    k = key()
    r = client.put(k, b"a", previous_version=sluice.NO_VERSION)
    with pytest.raises(sluice.VersionConflict) as e:
        client.put(k, b"b", previous_version=sluice.NO_VERSION)
    assert isinstance(e.value, sluice.SluiceError)
    client.put(k, b"c", previous_version=r.version)


def test_error_classes_carry_the_cli_message(client):
    with pytest.raises(sluice.NoPool) as e:
        client.put("/nowhere/x", b"v")
    assert "/nowhere/x" in str(e.value)
    with pytest.raises(sluice.InvalidKey):
        client.put("no-slash", b"v")
    with pytest.raises(sluice.PoolNotFound):
        client.get_object_pool("/missing-pool")
    with pytest.raises(sluice.InvalidPool) as e:
        client.create_object_pool("/typo-pool", "volatle")
    assert '"/typo-pool"' in str(e.value) and '"volatle"' in str(e.value)
    with pytest.raises(sluice.ValueTooLarge):
        client.put(key(), b"x" * (client._c.max_value_bytes + 1))
    with pytest.raises(sluice.DfgNotFound):
        client.dfg_remove("no-such-graph")
    with pytest.raises(sluice.NotSupported, match="`broadcast`: cluster commands on a standalone node"):
        client.broadcast(key())
    # Every kind is a class under SluiceError.
    for name in ["NotFound", "VersionConflict", "NoPool", "Timeout", "ConnectionError", "NotLeader"]:
        assert issubclass(getattr(sluice, name), sluice.SluiceError)


def test_the_package_top_level_holds_its_own_classes_and_the_exceptions():
    """`sluice.SharedQueue` was the extension's class (a star import put it
    there), which took only the extension's client: given a
    `sluice.Client` it failed with "'Client' object is not an instance of
    'Client'". The stream classes are `sluice.streams`'; at the top level
    are the package's own names and every exception class."""
    import sluice.streams
    from sluice import _sluice

    for name, v in vars(_sluice).items():
        if isinstance(v, type) and issubclass(v, BaseException):
            assert getattr(sluice, name) is v, name
    for name in ["SharedQueue", "StreamProducer", "StreamSubscriber", "RateConsumer", "Aligner", "Ticker"]:
        assert not hasattr(sluice, name), name
        assert hasattr(sluice.streams, name.replace("Stream", "")), name
    for name in sluice.__all__:
        assert hasattr(sluice, name), name


def test_connection_error_is_typed():
    with pytest.raises(sluice.ConnectionError):
        sluice.Client("127.0.0.1:1", connect_timeout=0.5)


def test_pools_multi_get_list_and_trigger(client):
    pool = f"/py-{uuid.uuid4().hex[:8]}"
    meta = client.create_object_pool(pool, "volatile")
    assert meta["pathname"] == pool and meta["pool_type"] == "volatile"
    assert pool in [p["pathname"] for p in client.list_object_pools()]
    with pytest.raises(sluice.PoolExists):
        client.create_object_pool(pool)
    client.put(f"{pool}/a", b"1")
    client.put(f"{pool}/b", b"2")
    assert client.list_keys_in_object_pool(pool) == [f"{pool}/a", f"{pool}/b"]
    got = client.multi_get([f"{pool}/a", f"{pool}/missing", f"{pool}/b"])
    assert [None if o is None else o.value.tobytes() for o in got] == [b"1", None, b"2"]
    assert client.get_object_pool(pool)["pathname"] == pool
    # No access_policy: pools have no access setting of their own (it
    # read {'mode': ''}, as if one could be set); `policy` rules give access.
    assert all("access_policy" not in m for m in [meta, client.get_object_pool(pool), *client.list_object_pools()])
    assert client.remove_object_pool(pool)["deleted"] is True
    # The removed pool's error names what frees its path.
    with pytest.raises(sluice.PoolDeleted, match=f"until `sluice pools purge {pool}`"):
        client.get(f"{pool}/a")
    ts = client.trigger_put("/trig/x", b"t")
    assert ts > 0


def test_watch_iterator_and_callback(client):
    prefix = key()
    with client.watch(prefix) as w:
        client.put(prefix + "/a", b"1")
        n = w.next(timeout=10)
        assert n is not None and n.kind == "put" and n.key == prefix + "/a" and n.value == b"1"
        assert w.next(timeout=0.05) is None  # nothing more came
    got = []
    done = threading.Event()

    def on(n):
        got.append(n.key)
        if len(got) == 2:
            done.set()

    w = client.watch(prefix, callback=on)
    client.put(prefix + "/b", b"2")
    client.remove(prefix + "/b")
    assert done.wait(10)
    assert got == [prefix + "/b", prefix + "/b"]
    # Its notifications are the callback's: next() would take some.
    with pytest.raises(RuntimeError, match="callback"):
        w.next(timeout=0.01)
    with pytest.raises(RuntimeError, match="callback"):
        iter(w)
    w.close()


def test_closing_a_watch_that_a_thread_waits_on_is_prompt(client):
    # A callback watch's thread waits in next(); close() waited for the
    # end of that wait's 100 ms slice (0-100 ms per close).
    took = []
    for _ in range(10):
        w = client.watch(f"/vol/{uuid.uuid4().hex}/", callback=lambda n: None)
        t0 = time.monotonic()
        w.close()
        took.append(time.monotonic() - t0)
    assert sum(took) < 0.15, took


def test_ctrl_c_ends_a_blocking_call_that_waits_long(node):
    # A read at a time 20 s ahead waits for that time to be stable: Ctrl-C
    # (SIGINT) waited for it too, or for the call's timeout.
    c = sluice.Client(node.addr, timeout=60)
    k = key()
    c.put(k, b"v")
    import signal

    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        c.get(k, timestamp=time.time() + 20)
    assert time.monotonic() - t0 < 5
    timer.join()
    # The dropped call left the client working.
    assert c.get(k).value == b"v"
    c.close()


def test_ctrl_c_during_a_large_put_leaves_the_value_and_the_client_whole(tmp_path):
    # Ctrl-C while a blocking put's frame is half written (the node paused,
    # so the socket fills): the rest of the frame still goes out, before
    # any other request. Before, the next put's bytes completed the cut
    # put's value on the node, which stored the mix.
    import signal

    from conftest import Node

    n = Node(tmp_path / "data")
    try:
        c = sluice.Client(n.addr, timeout=30)
        k = key()
        big = b"x" * (32 << 20)
        os.kill(n.proc.pid, signal.SIGSTOP)
        try:
            timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                c.put(k, big)
            timer.join()
        finally:
            os.kill(n.proc.pid, signal.SIGCONT)
        c.put(k + "/after", b"y" * (4 << 20))
        got = c.get(k)
        assert len(got.value) == len(big)
        assert bytes(got.value) == big
        assert len(c.get(k + "/after").value) == 4 << 20
        c.close()
    finally:
        n.stop()


def test_ctrl_c_ends_a_watch_wait_and_the_watch_goes_on(client):
    # A blocking next() on a watch with nothing coming: Ctrl-C ends it
    # within a slice, and the watch still delivers what comes after.
    import signal

    prefix = f"/vol/{uuid.uuid4().hex}/"
    w = client.watch(prefix)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        w.next(timeout=30)
    assert time.monotonic() - t0 < 5
    timer.join()
    client.put(prefix + "a", b"after")
    n = w.next(timeout=10)
    assert n is not None and n.object.key == prefix + "a"
    w.close()


def test_a_callback_that_raises_is_logged_and_the_watch_goes_on(client, caplog):
    prefix = key()
    got = []
    done = threading.Event()

    def on(n):
        got.append(n.key)
        if len(got) == 1:
            raise RuntimeError("the callback's own bug")
        done.set()

    with caplog.at_level("ERROR", logger="sluice"):
        w = client.watch(prefix, callback=on)
        client.put(prefix + "/a", b"1")
        client.put(prefix + "/b", b"2")
        # The first call raised; the second notification still came.
        assert done.wait(10)
        w.close()
    assert got == [prefix + "/a", prefix + "/b"] and w.callback_errors == 1
    logged = [r for r in caplog.records if r.name == "sluice"]
    assert len(logged) == 1 and prefix + "/a" in logged[0].getMessage()
    assert "the callback's own bug" in logged[0].exc_text


@pytest.mark.parametrize("waiting", ["next", "callback"])
def test_a_program_exits_cleanly_with_threads_waiting_in_the_client(node, waiting):
    # A daemon thread still waiting in the client when the program ends (in
    # a watch's `next`, or a watch's callback thread) aborted the process
    # when its wait ended during the interpreter's teardown: "FATAL:
    # exception not rethrown", exit code 134 (the `next` case every time
    # with a teardown this slow; the callback case now and then).
    script = f"""
import sys, threading, time, sluice
class SlowTeardown:
    def __del__(self):
        time.sleep(0.3)  # the program's teardown takes a while: the waits end in it
slow = SlowTeardown()
c = sluice.Client({node.addr!r})
k = "/vol/py/exit-{uuid.uuid4().hex}"
if {waiting!r} == "callback":
    w = c.watch(k, callback=lambda n: None)
    t, inside = next(t for t in threading.enumerate() if t.name.startswith("sluice-watch")), "_notifications"
else:
    w = c.watch(k)
    t, inside = threading.Thread(target=w.next, daemon=True), "next"
    t.start()
# Wait (a condition, polled) until the thread is in the client's call.
deadline = time.monotonic() + 10
while getattr(sys._current_frames().get(t.ident), "f_code", None) is None or sys._current_frames()[t.ident].f_code.co_name != inside:
    assert time.monotonic() < deadline, "the thread never waited in the client"
    time.sleep(0.001)
print("done")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "done"), r.stderr
    assert "FATAL" not in r.stderr


def test_a_forked_child_makes_its_own_client_and_the_parents_is_refused(node):
    # After a fork (multiprocessing's default on Linux, DataLoader workers)
    # every call in the child hung, even on a new client: the shared
    # runtime's threads stay in the parent. The parent's client is refused
    # (its sockets are the parent's); a new one works.
    script = f"""
import os, sys, sluice
c = sluice.Client({node.addr!r}, timeout=5)
k = "/vol/py/fork-{uuid.uuid4().hex}"
c.put(k, b"from the parent")
pid = os.fork()
if pid == 0:
    try:
        c.get(k)
        print("the parent's client answered in the child")
    except sluice.ConnectionError as e:
        print("refused:", "forked" in str(e))
    mine = sluice.Client({node.addr!r}, timeout=5)
    print("child:", mine.get(k).value.tobytes().decode())
    mine.put(k, b"from the child")
    sys.stdout.flush()
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child exit:", status)
print("parent:", c.get(k).value.tobytes().decode())
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "refused: True",
        "child: from the parent",
        "child exit: 0",
        "parent: from the child",
    ], r.stdout + r.stderr


def test_a_closed_client_refuses_calls_with_a_clear_error(node):
    c = sluice.Client(node.addr)
    k = key()
    c.put(k, b"v")
    c.close()
    with pytest.raises(sluice.ConnectionError, match="the client is closed") as e:
        c.get(k)
    assert e.value.kind == "connection"
    c.close()  # closing again is harmless


def test_the_package_has_a_version_and_its_objects_say_what_they_are(node):
    root = Path(__file__).resolve().parents[3]
    cargo = (root / "Cargo.toml").read_text()
    assert f'version = "{sluice.__version__}"' in cargo
    c = sluice.Client(node.addr)
    assert repr(c) == f"<sluice.Client {node.addr}>"
    w = c.watch("/vol/repr/")
    assert repr(w) == "<sluice.Watch '/vol/repr/'>"
    w.close()
    c.close()
    assert repr(c) == f"<sluice.Client {node.addr} (closed)>"

    async def main():
        a = await sluice.AsyncClient.connect(node.addr)
        aw = await a.watch("/vol/repr/")
        reprs = repr(a), repr(aw)
        await aw.close()
        a.close()
        return reprs + (repr(a),)

    assert asyncio.run(main()) == (
        f"<sluice.AsyncClient {node.addr}>",
        "<sluice.AsyncWatch '/vol/repr/'>",
        f"<sluice.AsyncClient {node.addr} (closed)>",
    )


def test_a_pools_objects_stream_in_batches_in_parts_and_skip_keys_removed_since_the_listing(client, node):
    # What PoolDataset yields (torch-free, so tested everywhere). It fetched
    # one key per request, and a key removed between the listing and its
    # get ended the epoch with NotFound.
    from sluice._pool_iter import pool_objects

    prefix = f"/vol/scan-{uuid.uuid4().hex[:8]}/"
    want = {f"{prefix}{i:03}": bytes([i % 256]) * (i % 5) for i in range(150)}  # empty values too
    for k, v in want.items():
        client.put(k, v)
    got = {k: bytes(v) for k, v in pool_objects(node.addr, "/vol", prefix)}
    assert got == want
    parts = [dict(pool_objects(node.addr, "/vol", prefix, part=(i, 3))) for i in range(3)]
    assert sorted(k for p in parts for k in p) == sorted(want)
    it = pool_objects(node.addr, "/vol", prefix, batch=1)
    first, _ = next(it)
    for k in want:
        if k != first:
            client.remove(k)
    assert list(it) == []
    # Persistent, as of a time: a key removed later is still there then.
    pool = f"/pscan-{uuid.uuid4().hex[:8]}"
    client.create_object_pool(pool, "persistent")
    for i in range(3):
        client.put(f"{pool}/{i}", b"v%d" % i)
    t = time.time()
    client.remove(f"{pool}/1")
    assert {k: bytes(v) for k, v in pool_objects(node.addr, pool, timestamp=t)} == {
        f"{pool}/{i}": b"v%d" % i for i in range(3)
    }


def test_client_options_of_the_wrong_kind_are_errors_naming_the_option(node):
    # A text timeout said "argument 'timeout_s'" (the extension's name);
    # connections=0 was taken as 1.
    for kw, err, what in [
        ({"timeout": "5"}, TypeError, "timeout must be a number of seconds, not str"),
        ({"connect_timeout": None}, TypeError, "connect_timeout must be a number of seconds, not NoneType"),
        ({"timeout": True}, TypeError, "timeout must be a number"),
        ({"connections": 0}, ValueError, "connections=0"),
        ({"connections": -1}, ValueError, "connections=-1 is negative"),
    ]:
        with pytest.raises(err, match=re.escape(what)):
            sluice.Client(node.addr, **kw)
    sluice.Client(node.addr, timeout=2, connect_timeout=0.5).close()


def test_persistent_pools_keep_versions_for_time_reads_and_history(client):
    pool = f"/pers-{uuid.uuid4().hex[:8]}"
    client.create_object_pool(pool, "persistent")
    k = f"{pool}/k"
    r1 = client.put(k, b"old")
    r2 = client.put(k, b"new")
    t = (r1.timestamp_us + r2.timestamp_us) // 2
    # A stable read of a past time never changes.
    assert client.get(k, timestamp_us=t).value == b"old"
    assert client.get(k, timestamp=t / 1e6, stable=False).value == b"old"
    assert client.get(k, version=r1.version).value == b"old"
    client.remove(k)
    h = client.history(k)
    assert [(o.value.tobytes(), o.removed) for o in h] == [(b"", True), (b"new", False), (b"old", False)]
    # A removal reads as one, not as an empty value.
    assert repr(h[0]).endswith("removed=True)") and "removed" not in repr(h[1])
    with pytest.raises(ValueError, match="not both"):
        client.get(k, timestamp=1.0, timestamp_us=1)
    # A time in µs where seconds were meant: an OverflowError that said
    # only "int too big to convert"; now what the unit is.
    with pytest.raises(ValueError, match=r"in seconds since the epoch.*timestamp_us="):
        client.get(k, timestamp=r2.timestamp_us)
    # Negative versions and times: an OverflowError ("can't convert
    # negative int to unsigned"); now what is wrong.
    with pytest.raises(ValueError, match="versions start at 1"):
        client.get(k, version=-1)
    with pytest.raises(ValueError, match="versions start at 1"):
        client.get_size(k, version=-1)
    with pytest.raises(ValueError, match="timestamp_us=-5 is before the epoch"):
        client.get(k, timestamp_us=-5)
    with pytest.raises(ValueError, match="timestamp=-1.0 is before the epoch"):
        client.list_keys_in_object_pool("/vol", timestamp=-1.0)
    # Bounds swapped: an error, not an empty history.
    with pytest.raises(sluice.InvalidArgument, match="starts at 9, after its end 3"):
        client.history(k, start=9, end=3)


def test_negative_counts_and_versions_are_value_errors_naming_the_argument(node, client):
    # Each raised the extension's OverflowError ("can't convert negative
    # int to unsigned", or "out of range integral type conversion
    # attempted"), which named no argument.
    calls = [
        ("previous_version", lambda: client.put("/vol/neg", b"v", previous_version=-1)),
        ("previous_version", lambda: client.remove("/vol/neg", previous_version=-2)),
        ("trace_id", lambda: client.trigger_put("/trig/neg", b"v", trace_id=-1)),
        ("start", lambda: client.history("/vol/neg", start=-1)),
        ("end", lambda: client.history("/vol/neg", end=-1)),
        ("keep_versions", lambda: client.create_object_pool("/negp", "persistent", keep_versions=-1)),
        ("subgroup_index", lambda: client.create_object_pool("/negp", subgroup_index=-1)),
        ("from_version", lambda: client.watch("/vol/", from_version=-1)),
        ("from_time_us", lambda: client.watch("/vol/", from_time_us=-1)),
        ("fanout", lambda: client.broadcast("/vol/neg", fanout=-1)),
        ("to", lambda: client.broadcast("/vol/neg", to=[1, -1])),
        ("connections", lambda: sluice.Client(node.addr, connections=-1)),
        ("value_part_bytes", lambda: sluice.Client(node.addr, value_part_bytes=-1)),
    ]
    for name, call in calls:
        with pytest.raises(ValueError, match=rf"^{name}=.*-\d.* is negative$"):
            call()

    async def main():
        async with await sluice.AsyncClient.connect(node.addr) as c:
            with pytest.raises(ValueError, match="previous_version=-1 is negative"):
                await c.put("/vol/neg", b"v", previous_version=-1)
            with pytest.raises(ValueError, match="trace_id=-1 is negative"):
                await c.trigger_put("/trig/neg", b"v", trace_id=-1)
            with pytest.raises(ValueError, match="from_version=-1 is negative"):
                await c.watch("/vol/", from_version=-1)
            # A good call after them works.
            assert (await c.put("/vol/neg", b"v")).version > 0

    import asyncio

    asyncio.run(main())


def test_an_odd_argument_is_a_python_exception_never_a_panic(node):
    # Each method of the client, and the stream operators, called with one
    # argument at a time replaced by a value of the wrong type or at the
    # edge of its range (the others valid): what comes back is an
    # ordinary exception (TypeError, ValueError, OverflowError, a
    # SluiceError), never the extension's PanicException (a BaseException
    # that an `except Exception` does not catch) or a SystemError.
    from sluice import streams

    odd = [None, 0, -1, 2**64, 2**64 - 1, 1.5, float("nan"), "", "/", "\x00", b"/vol/a",
           [], [-1], {}, object(), True, "/vol/" + "a" * 2000]
    valid = {
        "key": "/vol/odd", "value": b"v", "pathname": "/oddpool", "prefix": "/vol/odd",
        "pool": "/vol", "keys": ["/vol/odd"], "op": "whoami", "text": "[]", "id": "nope",
        "addr": node.addr, "pool_type": "volatile", "timeout": 0.5,
    }
    bad = []

    def attempt(label, f, *args, **kwargs):
        try:
            f(*args, **kwargs)
        except Exception as e:
            if type(e).__name__ == "PanicException" or isinstance(e, SystemError):
                bad.append(f"{label}: {type(e).__name__}: {e}")
        except BaseException as e:  # PanicException derives from BaseException
            bad.append(f"{label}: {type(e).__name__}: {e}")

    with sluice.Client(node.addr, timeout=0.5) as c:
        for name, m in inspect.getmembers(c, inspect.ismethod):
            if name.startswith("_") or name in ("close", "watch"):
                continue
            params = [p for p in inspect.signature(m).parameters.values()
                      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            base = {p.name: valid[p.name] for p in params
                    if p.default is p.empty and p.name in valid}
            for p in params:
                for v in odd:
                    args = dict(base, **{p.name: v})
                    attempt(f"{name}({p.name}={v!r:.30})", m, **args)
        for v in odd:
            attempt(f"watch({v!r:.30})", lambda: c.watch(v).close())
            attempt(f"watch(from_version={v!r:.30})", lambda: c.watch("/vol/odd", from_version=v).close())
        # Waits, leases and periods past the clock's range: capped (they
        # panicked: "overflow when adding duration to instant").
        for long in (1e19, float("inf")):
            w = c.watch("/vol/odd-long")
            threading.Timer(0.2, w.close).start()  # close() ends the wait
            attempt(f"Watch.next({long})", w.next, long)
            attempt(f"RateConsumer(period_s={long})", streams.RateConsumer, c, "odd", ["a"], long)
            attempt(f"RateConsumer(max_age_s={long})", streams.RateConsumer, c, "odd", ["a"], 0.1, long)
            q = streams.SharedQueue(c, "odd-long", "a", lease_s=long)
            q.push(b"x")
            attempt(f"SharedQueue(lease_s={long}).take", lambda: q.ack(q.take(5)))
    for v in odd:
        attempt(f"Aligner({v!r:.30})", streams.Aligner, ["a"], v)
        attempt(f"Aligner.push({v!r:.30})", lambda: streams.Aligner(["a"], 1).push("a", v, v))
        attempt(f"Ticker({v!r:.30})", streams.Ticker, ["a"], v, v)
        attempt(f"Ticker.tick_until({v!r:.30})", lambda: streams.Ticker(["a"], 0, 1).tick_until(v))
        attempt(f"Aligner(sources={v!r:.30})", streams.Aligner, v, 1)
    assert not bad, "\n".join(bad)
    # The node took it all and serves.
    with sluice.Client(node.addr) as c:
        c.put("/vol/odd-after", b"x")
        assert c.get("/vol/odd-after").value == b"x"


def test_every_error_kind_has_its_exception_class():
    # The native side maps every variant of the Rust error with no
    # wildcard (a new kind does not compile without a class).
    names = sluice._sluice._error_classes
    # ... and every class is in the type stubs (a new kind lands there too).
    stub = (Path(sluice.__file__).parent / "_sluice.pyi").read_text()
    stubbed = set(re.findall(r"^class (\w+)\(SluiceError\)", stub, re.M))
    assert len(names) == len(set(names)) == len(stubbed) >= 33
    assert set(names) == stubbed
    for name in names:
        cls = getattr(sluice, name)
        assert issubclass(cls, sluice.SluiceError) and cls is not sluice.SluiceError, name
        assert cls.__doc__, name


def test_large_values_in_parts_arrive_whole(node):
    """``value_part_bytes``: a value larger than a part goes out in parts
    (small requests interleave) and is stored whole."""
    big = bytes(range(256)) * 4096  # 1 MiB
    with sluice.Client(node.addr, value_part_bytes=64 * 1024) as c:
        c.put("/vol/parts/big", big)
        c.put("/vol/parts/small", b"s")
        assert bytes(c.get("/vol/parts/big").value) == big
        assert bytes(c.get("/vol/parts/small").value) == b"s"


def test_a_policy_command_is_an_op_with_fields_or_a_whole_command(client):
    """``policy("whoami")``, or the command whole as JSON text or a dict
    (JSON text was taken as the name of an op: "unknown variant")."""
    me = client.policy("whoami")
    assert client.policy('{"op": "whoami"}') == me
    assert client.policy({"op": "whoami"}) == me
    assert client.policy({"op": "ls"}) == client.policy("ls")
    with pytest.raises(ValueError, match="not valid JSON"):
        client.policy('{"op": "whoami"')
