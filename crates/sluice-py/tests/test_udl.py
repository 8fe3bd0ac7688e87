"""Python lambdas on a real node: out-of-process workers over shared
memory, emit and store access, errors counted, crashes survived, FIFO per
key, live upgrades."""

import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import sluice

UDLS = str(Path(__file__).parent / "udls")


def graph(gid, pathname, cls, dest, *, workers=1, policy="stateless", **conf):
    return json.dumps(
        {
            "graphs": [
                {
                    "id": gid,
                    "graph": [
                        {
                            "pathname": pathname,
                            "user_defined_logic_list": ["python"],
                            "user_defined_logic_config_list": [
                                {"python_path": [UDLS], "module": "sample_udls", "entry_class": cls, "workers": workers, **conf}
                            ],
                            "user_defined_logic_stateful_list": [policy],
                            "destinations": [{dest: "put"}],
                        }
                    ],
                }
            ]
        }
    )


def wait_for(what, cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = cond()
        if r:
            return r
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def get_or_none(c, k):
    try:
        return c.get(k)
    except sluice.NotFound:
        return None


def status(c, gid):
    for g in c.dfg_list():
        if g["id"] == gid:
            return g["status"][0]
    raise AssertionError(f"no graph {gid}")


@pytest.fixture
def vertex(client):
    """A fresh trigger pool for a vertex and a volatile pool for its output."""
    name = uuid.uuid4().hex[:8]
    client.create_object_pool(f"/in-{name}", "trigger")
    client.create_object_pool(f"/out-{name}", "volatile")
    yield f"/in-{name}", f"/out-{name}", f"g-{name}"


def test_a_python_lambda_emits(client, vertex):
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "Upper", dst))
    client.trigger_put(f"{src}/a", b"hello")
    o = wait_for("the emitted object", lambda: get_or_none(client, f"{dst}/a"))
    assert o.value == b"HELLO"
    # The input object itself, emitted back: same bytes (1 MB).
    client.dfg_apply(graph(gid, src, "Echo", dst))
    big = bytes(range(256)) * 4096
    client.trigger_put(f"{src}/big", big)
    o = wait_for("the echoed object", lambda: get_or_none(client, f"{dst}/big"))
    assert o.value == big


def test_wakeups_of_a_python_vertex_are_counted(client, vertex):
    # With no polling on either side, every call the worker waits for is
    # one wake-up of the worker's (and the node's answers may be too);
    # `dfg list` shows them with the vertex's counters.
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "Upper", dst, spin_us=0, worker_spin_us=0))
    for i in range(5):
        client.trigger_put(f"{src}/w{i}", b"x")
        wait_for("the emitted object", lambda: get_or_none(client, f"{dst}/w{i}"))
    st = wait_for("five calls", lambda: (s := status(client, gid))["calls"] >= 5 and s)
    w = st["counters"]["wakeups"]
    # One before each call; the node reads the count at a call's end, by
    # which time the worker may already sleep for the next.
    assert w["worker"] in (5, 6), st
    assert 1 <= w["node"] <= 2 * 5 + 1, st  # an emit and a done a call, and the worker's start


def test_a_python_lambda_uses_the_store(client, vertex):
    src, dst, gid = vertex
    side = f"/vol/side-{gid}"
    client.put(side + "/config", b"cfg")
    client.dfg_apply(graph(gid, src, "StoreUser", dst, side=side))
    client.trigger_put(f"{src}/k1", b"v1")
    o = wait_for("the emitted object", lambda: get_or_none(client, f"{dst}/k1"))
    assert o.value == b"cfg:1:True:True:StoreError/not_found/True"
    assert client.get(side + "/seen/k1").value == b"v1"


def test_a_lambda_emits_and_puts_strided_views(client, vertex):
    src, dst, gid = vertex
    side = f"/vol/strided-{gid}"
    client.dfg_apply(graph(gid, src, "Strided", dst, side=side))
    client.trigger_put(f"{src}/k", b"aAbBcC")
    o = wait_for("the emitted object", lambda: get_or_none(client, f"{dst}/k"))
    assert o.value == b"abc"
    assert client.get(side + "/k").value == b"ABC"
    assert status(client, gid)["failures"] == 0


