"""A Sluice Python lambda worker: one process of a node's pool for one DFG
vertex. Started and supervised by the node (`sluice_udls::python`); not
run by hand.

The node and this process share one memory region (a file the node
created and maps too) and two eventfds. The region holds a request ring
(node -> worker: upcalls, replies to store calls), a response ring
(worker -> node: emits, store calls, completions) and two arenas for the
bytes they refer to. An upcall's value is written once by the node and
read here in place (a memoryview of the mapping): no socket, no pickling.
A large trigger put's value is not even copied: the node reads its frame
from the socket into the vertex's landing area, which every worker of the
vertex maps read-only, and the upcall says where.
Emitted values are written once into the output arena; emitting the
input value itself (`emit(suffix, value)` with the very object received)
sends a reference to the bytes the node already holds.

Protocol version 1; the layout is mirrored in `sluice-udls/src/python.rs`.
"""

import importlib
import json
import mmap
import operator
import os
import select
import struct
import sys
import threading
import time
import traceback

MAGIC = b"SLUICEPW"
VERSION = 2
DESC = 128  # bytes per ring descriptor

# Header offsets (see python.rs).
H_REQ_HEAD, H_REQ_TAIL, H_RESP_HEAD, H_RESP_TAIL, H_OUT_FREE = 128, 192, 256, 320, 448
H_WORKER_SLEEPS = 512  # times this worker blocked for a request (the node reads it)

# Tracebacks of failed calls printed at once (and again after a quiet
# spell), then one per TRACEBACK_EVERY seconds: a lambda raising on every
# object wrote its traceback, several lines in the node's log, per object
# (the node counts every failure, with the last error: `sluice dfg ls`).
TRACEBACK_BURST, TRACEBACK_EVERY = 5.0, 10.0


class Throttle:
    """A token bucket: admit() is the number of tracebacks held back since
    the last one printed, or None to hold this one back too."""

    def __init__(self, burst=TRACEBACK_BURST, every=TRACEBACK_EVERY):
        self.burst, self.every = burst, every
        self.tokens, self.at, self.held = burst, time.monotonic(), 0

    def admit(self, now=None):
        now = time.monotonic() if now is None else now
        self.tokens = min(self.burst, self.tokens + (now - self.at) / self.every)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            held, self.held = self.held, 0
            return held
        self.held += 1
        return None


# Request kinds.
R_UPCALL, R_CTX_REPLY, R_STOP = 1, 2, 3
# Response kinds.
P_EMIT, P_DONE, P_FAIL, P_CTX_CALL = 1, 2, 3, 4
# Emit flags.
F_INPUT_VALUE = 1
# Upcall flags: the value lies in the vertex's landing area (the file the
# node names as this worker's fourth argument), where the node read it
# from the socket; else in the input arena.
F_LANDED = 2

# kind, flags, call_id, version, timestamp_us, worker_id, status,
# a_off, a_len, b_off, b_len, c_off, c_len  (a/b/c: key, pool, value or
# what the kind says), previous_version, previous_version_by_key, sender,
# sent_ns (when the writer published it: time.monotonic_ns, the node's
# CLOCK_MONOTONIC)
DESC_FMT = struct.Struct("<IIQQQIiQQQQQQQQIQ")

try:
    import numpy as np
except ImportError:  # the memoryview will do
    np = None

SPIN_S = float(os.environ.get("SLUICE_WORKER_SPIN_US", "1000")) / 1e6  # the vertex's worker_spin_us
# After a wake that found no request (a large value still arriving at the
# node, which woke this worker early): how long to poll for it, yielding
# the CPU to whatever receives the value.
PREWAKE_S = float(os.environ.get("SLUICE_WORKER_PREWAKE_US", "2000")) / 1e6


