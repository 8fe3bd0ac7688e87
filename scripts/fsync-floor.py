#!/usr/bin/env python3
"""The fsync floor of a replicated persistent put on this machine (issue #20).

Each of 1, 2 and 3 processes appends 10 KB records to its own preallocated
file under DIR, fdatasync after each, 2000 times, and prints the median
latency of a write + fdatasync. One writer is a standalone fsync'd put's
disk cost; two or three writing at once is what a leader and its followers
pay when their log writes overlap on one shared disk (as in `sluice bench
persistent`, where the three members share this machine's disk).

    python3 scripts/fsync-floor.py /tmp      # DIR on the disk to measure
"""
import multiprocessing as mp
import os
import statistics
import sys
import time

RECORD = 10240
WRITES = 2000


def writer(path, q):
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    os.posix_fallocate(fd, 0, 64 << 20)
    os.fsync(fd)
    buf = b"x" * RECORD
    lat = []
    for i in range(WRITES):
        t = time.perf_counter()
        os.pwrite(fd, buf, i * RECORD)
        os.fdatasync(fd)
        lat.append((time.perf_counter() - t) * 1e6)
    os.close(fd)
    os.unlink(path)
    q.put(statistics.median(lat))


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
    for k in (1, 2, 3):
        q = mp.Queue()
        ps = [mp.Process(target=writer, args=(os.path.join(d, f"fsync-floor-{os.getpid()}-{j}"), q)) for j in range(k)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        medians = sorted(round(q.get()) for _ in ps)
        print(f"{k} writer(s) at once: p50 of a 10 KB write + fdatasync = {medians} µs")


if __name__ == "__main__":
    main()
