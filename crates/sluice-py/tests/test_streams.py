"""Issue #18 from Python: streams across node processes (a broker and a
recording node), lazy and eager routing, expiry, the operators with a
controlled clock, the rate consumer's metrics, and the shared queue."""

import shutil
import tempfile
from pathlib import Path

import pytest

import sluice
from sluice.streams import (
    Aligner,
    Producer,
    RateConsumer,
    SharedQueue,
    Subscriber,
    Ticker,
    decode_tuple,
    realtime_accuracy,
)

from conftest import Node


@pytest.fixture(scope="module")
def edge():
    d = Path(tempfile.mkdtemp(prefix="sluice-py-edge-"))
    n = Node(d / "data")
    yield n
    n.stop()
    shutil.rmtree(d, ignore_errors=True)


def test_lazy_payloads_are_fetched_from_the_recording_node(client, edge):
    np = pytest.importorskip("numpy")
    cam = Producer(client, edge.addr, "pyroom", "cam", routing="lazy")
    mic = Producer(client, edge.addr, "pyroom", "mic", routing="eager")
    sub = Subscriber(client, "pyroom")
    frame = np.arange(1000, dtype=np.float32)
    h = cam.publish(frame, ts_us=5)
    assert (h.source, h.seq, h.ts_us, h.size, h.eager) == ("cam", 0, 5, 4000, False)
    assert h.node == edge.addr
    mic.publish(b"hello", ts_us=6)
    got = [sub.next(10), sub.next(10)]
    assert [g.source for g in got] == ["cam", "mic"]
    assert got[0].payload is None and bytes(got[1].payload) == b"hello"
    back = np.frombuffer(sub.fetch(got[0]), dtype=np.float32)
    assert (back == frame).all()
    assert bytes(sub.fetch(got[1])) == b"hello"
    assert sub.stats()["fetched"] == 1  # only the lazy payload moved


def test_expired_payload_is_a_typed_error_naming_the_item(client, edge):
    p = Producer(client, edge.addr, "pyexp", "s", keep_bytes=2500)
    first = p.publish(b"a" * 1000, ts_us=1)
    for _ in range(5):
        p.publish(b"b" * 1000)
    sub = Subscriber(client, "pyexp", from_ts_us=0)
    h = sub.next(10)
    assert h.seq == first.seq
    with pytest.raises(sluice.PayloadExpired) as e:
        sub.fetch(h)
    assert "payload of stream item pyexp/s #0" in str(e.value)
    assert e.value.details["stream_source"] == "s"


def test_aligner_and_ticker_with_a_controlled_clock():
    a = Aligner(["x", "y"], max_skew=10, fail_soft="partial")
    assert a.push("x", 100, "x1") == []
    [(ts, slots)] = a.push("y", 105, "y1")
    assert ts == 100 and slots == [("fresh", "x", 100, "x1"), ("fresh", "y", 105, "y1")]
    assert a.push("x", 200, "x2") == []
    [(ts, slots)] = a.advance(211)
    assert ts == 200 and slots == [("fresh", "x", 200, "x2"), None]

    # Section 5.2's shape: ticks every 10 from 0; the last known item of
    # each source at each tick, items overtaken between ticks skipped.
    t = Ticker(["x"], first=0, period=10)
    for ts in (1, 4, 7, 12):
        t.observe("x", ts, f"v{ts}")
    ticks = t.tick_until(20)
    assert [(ts, s[0][3] if s[0] else None) for ts, s in ticks] == [(0, None), (10, "v7"), (20, "v12")]
    assert (t.used, t.skipped) == (2, 2)
    assert realtime_accuracy([(10, "a"), (20, "b")], [(0, "a"), (15, "c")]) == 0.5


def test_the_operators_refuse_what_they_cannot_use():
    # An item of a source the aligner does not have vanished (push
    # returned []); a ticker kept such items pending for ever (memory that
    # only grew); duplicate or no sources, a zero period (a tick a
    # microsecond), negative times (OverflowError) were taken or failed
    # with the extension's words.
    a = Aligner(["x", "y"], max_skew=10)
    with pytest.raises(ValueError, match=r'"z" is not one of its sources \["x", "y"\]'):
        a.push("z", 1, "v")
    assert a.waiting == 0
    t = Ticker(["x"], first=0, period=10)
    with pytest.raises(ValueError, match=r'"z" is not one of its sources \["x"\]'):
        t.observe("z", 1, "v")
    for make in (lambda s: Aligner(s, 10), lambda s: Ticker(s, 0, 10)):
        with pytest.raises(ValueError, match='"x" twice'):
            make(["x", "x"])
        with pytest.raises(ValueError, match="at least one source"):
            make([])
    with pytest.raises(ValueError, match="period must be more than zero"):
        Ticker(["x"], 0, 0)
    with pytest.raises(ValueError, match="max_skew=-1 is negative"):
        Aligner(["x"], -1)
    with pytest.raises(ValueError, match="ts=-5 is negative"):
        a.push("x", -5, "v")
    with pytest.raises(ValueError, match="first=-1 is negative"):
        Ticker(["x"], -1, 10)
    # Ticks from 0 up to a wall-clock time in µs: 10^14 tuples, which
    # ran until memory ran out; refused, saying what is wrong.
    t = Ticker(["x"], first=0, period=10)
    with pytest.raises(ValueError, match="ticks due at once"):
        t.tick_until(1_700_000_000_000_000)
    assert len(t.tick_until(100)) == 11  # nothing was lost by the refusal


