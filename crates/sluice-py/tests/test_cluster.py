"""The Python client against a 3-node cluster of real processes: writes
follow the leader when it is killed, reads stay stable, nothing
acknowledged is lost."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import sluice
from conftest import sluice_bin


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except (sluice.SluiceError, subprocess.CalledProcessError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Cluster:
    def __init__(self, n=3):
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-py-cluster-"))
        self.addrs = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        members = ", ".join(str(i) for i in range(n))
        layout = "version = 1\n"
        for i, a in enumerate(self.addrs):
            layout += f'\n[[nodes]]\nid = {i}\naddress = "{a}"\n'
        layout += f"\n[[subgroups.volatile]]\nshards = [[{members}]]\n"
        layout += f"\n[[subgroups.trigger]]\nshards = [[{members}]]\n"
        self.layout = self.dir / "layout.toml"
        self.layout.write_text(layout)
        self.procs = {}
        for i in range(n):
            self.start(i)

    def start(self, i):
        # Volatile logs under the test's directory, not /dev/shm.
        cfg = self.dir / f"node-{i}.toml"
        cfg.write_text(f'[cluster]\nvolatile_dir = "{self.dir / f"volatile-{i}"}"\n')
        log = open(self.dir / f"node-{i}.log", "a")
        self.procs[i] = subprocess.Popen(
            [sluice_bin(), "serve", "--config", str(cfg), "--cluster", str(self.layout),
             "--node-id", str(i), "--data-dir", str(self.dir / f"node-{i}")],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": "warn"},
        )

    def status(self, i):
        out = subprocess.run(
            [sluice_bin(), "--json", "--addr", self.addrs[i], "cluster", "status"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout
        return json.loads(out)

    def leader(self, group="volatile/0/0"):
        for i in self.procs:
            if self.procs[i].poll() is not None:
                continue
            try:
                st = self.status(i)
            except subprocess.CalledProcessError:
                continue
            for node in st["nodes"]:
                for g in node.get("groups", []):
                    if g["group"] == group and g["leader"] is not None and node.get("node") == g["leader"]:
                        return g["leader"]
        return None

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self):
        return "\n".join((self.dir / f"node-{i}.log").read_text() for i in self.procs)


@pytest.fixture
def cluster():
    c = Cluster()
    yield c
    c.stop()


def test_writes_follow_a_killed_leader_and_nothing_acknowledged_is_lost(cluster):
    wait_for("a leader", lambda: cluster.leader() is not None)
    c = sluice.Client(",".join(cluster.addrs), timeout=20)
    assert c.cluster_epoch is not None
    acked = {}
    for i in range(50):
        acked[f"/vol/f/{i}"] = c.put(f"/vol/f/{i}", f"v{i}").version
    leader = cluster.leader()
    cluster.procs[leader].send_signal(signal.SIGKILL)
    cluster.procs[leader].wait()
    # The next writes go to the new leader (the client finds it).
    t0 = time.monotonic()
    for i in range(50, 100):
        acked[f"/vol/f/{i}"] = c.put(f"/vol/f/{i}", f"v{i}").version
    assert time.monotonic() - t0 < 15, cluster.logs()
    new = cluster.leader()
    assert new is not None and new != leader
    for k, v in acked.items():
        o = c.get(k, linearizable=True)
        assert o.value == f"v{k.rsplit('/', 1)[1]}".encode() and o.version == v
    # The killed node comes back and catches up.
    cluster.start(leader)
    wait_for(
        "the old leader to rejoin",
        lambda: sluice.Client(cluster.addrs[leader]).stats() is not None,
    )


def test_broadcast_reaches_every_node_and_reports_each(cluster):
    wait_for("a leader", lambda: cluster.leader() is not None)
    c = sluice.Client(",".join(cluster.addrs), timeout=20)
    model = bytes(range(256)) * 4096  # 1 MiB
    c.put("/vol/model", model)
    r = c.broadcast("/vol/model")
    assert r["ok"] == 2 and r["bytes"] == len(model), r
    assert sorted(o["node"] for o in r["outcomes"]) == sorted(r["order"])
    assert all(o["error"] is None for o in r["outcomes"]), r
    with pytest.raises(sluice.InvalidArgument):
        c.broadcast("/vol/model", to=[99])
    # A receiver named twice got the object twice, the second copy failing
    # there ("chunk ... without its start") and the command with it.
    others = sorted(r["order"])
    with pytest.raises(sluice.InvalidArgument, match=f"node {others[0]} is named twice"):
        c.broadcast("/vol/model", to=[others[0], others[0]])
    with pytest.raises(sluice.InvalidArgument, match="fanout 0"):
        c.broadcast("/vol/model", fanout=0)


def test_dfg_apply_returns_once_every_node_has_loaded_its_python_lambdas(cluster):
    # Each node's workers take 4 s to import the lambda's module, longer
    # than the 3 s a node waits for the others; the apply answered with
    # nodes still loading, and trigger puts those nodes took meanwhile
    # ran no lambda (lost).
    wait_for("a leader", lambda: cluster.leader() is not None)
    c = sluice.Client(",".join(cluster.addrs), timeout=40)
    udls = str(Path(__file__).parent / "udls")
    graph = [{"id": "slow", "graph": [{
        "pathname": "/trig/slow",
        "user_defined_logic_list": ["python"],
        "user_defined_logic_config_list": [{
            "python_path": [udls], "module": "slow_import", "entry_class": "Echo", "python": sys.executable,
        }],
        "destinations": [{"/vol/slow-out": "put"}],
    }]}]
    t0 = time.monotonic()
    r = c.dfg_apply(json.dumps(graph))
    assert r["pending_nodes"] == [], r
    assert time.monotonic() - t0 < 40
    n = 30
    for i in range(n):
        c.trigger_put(f"/trig/slow/{i}", f"v{i}")
    # Every one reached a running lambda, on whichever node took it.
    wait_for(f"{n} outputs", lambda: all(_has(c, f"/vol/slow-out/{i}") for i in range(n)), timeout=20)
    c.dfg_remove("slow")


def test_a_put_of_new_code_and_an_apply_upgrade_every_node(cluster):
    # Re-applying an unchanged graph after a put of new code to its
    # `code_key` (the README's upgrade) changed nothing on a cluster: each
    # node compared the graph's JSON, the same, and kept the old workers.
    wait_for("a leader", lambda: cluster.leader() is not None)
    c = sluice.Client(",".join(cluster.addrs), timeout=20)
    src = ("class Tag:\n    def __init__(self, conf): pass\n"
           "    def ocdpo_handler(self, key_suffix, blob, emit, **kw):\n"
           "        emit(key_suffix, b'v1:' + bytes(blob))\n")
    c.put("/vol/code/tag", src)
    graph = json.dumps([{"id": "tag", "graph": [{
        "pathname": "/trig/tag", "user_defined_logic_list": ["python"],
        "user_defined_logic_config_list": [{
            "code_key": "/vol/code/tag", "module": "tag", "entry_class": "Tag", "python": sys.executable,
        }],
        "destinations": [{"/vol/tag-out": "put"}],
    }]}])
    on = [sluice.Client(a, timeout=20) for a in cluster.addrs]

    def outputs(tag):
        # A trigger put runs the lambda on the node that takes it: one per node.
        for i, n in enumerate(on):
            n.trigger_put(f"/trig/tag/{tag}{i}", b"x")
        wait_for(f"{tag} outputs", lambda: all(_has(c, f"/vol/tag-out/{tag}{i}") for i in range(len(on))))
        return {bytes(c.get(f"/vol/tag-out/{tag}{i}").value) for i in range(len(on))}

    first = c.dfg_apply(graph)
    assert first["applied"] == ["tag"] and first["pending_nodes"] == [], first
    assert outputs("a") == {b"v1:x"}
    c.put("/vol/code/tag", src.replace("v1:", "v2:"))
    r = c.dfg_apply(graph)
    assert r["applied"] == ["tag"] and r["pending_nodes"] == [], r
    assert outputs("b") == {b"v2:x"}
    # `only_changed` leaves a graph that runs as given alone: new code
    # waits for the next full apply.
    c.put("/vol/code/tag", src.replace("v1:", "v3:"))
    only = json.dumps({"graphs": json.loads(graph), "only_changed": True})
    r = c.dfg_apply(only)
    assert r["applied"] == [] and r["unchanged"] == ["tag"], r
    assert outputs("c") == {b"v2:x"}
    c.dfg_remove("tag")


def _has(c, key):
    try:
        c.get(key)
        return True
    except sluice.NotFound:
        return False


def test_a_watch_whose_node_dies_raises_instead_of_ending_quietly(cluster):
    # It returned None, as a closed watch (or a timeout) does: a `for n in
    # watch` loop just ended, and a callback watch stopped unseen.
    wait_for("a leader", lambda: cluster.leader() is not None)
    c = sluice.Client(cluster.addrs[2], timeout=10)
    w = c.watch("/vol/wd")
    seen = []
    cb = c.watch("/vol/wd", callback=seen.append)
    c.put("/vol/wd/1", b"a")
    n = w.next(timeout=10)
    assert n is not None and n.key == "/vol/wd/1"
    wait_for("the callback's notification", lambda: len(seen) == 1)
    cluster.procs[2].send_signal(signal.SIGKILL)
    cluster.procs[2].wait()
    with pytest.raises(sluice.ConnectionError, match="the watch on \"/vol/wd\" ended"):
        w.next(timeout=10)
    wait_for("the callback watch's error", lambda: isinstance(cb.error, sluice.ConnectionError))
    # A watch closed by its owner still ends quietly.
    c2 = sluice.Client(cluster.addrs[0], timeout=10)
    w2 = c2.watch("/vol/wd")
    w2.close()
    assert w2.next(timeout=1) is None