class StoreError(Exception):
    """A store call from a lambda failed on the node (the message says why).
    ``kind`` names the error as the client's exceptions do (``"not_found"``,
    ``"no_pool"``, ``"version_conflict"``, ...; ``None`` when the node gave
    none) and ``details`` holds its fields (``key``, ...)."""

    def __init__(self, message, details=None):
        super().__init__(message)
        self.details = details if isinstance(details, dict) else {}
        self.kind = self.details.get("error")


class Region:
    def __init__(self, path):
        fd = os.open(path, os.O_RDWR)
        size = os.fstat(fd).st_size
        self.m = mmap.mmap(fd, size)
        # Kept to reserve the output arena's pages before writing them
        # (`out_alloc`): the file is sparse, in tmpfs, and a write to a page
        # /dev/shm has no room for is a SIGBUS.
        self.fd = fd
        self.out_reserved = 0  # bytes of the output arena reserved
        self.mv = memoryview(self.m)
        if bytes(self.mv[0:8]) != MAGIC:
            raise SystemExit(f"{path}: not a Sluice worker region")
        (version,) = struct.unpack_from("<I", self.m, 8)
        if version != VERSION:
            raise SystemExit(f"{path}: protocol version {version}, this worker speaks {VERSION}")
        (
            self.req_off,
            self.req_slots,
            self.resp_off,
            self.resp_slots,
            self.in_off,
            self.in_len,
            self.out_off,
            self.out_len,
        ) = struct.unpack_from("<QQQQQQQQ", self.m, 16)
        self.out_head = 0  # bytes allocated in the output arena (monotonic)
        # The ring indexes as native 8-byte words: one load or store each.
        # (`struct.pack_into` zeroes a field and then writes it a byte at a
        # time, so the node could read a head of 0 or of its low bytes
        # alone, take slots not yet written for published ones, and run
        # ahead of this worker.)
        self.words = self.mv[: self.req_off].cast("Q")  # the header (the rings follow it)

    def u64(self, off):
        return self.words[off >> 3]

    def set_u64(self, off, v):
        self.words[off >> 3] = v

    def out_alloc(self, n):
        """Space for `n` bytes in the output arena (contiguous; skips the
        tail end when it does not fit), waiting for the node to free."""
        if n > self.out_len:
            raise ValueError(
                f"an emitted value of {n} bytes (with its key) exceeds the worker's output arena"
                f" ({self.out_len} bytes: arena_mb)"
            )
        head = self.out_head
        start = head
        pos = start % self.out_len
        if pos + n > self.out_len:
            start += self.out_len - pos  # wrap: the gap is freed with this allocation
        end = start + n
        self.out_reserve(start % self.out_len + n)
        # Room once the bytes not yet freed end far enough back, or once
        # none are left (the skipped gap then holds nothing either).
        while True:
            free = self.u64(H_OUT_FREE)
            if end - free <= self.out_len or free == head:
                break
            time.sleep(0)
        self.out_head = end
        return self.out_off + start % self.out_len

    def out_reserve(self, top):
        """Reserves the output arena's pages below `top` (bytes into it), a
        MiB at a time: a full /dev/shm is then an error for this emit, not a
        SIGBUS that kills the worker."""
        if top <= self.out_reserved:
            return
        want = min(self.out_len, (top + (1 << 20) - 1) & ~((1 << 20) - 1))
        try:
            os.posix_fallocate(self.fd, self.out_off + self.out_reserved, want - self.out_reserved)
        except OSError as e:
            raise MemoryError(
                f"no room for the Python lambda's shared memory in /dev/shm ({e.strerror}): a"
                " container's /dev/shm is 64 MB unless it is given more (`docker run"
                " --shm-size=1g`); or lower the vertex's arena_mb, landing_mb or workers"
            ) from None
        self.out_reserved = want


def holds_objects(fmt):
    """Whether a buffer's struct format has an item that is a Python object
    reference (`O`: a NumPy array of dtype=object, or such a field of a
    structured one); field names (`:name:`) are skipped."""
    in_name = False
    for ch in fmt:
        if ch == ":":
            in_name = not in_name
        elif ch == "O" and not in_name:
            return True
    return False