def test_errors_are_counted_and_a_crashed_worker_is_replaced(client, vertex):
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "Faulty", dst))
    client.trigger_put(f"{src}/raise-1", b"x")
    st = wait_for("the failure to be counted", lambda: (s := status(client, gid))["failures"] >= 1 and s)
    assert "ValueError" in st["last_error"] and "cannot handle" in st["last_error"]
    client.trigger_put(f"{src}/crash-1", b"x")
    st = wait_for("the crash to be counted", lambda: (s := status(client, gid))["failures"] >= 2 and s)
    assert "exited with code 3" in st["last_error"] and "crash-1" in st["last_error"], st
    # The next upcalls run on a new worker: nothing else is lost.
    for i in range(5):
        client.trigger_put(f"{src}/after-{i}", f"{i}".encode())
    for i in range(5):
        o = wait_for(f"after-{i}", lambda: get_or_none(client, f"{dst}/after-{i}"))
        assert o.value == f"ok:{i}".encode()
    assert status(client, gid)["failures"] == 2
    # Upcalls queued behind one that crashes its worker all run.
    client.trigger_put(f"{src}/crash-2", b"x")
    for i in range(10):
        client.trigger_put(f"{src}/queued-{i}", f"{i}".encode())
    for i in range(10):
        o = wait_for(f"queued-{i}", lambda: get_or_none(client, f"{dst}/queued-{i}"))
        assert o.value == f"ok:{i}".encode()
    assert status(client, gid)["failures"] == 3


def test_a_lambda_failing_on_every_object_does_not_flood_the_log(client, vertex, node):
    # Every failure is counted, with the last error; the log has its first
    # few (traceback included) and then one line per 10 s saying how many
    # it left out. Before: a warning and a traceback (seven lines, 1.2 KB)
    # per object.
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "Faulty", dst))
    start = len(node.log())
    t0 = time.monotonic()
    n = 200
    for i in range(n):
        client.trigger_put(f"{src}/raise-{i}", b"x")
    wait_for("every failure counted", lambda: status(client, gid)["failures"] >= n)
    took = time.monotonic() - t0
    st = status(client, gid)
    assert st["failures"] == n and "cannot handle" in st["last_error"], st
    log = node.log()[start:]
    # The burst of 5, and one more for each 10 s the run took.
    most = 5 + int(took / 10) + 1
    failed = log.count("UDL failed")
    tracebacks = log.count("Traceback (most recent call last)")
    assert 1 <= failed <= most, (failed, took)
    assert 1 <= tracebacks <= most, (tracebacks, took)


def test_fifo_per_key_holds_with_several_workers(client, vertex):
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "Sequence", dst, workers=2, policy="stateful"))
    keys = [f"k{i}" for i in range(4)]
    seen = {k: [] for k in keys}
    done = threading.Event()
    n = 25

    def on(note):
        k = note.key.rsplit("/", 1)[1]
        seen[k].append(int(note.value.tobytes()))
        if all(len(v) == n for v in seen.values()):
            done.set()

    w = client.watch(dst, callback=on)
    for j in range(n):
        for k in keys:
            client.trigger_put(f"{src}/{k}", str(j).encode())
    assert done.wait(60), {k: len(v) for k, v in seen.items()}
    w.close()
    for k in keys:
        assert seen[k] == list(range(n)), (k, seen[k])


def test_live_upgrade_replaces_workers_and_calls_in_flight_finish(client, vertex):
    src, dst, gid = vertex
    started = f"/vol/started-{gid}"
    client.dfg_apply(graph(gid, src, "Slow", dst, tag="v1", delay_s=1.0, started=started))
    client.trigger_put(f"{src}/inflight", b"a")
    # Upgrade while that call runs (it said it started); the node keeps serving.
    wait_for("the call to start", lambda: get_or_none(client, f"{started}/inflight"))
    client.dfg_apply(graph(gid, src, "Slow", dst, tag="v2", delay_s=0.0, started=started))
    assert get_or_none(client, f"{dst}/inflight") is None, "the call was still in flight"
    o = wait_for("the call in flight", lambda: get_or_none(client, f"{dst}/inflight"))
    assert o.value == b"v1:a"
    client.trigger_put(f"{src}/after", b"b")
    o = wait_for("a call under the new code", lambda: get_or_none(client, f"{dst}/after"))
    assert o.value == b"v2:b"
    # Under load: upgrades while puts stream in lose none of them.
    n = 200
    sender = threading.Thread(
        target=lambda: [client.trigger_put(f"{src}/load-{i}", b"x") for i in range(n)]
    )
    sender.start()
    for tag in ("v3", "v4", "v5"):
        client.dfg_apply(graph(gid, src, "Slow", dst, tag=tag, delay_s=0.0, started=started))
    sender.join()
    outs = [wait_for(f"load-{i}", lambda i=i: get_or_none(client, f"{dst}/load-{i}")) for i in range(n)]
    assert {o.value.tobytes().split(b":")[0] for o in outs} <= {b"v2", b"v3", b"v4", b"v5"}
    assert status(client, gid)["failures"] == 0