def test_streams_refuse_negative_counts_and_times(client, edge):
    with pytest.raises(ValueError, match="keep_for_s=-1 is negative"):
        Producer(client, edge.addr, "pyneg", "s", keep_for_s=-1)
    p = Producer(client, edge.addr, "pyneg", "s")
    with pytest.raises(ValueError, match="ts_us=-3 is negative"):
        p.publish(b"x", ts_us=-3)
    with pytest.raises(ValueError, match="from_ts_us=-1 is negative"):
        Subscriber(client, "pyneg", from_ts_us=-1)


def test_rate_consumer_skips_items_between_ticks_and_reports_metrics(client, edge):
    p = Producer(client, edge.addr, "pyrate", "s", routing="lazy")
    c = RateConsumer(client, "pyrate", ["s"], period_s=0.05)
    for i in range(20):
        p.publish(b"%d" % i)
    ts, slots = c.tick()
    while slots[0] is None or slots[0][1].seq < 19:
        ts, slots = c.tick()
    [payload] = c.payloads([slots[0][1]])
    assert bytes(payload) == b"19"
    c.predicted("x")
    c.truth(0, "x")
    m = c.metrics()
    assert m["fetched"] == 1, m  # one payload moved for 20 items
    assert m["skipped"] >= 1 and m["predictions"] == 1
    assert m["realtime_accuracy"] == 1.0


def test_shared_queue_each_item_to_one_consumer_and_redelivery(client):
    a = SharedQueue(client, "pyq", "a", lease_s=0.3)
    b = SharedQueue(client, "pyq", "b", lease_s=5)
    for i in range(3):
        a.push(b"job%d" % i)
    held = a.take(5)  # a takes one and never acknowledges it
    assert held.delivery == 1
    seen = {}
    while len(seen) < 3:
        d = b.take(10)
        assert d is not None
        seen[bytes(d.value)] = d.delivery
        b.ack(d)
    assert seen[bytes(held.value)] == 2 and sorted(seen.values()) == [1, 1, 2]
    assert b.redelivered == 1 and b.backlog() == 0
    with pytest.raises(sluice.VersionConflict):
        a.ack(held)  # its lease ran out; b took it over


def test_consumers_refuse_settings_that_cannot_work(client):
    # A zero period ticked without pause; no sources gave empty tuples
    # forever; a zero lease freed each item for others as it was taken.
    with pytest.raises(sluice.InvalidArgument, match="more than zero"):
        RateConsumer(client, "pyrate-bad", ["cam"], 0)
    with pytest.raises(sluice.InvalidArgument, match="at least one"):
        RateConsumer(client, "pyrate-bad", [], 0.1)
    pusher = SharedQueue(client, "pyq-bad", "a", lease_s=0)  # pushing needs no lease
    pusher.push(b"x")
    with pytest.raises(sluice.InvalidArgument, match="at least 1 ms"):
        pusher.take(1)
    assert SharedQueue(client, "pyq-bad", "b").take(5).value == b"x"
    q = SharedQueue(client, "pyq-repr", "a", lease_s=5)
    q.push(b"x")
    d = q.take(5)
    assert repr(d) == f'Delivery(id="{d.id}", delivery=1, {len(d.value)} bytes)'
    q.ack(d)


def test_the_ensemble_example_runs_on_node_processes():
    """examples/streams/ensemble.py end to end, shortened: both modes
    predict at the target frequency from four sensor nodes."""
    import json
    import subprocess
    import sys

    pytest.importorskip("sklearn")
    from conftest import ROOT, sluice_bin

    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/streams/ensemble.py"), "--freqs", "10",
         "--seconds", "1.5", "--json"],
        capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "SLUICE_BIN": sluice_bin()},
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["target_hz"], r["delay_ms"]) for r in rows] == [(10.0, 0), (10.0, 400)]
    for r in rows:
        for mode in ("centralized", "decentralized"):
            m = r[mode]
            assert m["predictions"] >= 5 and 5 <= m["frequency_hz"] <= 15, m
            assert m["skipped"] > 0 and m["fetched"] < m["received"], m
    assert rows[0]["decentralized"]["realtime_accuracy"] > 0.5
    # A late sensor holds the aligned centralized model back; the ensemble
    # lets one voter be late (the paper's Table 2 shape).
    delayed = rows[1]
    assert delayed["decentralized"]["realtime_accuracy"] > delayed["centralized"]["realtime_accuracy"]


def test_the_readme_streams_example_runs(node, edge, capsys):
    """README's Streams section: its Python block, against a broker and an
    edge node, on a topic of its own."""
    import re

    from test_readme import README

    text = README.read_text()
    section = text.split("\n## Streams from the edge", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    code = code.replace("127.0.0.1:7420", node.addr).replace("127.0.0.1:7421", edge.addr)
    exec(compile(code.replace('"room"', '"readme-room"'), "README streams", "exec"), {})
    out = capsys.readouterr().out
    assert f"cam 0 11 stays on {edge.addr}" in out and "b'frame bytes'" in out
    # Its graph, applied: a cam and a mic item 10 ms apart make a tuple.
    graph = re.findall(r"```json\n(.*?)```", section, re.S)[0]
    client = sluice.Client(node.addr)
    client.dfg_apply(graph.replace("/streams/room", "/streams/readme-dfg").replace('"room"', '"readme-dfg"'))
    w = client.watch("/trig/tuples")
    Producer(client, edge.addr, "readme-dfg", "cam").publish(b"c", ts_us=1_000_000)
    Producer(client, edge.addr, "readme-dfg", "mic", routing="eager").publish(b"m", ts_us=1_010_000)
    n = w.next(10)
    assert n is not None and n.key == "/trig/tuples/readme-dfg"
    ts, slots = decode_tuple(n.value)
    assert ts == 1_000_000 and [(st, h.source) for st, h in slots] == [("fresh", "cam"), ("fresh", "mic")]
    w.close()
    client.close()