def map_landing(path):
    """The vertex's landing area, read-only: a lambda reads landed values
    in place and can write none (the area holds the vertex's incoming
    values, and the node lends its ranges)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return memoryview(mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ))
    finally:
        os.close(fd)


class Worker:
    def __init__(self, region, to_worker, to_node, udl, landing=None):
        self.landing = landing  # memoryview of the landing area, or None
        self.r = region
        self.to_worker = to_worker
        self.to_node = to_node
        self.udl = udl
        self.call_id = 0
        self.input = None  # the current upcall's value (memoryview)
        self.gap_ewma = 0.0  # recent wait for a request by the node's stamps, seconds
        self.parent = os.getppid()
        self.input_range = (0, 0)
        # The thread that runs the lambda, and whether a call is running:
        # emits and store calls belong to one call (the node reads them as
        # that call's), so any other time they are refused.
        self.runner = threading.get_ident()
        self.in_call = False
        self.tracebacks = Throttle()

    def in_this_call(self, what):
        """Refuses `what` (an emit, a store call) outside the running call:
        from another thread (its writes to the ring would interleave with
        the lambda's), or after the call returned (the node would take it
        for a later call's, or drop it)."""
        if self.in_call and threading.get_ident() == self.runner:
            return
        when = "after its call returned" if threading.get_ident() == self.runner or not self.in_call else "from another thread"
        raise RuntimeError(
            f"{what} {when}: emit and context calls are valid only on the thread that runs"
            " ocdpo_handler, while it runs (to emit what a thread computed, wait for it in the handler)"
        )

    # -- rings ---------------------------------------------------------------
    def spin_budget(self):
        """How long to spin for the next request (as the node does for
        answers, `Proc::spin_budget`): the budget (the vertex's
        `worker_spin_us`) while the recent requests came within it on
        average, else nothing. A request's wait counts up to the node's
        stamp on it, not up to when this worker saw it: blocked, it sees one
        only when its eventfd wakes it, and a slow wake-up must not pass for
        requests far apart (that kept workers blocking for good on a loaded
        machine)."""
        return SPIN_S if self.gap_ewma < SPIN_S else 0.0

    def count_wait(self, t0_ns, sent_ns):
        self.gap_ewma = 0.8 * self.gap_ewma + 0.2 * max(0, sent_ns - t0_ns) / 1e9

    def next_request(self):
        r = self.r
        tail = r.u64(H_REQ_TAIL)
        t0 = time.perf_counter()
        t0_ns = time.monotonic_ns()
        # Spin only while requests have been arriving within the budget
        # (when they are further apart, spinning only burns a core).
        spin = self.spin_budget()
        spin_until = t0 + spin
        yielding = False
        slept = False
        while r.u64(H_REQ_HEAD) == tail:
            if yielding:
                os.sched_yield()  # a value in transit: leave the CPU to its receiver
            if time.perf_counter() > spin_until:
                if not slept:
                    slept = True
                    r.set_u64(H_WORKER_SLEEPS, r.u64(H_WORKER_SLEEPS) + 1)
                # Block until the node signals; every second, check that
                # the node still lives (a worker never outlives it).
                if select.select([self.to_worker], [], [], 1.0)[0]:
                    os.eventfd_read(self.to_worker)
                    # Signalled: the request is in, or (a large value still
                    # arriving at the node) about to be: poll for it.
                    spin_until = time.perf_counter() + PREWAKE_S
                    yielding = True
                    continue
                elif os.getppid() != self.parent:
                    sys.exit(0)
                spin_until = time.perf_counter() + spin
        off = r.req_off + (tail % r.req_slots) * DESC
        d = DESC_FMT.unpack_from(r.m, off)
        r.set_u64(H_REQ_TAIL, tail + 1)
        self.count_wait(t0_ns, d[16])
        return d

    def respond(self, kind, flags=0, status=0, a=(0, 0), b=(0, 0), c=(0, 0)):
        r = self.r
        head = r.u64(H_RESP_HEAD)
        while head - r.u64(H_RESP_TAIL) >= r.resp_slots:
            time.sleep(0)  # the node drains continuously
        off = r.resp_off + (head % r.resp_slots) * DESC
        # `out_head` lets the node free what it has read of the arena.
        DESC_FMT.pack_into(
            r.m, off, kind, flags, self.call_id, r.out_head, 0, 0, status, a[0], a[1], b[0], b[1], c[0], c[1], 0, 0, 0,
            time.monotonic_ns(),
        )
        r.set_u64(H_RESP_HEAD, head + 1)
        os.eventfd_write(self.to_node, 1)

    def put_out(self, data):
        """Copies `data` (bytes-like; a strided view in C order, as
        `tobytes()` gives it) into the output arena; its (offset, len)."""
        return self.put_out_all(data)[0]

    def put_out_all(self, *parts):
        """Copies `parts` into one block of the output arena (an emit's key
        and value, a store call's arguments and value), their (offset, len)
        each. One block: the node frees a message's bytes only once it has
        the message, so a value allocated apart from its key could wait for
        room that only the key's own release would make."""
        views = [self.out_view(d) for d in parts]
        off = self.r.out_alloc(sum(mv.nbytes for mv in views))
        ranges = []
        for mv in views:
            n = mv.nbytes
            self.r.mv[off : off + n] = mv
            ranges.append((off, n))
            off += n
        return ranges

    def out_view(self, data):
        """`data` as a flat view of bytes, refused when it is not data."""
        try:
            mv = memoryview(data)
        except TypeError:
            raise TypeError(
                "a value must be bytes-like (bytes, bytearray, memoryview, a NumPy array) or str,"
                f" not {type(data).__name__}"
            ) from None
        if holds_objects(mv.format):
            raise TypeError(
                "a value must be data, not Python objects: this buffer holds object references"
                f" (format {mv.format!r}), whose bytes are addresses in the worker;"
                " convert it to a numeric array or to bytes first (e.g. pickle.dumps)"
            )
        if not mv.c_contiguous:
            mv = memoryview(mv.tobytes())
        elif not isinstance(data, (bytes, bytearray)):
            mv = mv.cast("B")
        return mv

    # -- what a lambda can do ---------------------------------------------------
    def emit(self, key_suffix, value):
        self.in_this_call("emit()")
        if isinstance(key_suffix, str):
            key_suffix = key_suffix.encode()
        if value is self.input:
            k = self.put_out(key_suffix)
            self.respond(P_EMIT, flags=F_INPUT_VALUE, a=k, b=self.input_range)
            return
        if isinstance(value, str):
            value = value.encode()
        k, v = self.put_out_all(key_suffix, value)
        self.respond(P_EMIT, a=k, b=v)

    def store_call(self, op, args, value=None):
        self.in_this_call(f"context.{op}()")
        a, b = self.put_out_all(json.dumps({"op": op, **args}).encode(), value if value is not None else b"")
        self.respond(P_CTX_CALL, a=a, b=b)
        # The node answers before anything else for this worker.
        while True:
            d = self.next_request()
            kind, status = d[0], d[6]
            if kind == R_CTX_REPLY:
                meta_off, meta_len, val_off, val_len = d[7], d[8], d[9], d[10]
                meta = json.loads(bytes(self.r.mv[meta_off : meta_off + meta_len]) or b"null")
                if status != 0:
                    if not isinstance(meta, dict):
                        raise StoreError(str(meta))
                    raise StoreError(meta.get("message", "store call failed"), meta.get("error"))
                return meta, self.r.mv[val_off : val_off + val_len]
            if kind == R_STOP:
                sys.exit(0)

    # -- the loop ------------------------------------------------------------------
    def run(self):
        r = self.r
        while True:
            d = self.next_request()
            kind = d[0]
            if kind == R_STOP:
                return
            if kind != R_UPCALL:
                continue
            (_, flags, call_id, version, ts, worker_id, _, k_off, k_len, p_off, p_len, v_off, v_len, prev, prev_key, sender, _) = d
            self.call_id = call_id
            key = bytes(r.mv[k_off : k_off + k_len]).decode()
            pool, _, vertex = bytes(r.mv[p_off : p_off + p_len]).decode().partition("\0")
            where = self.landing if flags & F_LANDED else r.mv
            value = where[v_off : v_off + v_len]
            # Cascade hands a NumPy uint8 array over the bytes; so do we when
            # NumPy is there (a view: no copy), else the memoryview.
            blob = value if np is None else np.frombuffer(value, dtype=np.uint8)
            self.input = blob
            self.input_range = (v_off, v_len)
            self.in_call = True
            try:
                self.udl.ocdpo_handler(
                    sender=sender,
                    pathname=pool,
                    vertex=vertex,
                    key_suffix=key[len(vertex):] if key.startswith(vertex) else key,
                    key=key,
                    version=version,
                    timestamp_us=ts,
                    previous_version=prev,
                    previous_version_by_key=prev_key,
                    blob=blob,
                    worker_id=worker_id,
                    emit=self.emit,
                    context=self.context,
                    cuda_pinned=self.cuda_pinned,
                )
                self.in_call = False
                self.input = None
                del blob
                try:
                    value.release()
                except BufferError:
                    pass  # the lambda kept a view: valid until the next upcall
                self.respond(P_DONE)
            except SystemExit:
                raise
            except BaseException as e:  # noqa: BLE001 (reported to the node)
                self.in_call = False
                self.input = None
                msg = f"{type(e).__name__}: {e}"
                held = self.tracebacks.admit()
                if held is not None:
                    tb = traceback.format_exc(limit=8)
                    more = f"; {held} failed calls since the last traceback printed" if held else ""
                    print(f"sluice python worker: {msg} (key {key}{more})\n{tb}", file=sys.stderr, flush=True)
                self.respond(P_FAIL, a=self.put_out(msg.encode()))


def _unsigned(name, v):
    """`v` as a whole number of at least 0 (None stays None), else the
    error the client raises for it: a version or time the node cannot
    read must not be taken for "the latest"."""
    if v is None:
        return None
    try:
        n = operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(v).__name__}") from None
    if n < 0:
        raise ValueError(f"{name}={n!r} is negative")
    return n