def test_large_values_wake_the_worker_early_and_arrive_whole(client, vertex):
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "Noop", dst))
    values = [bytes([i]) * (1 << 20) for i in range(1, 6)]
    for i, v in enumerate(values):
        client.trigger_put(f"{src}/big{i}", v)
        o = wait_for(f"output {i}", lambda: get_or_none(client, f"{dst}/big{i}"))
        assert o.value.tobytes() == v
    # Each announced to the vertex as its key arrived, before its value.
    (g,) = [g for g in client.dfg_list() if g["id"] == gid]
    assert g["status"][0]["expected"] == len(values)
    assert g["status"][0]["calls"] == len(values)
    # Small values are not announced, and a worker woken with nothing to do
    # goes back to waiting: the next small call still runs.
    client.trigger_put(f"{src}/small", b"s")
    assert wait_for("the small output", lambda: get_or_none(client, f"{dst}/small")).value.tobytes() == b"s"
    (g,) = [g for g in client.dfg_list() if g["id"] == gid]
    assert g["status"][0]["expected"] == len(values)


def test_a_refused_emit_fails_its_call_and_the_next_calls_stay_in_step(client, vertex):
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "EmitsBadKey", dst))
    client.trigger_put(f"{src}/first", b"bad")
    st = wait_for("the failure to be counted", lambda: (s := status(client, gid))["failures"] >= 1 and s)
    assert "must not end with" in st["last_error"], st
    # Nothing the refused call emitted after the refusal was stored.
    assert get_or_none(client, f"{dst}/first") is None
    for i in range(20):
        client.trigger_put(f"{src}/k{i}", f"v{i}".encode())
        o = wait_for(f"output {i}", lambda: get_or_none(client, f"{dst}/k{i}"))
        assert o.value == f"V{i}".encode()
    st = status(client, gid)
    assert st["failures"] == 1 and st["calls"] == 21, st


def test_an_emit_of_python_objects_fails_its_call_instead_of_sending_addresses(client, vertex):
    pytest.importorskip("numpy")
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "EmitsBadKey", dst))
    client.trigger_put(f"{src}/first", b"objects")
    st = wait_for("the failure to be counted", lambda: (s := status(client, gid))["failures"] >= 1 and s)
    assert "TypeError" in st["last_error"] and "Python objects" in st["last_error"], st
    assert get_or_none(client, f"{dst}/first") is None
    client.trigger_put(f"{src}/next", b"v")
    assert wait_for("the next output", lambda: get_or_none(client, f"{dst}/next")).value == b"V"


def test_a_worker_that_breaks_the_protocol_is_replaced(client, vertex):
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "BreaksProtocol", dst))
    client.trigger_put(f"{src}/before", b"ok")
    before = wait_for("the first output", lambda: get_or_none(client, f"{dst}/before")).value.tobytes()
    client.trigger_put(f"{src}/broken", b"break")
    st = wait_for("the failure to be counted", lambda: (s := status(client, gid))["failures"] >= 1 and s)
    assert "outside its arena" in st["last_error"], st
    assert "its answer: kind" in st["last_error"], st  # the answer is named for a post-mortem
    client.trigger_put(f"{src}/after", b"ok")
    after = wait_for("the next output", lambda: get_or_none(client, f"{dst}/after")).value.tobytes()
    assert after.startswith(b"OK:") and before.startswith(b"OK:")
    assert after != before, "the broken worker was replaced by another process"


