"""The Python worker's side of the rings (`sluice_worker.py`, which the node
writes out and runs), driven here over a region file of its layout with no
node: what a worker does with requests as they arrive."""

import os
import struct
import sys
import threading
import time
from pathlib import Path

import pytest

if not hasattr(os, "eventfd"):
    pytest.skip("the worker needs Linux's eventfd", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sluice-udls" / "python"))
import sluice_worker as sw  # noqa: E402


@pytest.fixture
def worker(tmp_path):
    slots, arena = 64, 1 << 16
    req = 4096
    resp = req + slots * sw.DESC
    inp = resp + slots * sw.DESC
    out = inp + arena
    path = tmp_path / "worker-0.shm"
    with open(path, "wb") as f:
        f.truncate(out + arena)
        f.write(sw.MAGIC + struct.pack("<I", sw.VERSION))
        f.seek(16)
        f.write(struct.pack("<QQQQQQQQ", req, slots, resp, slots, inp, arena, out, arena))
    to_worker, to_node = os.eventfd(0), os.eventfd(0)
    w = sw.Worker(sw.Region(str(path)), to_worker, to_node, None)
    yield w
    os.close(to_worker)
    os.close(to_node)


def request(w, i, delay_s, sent_ns=None):
    """Request `i` written by a thread `delay_s` from now (stamped `sent_ns`,
    else when written), published and signalled, as the node does; the
    descriptor the worker takes."""
    r = w.r
    failed = []

    def node():
        time.sleep(delay_s)
        fields = [0] * len(sw.DESC_FMT.unpack_from(bytes(sw.DESC)))
        fields[0], fields[2] = sw.R_UPCALL, i + 1
        fields[-1] = sent_ns if sent_ns is not None else time.monotonic_ns()
        at = r.req_off + (i % r.req_slots) * sw.DESC
        try:
            sw.DESC_FMT.pack_into(r.m, at, *fields)
        except struct.error as e:  # a layout without the stamp: stop the worker's wait
            failed.append(e)
            sw.DESC_FMT.pack_into(r.m, at, sw.R_STOP, *[0] * (len(fields) - 1))
        r.set_u64(sw.H_REQ_HEAD, i + 1)
        os.eventfd_write(w.to_worker, 1)

    t = threading.Thread(target=node)
    t.start()
    d = w.next_request()
    t.join()
    assert not failed, f"the request could not be written: {failed}"
    assert (d[0], d[2]) == (sw.R_UPCALL, i + 1)
    return d


def test_requests_sent_soon_bring_spinning_back_however_late_they_are_seen(worker):
    """A worker that stopped spinning (requests came far apart) spins
    again once they come close together, however late it sees them:
    blocked, it learns of a request only when its eventfd wakes it, and on
    a loaded machine that wake-up alone can outlast the spin budget.
    Measured up to when it saw the request, that wait kept the worker
    blocking for good: `sluice bench python-udl` fell into a slow mode
    (two eventfd wake-ups a call) for whole runs."""
    i = 0
    # Requests 5 ms apart: spinning for them is waste, and it stops within
    # a few (a few more where this thread lost the CPU for longer than
    # the writer's 5 ms before it started waiting, which reads as no wait).
    while worker.spin_budget() > 0 and i < 40:
        request(worker, i, 0.005)
        i += 1
    assert worker.spin_budget() == 0
    # Sent at once, seen 2 ms later (a slow wake-up): the worker spins
    # again within a few (the average decays).
    while worker.spin_budget() == 0 and i < 40:
        request(worker, i, 0.002, sent_ns=time.monotonic_ns())
        i += 1
    assert worker.spin_budget() == sw.SPIN_S > 0