class Context:
    """Store access for a lambda (on its node): get (latest, by version or
    time), put, trigger_put, list_keys. Values come back as memoryviews
    valid until the lambda returns (copy with bytes() to keep one)."""

    def __init__(self, worker):
        self._w = worker

    def get(self, key, *, version=None, timestamp_us=None):
        version, timestamp_us = _unsigned("version", version), _unsigned("timestamp_us", timestamp_us)
        if version is not None and timestamp_us is not None:
            # One of them would be ignored (as the client refuses it).
            raise ValueError("give version or timestamp_us, not both")
        meta, value = self._w.store_call("get", {"key": key, "version": version, "timestamp_us": timestamp_us})
        return value, meta

    def put(self, key, value):
        meta, _ = self._w.store_call("put", {"key": key}, value if not isinstance(value, str) else value.encode())
        return meta["version"], meta["timestamp_us"]

    def trigger_put(self, key, value):
        meta, _ = self._w.store_call("trigger_put", {"key": key}, value if not isinstance(value, str) else value.encode())
        return meta["timestamp_us"]

    def list_keys(self, pool, prefix=None):
        meta, _ = self._w.store_call("list_keys", {"pool": pool, "prefix": prefix})
        return meta["keys"]


def pin_for_cuda(region):
    """Registers the whole region with CUDA as page-locked memory, so a
    host-to-device copy of an object (``torch.from_numpy(blob).to("cuda",
    non_blocking=True)``) runs at pinned speed with no staging copy. Returns
    None, or why it could not."""
    try:
        import ctypes

        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    buf = (ctypes.c_char * len(region.m)).from_buffer(region.m)
    region.pinned_buf = buf  # keeps the export (and the registration) alive
    err = torch.cuda.cudart().cudaHostRegister(ctypes.addressof(buf), len(region.m), 0)
    code = getattr(err, "value", err)
    return None if code == 0 else f"cudaHostRegister failed ({err})"