def test_a_store_reply_too_large_for_the_arena_is_an_error_the_lambda_sees(client, vertex):
    src, dst, gid = vertex
    client.put(f"{dst}/huge", b"h" * (2 << 20))
    client.dfg_apply(graph(gid, src, "EmitsBadKey", dst, arena_mb=1))
    client.trigger_put(f"{src}/read", f"big:{dst}/huge".encode())
    o = wait_for("what the lambda saw", lambda: get_or_none(client, f"{dst}/read"))
    assert o.value.tobytes().startswith(b"StoreError:") and b"arena_mb" in o.value.tobytes(), o.value.tobytes()
    # The worker is still in step.
    client.trigger_put(f"{src}/after", b"fine")
    assert wait_for("the next output", lambda: get_or_none(client, f"{dst}/after")).value == b"FINE"


def test_a_class_that_does_not_load_fails_the_apply(client, vertex):
    src, dst, gid = vertex
    with pytest.raises(sluice.SluiceError) as e:
        client.dfg_apply(graph(gid, src, "NoSuchClass", dst))
    assert "NoSuchClass" in str(e.value)
    # A module not found says where it was looked for.
    with pytest.raises(sluice.SluiceError, match=r"udls-typo'\] are not directories here"):
        client.dfg_apply(graph(gid, src, "Upper", dst, python_path=[UDLS + "-typo"]))
    # A package the module imports and the worker's interpreter lacks: the
    # message names the interpreter and how to pick another.
    g = json.loads(graph(gid, src, "Echo", dst))
    g["graphs"][0]["graph"][0]["user_defined_logic_config_list"][0]["module"] = "needs_missing"
    with pytest.raises(sluice.InvalidDfg) as e:
        client.dfg_apply(json.dumps(g))
    assert "sluice_test_no_such_package" in str(e.value)
    assert f"{sys.executable} does not have it" in str(e.value) and "SLUICE_PYTHON" in str(e.value)
    # Found at apply, not as a failure of every call.
    with pytest.raises(sluice.SluiceError, match="has no ocdpo_handler method"):
        client.dfg_apply(graph(gid, src, "NoHandler", dst))


def test_code_shipped_as_an_object_and_upgraded_by_a_put_and_apply(client, vertex):
    src, dst, gid = vertex
    code_key = f"/vol/code-{gid}"
    src_v1 = "class Tag:\n    def __init__(self, conf): pass\n    def ocdpo_handler(self, key, pathname, blob, emit, **kw):\n        emit(key[len(pathname):], b'v1:' + bytes(blob))\n"
    client.put(code_key, src_v1)
    cfg = lambda: json.dumps({"graphs": [{"id": gid, "graph": [{"pathname": src, "user_defined_logic_list": ["python"],
        "user_defined_logic_config_list": [{"module": "shipped_udl", "entry_class": "Tag", "code_key": code_key}],
        "destinations": [{dst: "put"}]}]}]})
    client.dfg_apply(cfg())
    client.trigger_put(f"{src}/a", b"x")
    assert wait_for("v1 output", lambda: get_or_none(client, f"{dst}/a")).value == b"v1:x"
    client.put(code_key, src_v1.replace("v1:", "v2:"))
    client.dfg_apply(cfg())
    client.trigger_put(f"{src}/b", b"y")
    assert wait_for("v2 output", lambda: get_or_none(client, f"{dst}/b")).value == b"v2:y"
    with pytest.raises(sluice.InvalidDfg, match="code_key"):
        client.dfg_apply(cfg().replace(code_key, "/vol/no-such-code"))


