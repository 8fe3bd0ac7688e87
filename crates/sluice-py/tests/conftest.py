"""Fixtures: real `sluice serve` processes on 127.0.0.1 (a free port each),
found at $SLUICE_BIN or in the workspace's target directory."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def sluice_bin() -> str:
    env = os.environ.get("SLUICE_BIN")
    if env:
        return env
    for profile in ("debug", "release"):
        p = ROOT / "target" / profile / "sluice"
        if p.exists():
            return str(p)
    subprocess.run(["cargo", "build", "-q", "-p", "sluice-cli"], cwd=ROOT, check=True)
    return str(ROOT / "target" / "debug" / "sluice")


class Node:
    """One `sluice serve` process; `addr` once it listens."""

    def __init__(self, data_dir: Path, extra=()):
        self.data_dir = data_dir
        # Output goes to a file (a pipe nobody drains would block the node
        # and its lambdas' workers once full).
        self.log_path = data_dir.parent / (data_dir.name + ".log")
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sluice_bin(), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir), *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            # Python lambdas run in this interpreter (it has the test deps).
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn"), "SLUICE_PYTHON": sys.executable},
        )
        self.addr = None
        deadline = time.monotonic() + 30
        # The node prints one line when it listens (a condition, not a sleep).
        while time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"listening on (\S+)", self.log_path.read_text())
            if m:
                self.addr = m.group(1)
                break
            time.sleep(0.01)
        if self.addr is None:
            self.proc.kill()
            raise RuntimeError("sluice serve did not start:\n" + self.log_path.read_text())

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def node():
    # The data dir and its log (next to it) both in one directory removed after.
    d = Path(tempfile.mkdtemp(prefix="sluice-py-"))
    n = Node(d / "data")
    yield n
    n.stop()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def client(node):
    import sluice

    with sluice.Client(node.addr) as c:
        yield c