def load(spec):
    for p in spec.get("python_path", []) or []:
        sys.path.insert(0, p)
    try:
        module = importlib.import_module(spec["module"])
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] != spec["module"].split(".")[0]:
            # Found, but it imports what this interpreter lacks (numpy,
            # torch): the node's python3 is rarely the user's venv.
            raise ModuleNotFoundError(
                f"{e}: {spec['module']} imports it and {sys.executable} does not have it; install it"
                ' there, or name an interpreter that has it ("python" in the vertex\'s config, or'
                " SLUICE_PYTHON in the node's environment)"
            ) from e
        paths = spec.get("python_path") or []
        missing = [p for p in paths if not os.path.isdir(p)]
        where = f"python_path {paths}" + (f", of which {missing} are not directories here (cwd {os.getcwd()})" if missing else "")
        raise ModuleNotFoundError(f"{e} (looked in {where}, then the interpreter's own path)") from e
    cls = getattr(module, spec["entry_class"])
    # As Cascade does: the vertex's configuration, as a JSON string.
    udl = cls(json.dumps(spec.get("config")))
    if not callable(getattr(udl, "ocdpo_handler", None)):
        # Found now, not as a failure of every call.
        raise TypeError(
            f"{spec['module']}.{spec['entry_class']} has no ocdpo_handler method"
            " (a lambda's class defines ocdpo_handler(self, **kwargs), called once per object)"
        )
    return udl