@pytest.mark.parametrize(
    "how, lands",
    [({}, True), ({"stream_copy": True}, False), ({"pin_cuda": True}, False), ({"landing_mb": 0}, False)],
)
def test_values_arrive_whole_and_aligned_however_the_node_writes_them(client, vertex, how, lands):
    import hashlib

    src, dst, gid = vertex
    # By default a trigger put of 256 KB or more is read from the socket
    # into the vertex's landing area (no copy); else the node copies the
    # value into the worker's arena, with streaming stores from 64 KB on
    # where asked (pin_cuda's default).
    client.dfg_apply(graph(gid, src, "Where", dst, **how))
    sizes = [(64 << 10) + 5, (1 << 20) + 13, 1000, (300 << 10) + 1]
    for i, n in enumerate(sizes):
        v = os.urandom(n)
        client.trigger_put(f"{src}/v{i}-with-an-odd-key-length", v)
        o = wait_for(f"value {i}", lambda: get_or_none(client, f"{dst}/v{i}-with-an-odd-key-length"))
        offset, digest, writable = o.value.tobytes().decode().split(":")
        assert digest == hashlib.sha256(v).hexdigest(), f"{n} bytes arrived changed"
        assert int(offset) % 64 == 0, (n, offset)
        if lands and n >= 256 << 10:
            # The landing area is the vertex's, shared by its workers.
            assert writable == "False", "a lambda must not write a landed value"
    (g,) = [g for g in client.dfg_list() if g["id"] == gid]
    large = sum(n >= 256 << 10 for n in sizes)
    assert g["status"][0]["landed"] == (large if lands else 0), g["status"]
    with pytest.raises(sluice.InvalidDfg, match="stream_copy"):
        client.dfg_apply(graph(gid, src, "Where", dst, stream_copy="yes"))
    with pytest.raises(sluice.InvalidDfg, match="landing_mb"):
        client.dfg_apply(graph(gid, src, "Where", dst, landing_mb=-1))


def test_landed_values_survive_crashes_and_the_area_is_reused(client, vertex):
    src, dst, gid = vertex
    # A landing area of 3 MiB holds two 1 MB frames at a time: had the two
    # calls that crash their workers kept their ranges, no later value
    # could land.
    client.dfg_apply(graph(gid, src, "Faulty", dst, landing_mb=3))
    big = os.urandom(1 << 20)
    for i in range(2):
        client.trigger_put(f"{src}/crash-{i}", big)
        wait_for(f"crash {i} counted", lambda: status(client, gid)["failures"] >= i + 1)
    for i in range(5):
        client.trigger_put(f"{src}/after-{i}", big)
        o = wait_for(f"after-{i}", lambda: get_or_none(client, f"{dst}/after-{i}"))
        assert o.value.tobytes() == b"ok:" + big
    st = status(client, gid)
    assert (st["landed"], st["failures"]) == (7, 2), st


def test_objects_reach_the_gpu_from_a_pinned_region(client, vertex):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (CI has none)")
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "ToCuda", dst, pin_cuda=True))
    client.trigger_put(f"{src}/t", bytes([1]) * 4096)
    o = wait_for("the GPU's answer", lambda: get_or_none(client, f"{dst}/t"))
    assert o.value == b"4096:True"


def test_store_replies_stay_valid_until_the_lambda_returns(client, vertex):
    src, dst, gid = vertex
    side = f"/vol/two-{gid}"
    client.put(side + "/a", b"A" * 1000)
    client.put(side + "/b", b"B" * 1000)
    client.dfg_apply(graph(gid, src, "TwoGets", dst, side=side))
    client.trigger_put(f"{src}/k", b"x")
    o = wait_for("the emitted object", lambda: get_or_none(client, f"{dst}/k"))
    assert o.value == b"A" * 1000 + b"+" + b"B" * 1000


def test_arena_and_worker_limits_are_errors(client, vertex):
    src, dst, gid = vertex
    # A value larger than the shared arena fails its upcall, saying so
    # (without a landing area: a landed value needs no room there).
    client.dfg_apply(graph(gid, src, "Upper", dst, arena_mb=1, landing_mb=0))
    client.trigger_put(f"{src}/big", b"x" * (2 << 20))
    st = wait_for("the failure to be counted", lambda: (s := status(client, gid))["failures"] >= 1 and s)
    assert "do not fit" in st["last_error"] and "arena_mb" in st["last_error"], st
    # Landed, it reaches the lambda; what it emits must fit the output arena.
    client.dfg_apply(graph(gid, src, "Upper", dst, arena_mb=1))
    client.trigger_put(f"{src}/big2", b"x" * (2 << 20))
    st = wait_for("the failure to be counted", lambda: (s := status(client, gid))["failures"] >= 1 and s)
    assert "exceeds the worker's output arena" in st["last_error"], st
    client.trigger_put(f"{src}/small", b"ok")
    assert wait_for("a small value", lambda: get_or_none(client, f"{dst}/small")).value == b"OK"
    for bad, field in [
        ({"workers": 0}, "workers"),
        ({"arena_mb": 0}, "arena_mb"),
        ({"spin_us": -1}, "spin_us"),
        ({"worker_spin_us": 200_000}, "worker_spin_us"),
        ({"call_timeout_s": 0}, "call_timeout_s"),
        ({"start_timeout_s": 1.5}, "start_timeout_s"),
    ]:
        with pytest.raises(sluice.InvalidDfg, match=field):
            client.dfg_apply(graph(gid, src, "Upper", dst, **bad))