def exit_with_node():
    """Ends this worker when the node that started it ends (a crash, a
    SIGKILL, a shutdown), even while a call is stuck in a loop or a
    sleep: a thread waits on the node's pidfd (else looks every second).
    The loop's own check runs only between calls."""
    # The node's pid, from the node: one that died before this line ran
    # left this process another parent already.
    parent = int(os.environ.get("SLUICE_NODE_PID") or os.getppid())

    def wait():
        try:
            fd = os.pidfd_open(parent)
            select.select([fd], [], [])
        except (AttributeError, OSError):
            while os.getppid() == parent:
                time.sleep(1.0)
        os._exit(0)

    # Before the class loads: a node that dies while it loads ends it too.
    threading.Thread(target=wait, name="sluice-node-watch", daemon=True).start()


def main():
    exit_with_node()
    region_path, to_worker, to_node = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    spec = json.loads(os.environ["SLUICE_UDL_SPEC"])
    region = Region(region_path)
    landing = map_landing(sys.argv[4]) if len(sys.argv) > 4 else None
    w = Worker(region, to_worker, to_node, None, landing)
    try:
        udl = load(spec)
    except BaseException as e:  # noqa: BLE001 (the node reports it: dfg apply fails)
        tb = traceback.format_exc(limit=4)
        w.respond(P_FAIL, a=w.put_out(f"loading {spec.get('module')}.{spec.get('entry_class')}: {type(e).__name__}: {e}\n{tb}".encode()))
        sys.exit(1)
    w.udl = udl
    w.context = Context(w)
    w.cuda_pinned = False
    if (spec.get("config") or {}).get("pin_cuda"):
        why = pin_for_cuda(region)
        w.cuda_pinned = why is None
        if why is not None:
            print(f"sluice python worker: shared region not pinned for CUDA: {why}", file=sys.stderr, flush=True)
    # Also reachable as attributes, as Cascade's UserDefinedLogic has them.
    for name, v in (("emit", w.emit), ("context", w.context)):
        if not hasattr(udl, name):
            setattr(udl, name, v)
    # Ready: the node waits for this before sending upcalls.
    w.respond(P_DONE)
    w.run()


if __name__ == "__main__":
    main()