def _a_call_stopped_at_its_timeout(client, vertex, cls, suffix, value):
    """Runs `cls` with a 1 s call limit on one value; the vertex's status
    once that call failed, which it must within 15 s."""
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, cls, dst, call_timeout_s=1))
    t0 = time.monotonic()
    client.trigger_put(f"{src}{suffix}", value)
    st = wait_for("the call to fail", lambda: (s := status(client, gid))["failures"] >= 1 and s)
    # Stopped at its limit, not after the hour a call had before.
    assert time.monotonic() - t0 < 15
    assert "call_timeout_s" in st["last_error"], st
    return st


def test_a_call_past_its_timeout_is_stopped_and_the_next_call_runs(client, vertex):
    src, dst, gid = vertex
    st = _a_call_stopped_at_its_timeout(client, vertex, "SleepsFor", "/stuck", b"60")
    assert "/stuck" in st["last_error"], st
    # Another worker takes the next call.
    client.trigger_put(f"{src}/quick", b"0")
    assert wait_for("the next call's output", lambda: get_or_none(client, f"{dst}/quick")).value == b"done"
    assert get_or_none(client, f"{dst}/stuck") is None


def test_a_call_that_emits_without_end_is_stopped_at_its_timeout(client, vertex):
    # The limit was looked at only after 100 ms without an answer: a lambda
    # emitting all the time was never stopped.
    _a_call_stopped_at_its_timeout(client, vertex, "EmitsForever", "/loop", b"x")
    client.dfg_remove(vertex[2])


def _lambda_dirs(node):
    return sorted(p.name for p in Path("/dev/shm").glob(f"sluice-py-{node.proc.pid}-*"))


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_a_lambda_that_does_not_start_leaves_no_shared_memory(node, client, vertex):
    src, dst, gid = vertex
    before = _lambda_dirs(node)
    for bad in [
        graph(gid, src, "NoSuchClass", dst),
        graph(gid, src, "NoHandler", dst, workers=2),
        graph(gid, src, "Upper", dst, python="/nonexistent/python3"),
    ]:
        with pytest.raises(sluice.InvalidDfg):
            client.dfg_apply(bad)
    assert _lambda_dirs(node) == before


def test_a_class_slower_to_load_than_its_start_timeout_fails_the_apply(client, vertex):
    src, dst, gid = vertex
    g = json.loads(graph(gid, src, "Echo", dst, start_timeout_s=1))
    g["graphs"][0]["graph"][0]["user_defined_logic_config_list"][0]["module"] = "slow_import"
    t0 = time.monotonic()
    with pytest.raises(sluice.InvalidDfg, match="start_timeout_s"):
        client.dfg_apply(json.dumps(g))
    assert time.monotonic() - t0 < 4  # the import takes 4 s


def test_a_lambdas_store_reads_refuse_what_they_cannot_read_as_the_client_does(client, vertex):
    # A negative, fractional or text version or time was read as "the
    # latest" (silently another object than the one asked for).
    src, dst, gid = vertex
    k = f"/vol/{gid}-checked"
    client.put(k, b"v1")
    client.put(k, b"v2")
    client.dfg_apply(graph(gid, src, "ReadChecks", dst))
    client.trigger_put(f"{src}/r", k)
    out = json.loads(bytes(wait_for("the report", lambda: get_or_none(client, f"{dst}/r")).value))
    assert out["negative"] == "ValueError: version=-1 is negative", out
    assert out["float"] == "TypeError: version must be an int, not float", out
    assert out["str"] == "TypeError: timestamp_us must be an int, not str", out
    assert out["both"] == "ValueError: give version or timestamp_us, not both", out
    assert out["raw"].startswith("StoreError invalid_argument: invalid version: -1 is not a whole number"), out
    assert out["put_int"] == (
        "TypeError: a value must be bytes-like (bytes, bytearray, memoryview, a NumPy array) or str, not int"
    ), out


def test_an_emit_outside_its_call_is_refused_not_lost(client, vertex):
    # A thread's emit after its call returned was taken by the worker, and
    # the node dropped it as an answer to an earlier call (and never freed
    # its room in the arena); one during the call wrote to the ring
    # alongside the lambda's own writes.
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "ThreadEmits", dst))
    client.trigger_put(f"{src}/start", b"start")
    assert wait_for("the first call", lambda: get_or_none(client, f"{dst}/start")).value == b"started"
    client.trigger_put(f"{src}/report", b"report")
    out = json.loads(bytes(wait_for("the report", lambda: get_or_none(client, f"{dst}/report")).value))
    assert out["during"].startswith("RuntimeError: emit() from another thread: "), out
    assert out["after"].startswith("RuntimeError: emit() after its call returned: "), out
    assert get_or_none(client, f"{dst}/during") is None and get_or_none(client, f"{dst}/after") is None
    assert status(client, gid)["failures"] == 0


def test_what_a_lambda_prints_is_in_the_nodes_log_saying_whose(node, client, vertex):
    # Workers wrote straight to the node's stdout and stderr: lines of
    # every lambda mixed, none saying which lambda or worker wrote it.
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "Prints", dst))
    mark = uuid.uuid4().hex
    client.trigger_put(f"{src}/p", mark)
    wait_for("the output", lambda: get_or_none(client, f"{dst}/p"))
    out = re.compile(rf"INFO .*: to stdout: {mark} lambda=sample_udls\.Prints pid=\d+")
    err = re.compile(rf"WARN .*: to stderr: {mark} lambda=sample_udls\.Prints pid=\d+")
    wait_for("both lines in the log", lambda: out.search(node.log()) and err.search(node.log()))



def _children(pid):
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def _running(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_worker_stuck_in_a_call_ends_with_its_node(tmp_path, how):
    # A worker looked for its node only between calls: one stuck in a call
    # (a loop, a long sleep) outlived the node for as long as the call ran.
    from conftest import Node

    n = Node(tmp_path / "data")
    try:
        c = sluice.Client(n.addr, timeout=20)
        c.dfg_apply(graph("stuck", "/trig/stuck", "Slow", "/vol/out", delay_s=600, started="/vol/started"))
        workers = wait_for("the worker", lambda: _children(n.proc.pid))
        c.trigger_put("/trig/stuck/k", b"x")
        wait_for("the call to start", lambda: get_or_none(c, "/vol/started/stuck/k"))
        os.kill(n.proc.pid, getattr(signal, how))
        n.proc.wait(30)
        wait_for("the worker to end", lambda: not any(_running(w) for w in workers), timeout=10)
    finally:
        n.stop()
        # What a killed node leaves (the next node's first Python lambda
        # would sweep it): not left behind by the tests.
        for d in Path("/dev/shm").glob(f"sluice-py-{n.proc.pid}-*"):
            shutil.rmtree(d, ignore_errors=True)


def test_emits_of_large_values_fill_and_wrap_the_output_arena_without_waiting_forever(client, vertex):
    # A value's room was taken after its key's: when the value did not fit
    # before the arena's end nor before the key (not freed until the emit
    # was sent), the worker waited for room forever (here: 1 MiB arena,
    # 900 KB values after calls that left the arena's head mid-way).
    src, dst, gid = vertex
    client.dfg_apply(graph(gid, src, "EmitsMany", dst, arena_mb=1, call_timeout_s=20))
    for n, size in [(1, 900_000), (2, 600_000), (2, 900_000), (5, 1_000_000), (3, 300_000)]:
        client.trigger_put(f"{src}/{n}-{size}", f"{n},{size}")
        last = wait_for(f"{n} values of {size} bytes", lambda: get_or_none(client, f"{dst}/{n}-{size}/{n - 1}"))
        assert len(last.value) == size and bytes(last.value[:1]) == bytes([n - 1])
    assert status(client, gid)["failures"] == 0
