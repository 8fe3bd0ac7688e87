"""Python lambdas the tests deploy (Cascade's shape: a class built from the
vertex's JSON config, `ocdpo_handler(**kwargs)`)."""

import json
import os
import sys
import threading
import time


class Upper:
    """Emits the value upper-cased under the same key suffix."""

    def __init__(self, conf):
        self.conf = json.loads(conf)

    def ocdpo_handler(self, **kw):
        suffix = kw["key"][len(kw["pathname"]):]
        kw["emit"](suffix, bytes(kw["blob"]).upper())


class Lower(Upper):
    def ocdpo_handler(self, **kw):
        suffix = kw["key"][len(kw["pathname"]):]
        kw["emit"](suffix, bytes(kw["blob"]).lower())


class Echo:
    """Emits the object it was given, unchanged (no copy back)."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, **kw):
        self.emit(kw["key"][len(kw["pathname"]):], kw["blob"])


class Strided:
    """Emits every other byte of its value and stores the others: strided
    NumPy views, not contiguous buffers."""

    def __init__(self, conf):
        self.side = json.loads(conf)["side"]

    def ocdpo_handler(self, key, pathname, blob, context, emit, **kw):
        context.put(self.side + key[len(pathname):], blob[1::2])
        emit(key[len(pathname):], blob[::2])


class StoreUser:
    """Reads, writes and lists through the node's store."""

    def __init__(self, conf):
        self.side = json.loads(conf)["side"]

    def ocdpo_handler(self, key, pathname, blob, context, emit, **kw):
        value, meta = context.get(self.side + "/config")
        version, _ = context.put(self.side + "/seen" + key[len(pathname):], blob)
        keys = context.list_keys(self.side.rsplit("/", 1)[0] or "/", prefix=self.side + "/seen")
        try:
            context.get(self.side + "/absent")
            missing = "found"
        except Exception as e:  # noqa: BLE001 (the worker's StoreError)
            missing = f"{type(e).__name__}/{e.kind}/{e.details.get('key') == self.side + '/absent'}"
        emit(
            key[len(pathname):],
            f"{bytes(value).decode()}:{len(keys)}:{version > 0}:{meta['version'] > 0}:{missing}",
        )


class NoHandler:
    """A class without an ocdpo_handler (a typo, say)."""

    def __init__(self, conf):
        pass

    def ocdpo_handle(self, **kw):
        pass


class Faulty:
    """Raises for keys with `raise` in them, dies for keys with `crash`."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key, pathname, blob, emit, **kw):
        if "crash" in key:
            os._exit(3)
        if "raise" in key:
            raise ValueError(f"cannot handle {bytes(blob)!r}")
        emit(key[len(pathname):], b"ok:" + bytes(blob))


class Slow:
    """Says it started (a put to `started`), takes `delay_s`, then emits its
    `tag` and the value."""

    def __init__(self, conf):
        c = json.loads(conf)
        self.delay, self.tag, self.started = c.get("delay_s", 0.3), c.get("tag", "slow"), c["started"]

    def ocdpo_handler(self, key, pathname, blob, emit, context, **kw):
        context.put(self.started + key[len(pathname):], self.tag)
        time.sleep(self.delay)
        emit(key[len(pathname):], f"{self.tag}:{bytes(blob).decode()}")


class Sequence:
    """Emits every value under one output key per input key: the output's
    versions show the order the calls ran in."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key, pathname, blob, emit, **kw):
        time.sleep(0.002 * (hash(bytes(blob)) % 3))
        emit(key[len(pathname):], bytes(blob))


class Noop:
    """A no-op stage: emits the input object itself."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key, pathname, blob, emit, **kw):
        emit(key[len(pathname):], blob)


class ToCuda:
    """Copies the object to the GPU (from the pinned region) and emits its
    sum, and whether the region was pinned."""

    def __init__(self, conf):
        import torch

        self.torch = torch

    def ocdpo_handler(self, key_suffix, blob, emit, cuda_pinned, **kw):
        t = self.torch.from_numpy(blob).to("cuda", non_blocking=True)
        self.torch.cuda.synchronize()
        emit(key_suffix, f"{int(t.sum().item())}:{cuda_pinned}")


class TwoGets:
    """Reads two keys, then emits both values: the first read's memoryview
    must still hold its value after the second read."""

    def __init__(self, conf):
        self.side = json.loads(conf)["side"]

    def ocdpo_handler(self, key_suffix, emit, context, **kw):
        a, _ = context.get(self.side + "/a")
        b, _ = context.get(self.side + "/b")
        emit(key_suffix, bytes(a) + b"+" + bytes(b))


class EmitsBadKey:
    """For values with `bad` in them, first emits under a key the store
    refuses (it ends with '/'), then as Upper does; for values with
    `objects`, first emits a NumPy array of Python objects; for `big`,
    first reads a key whose value will not fit the arena (reports what
    the store call raised). The call after a refused emit must still be
    this call's, not the last one's."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key, pathname, blob, emit, context, **kw):
        suffix = key[len(pathname):]
        value = bytes(blob)
        if b"bad" in value:
            emit("/refused/", b"x")
        if b"objects" in value:  # a buffer of pointers: refused by emit
            emit(suffix, __import__("numpy").array([value, None], dtype=object))
        if b"big" in value:
            try:
                context.get(value.decode().split(":", 1)[1])
                emit(suffix, b"read it")
            except Exception as e:  # noqa: BLE001 (what the lambda saw)
                emit(suffix, f"{type(e).__name__}: {e}")
            return
        emit(suffix, value.upper())


class BreaksProtocol:
    """For the value `break`, answers the node with an emit whose key lies
    outside the shared region (as a corrupted worker would); otherwise
    emits the value upper-cased, with this process's id."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key_suffix, blob, emit, **kw):
        if bytes(blob) == b"break":
            worker = emit.__self__  # the worker's own protocol object
            worker.respond(1, a=(1 << 40, 4))  # P_EMIT, key far outside
            return
        emit(key_suffix, bytes(blob).upper() + b":" + str(__import__("os").getpid()).encode())


class Where:
    """Emits where the value lies in the worker's memory (its address
    modulo a page), a digest of its bytes as read there, and whether the
    lambda could write them."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key, pathname, blob, emit, **kw):
        import hashlib

        emit(key[len(pathname):], f"{blob.ctypes.data % 4096}:{hashlib.sha256(blob).hexdigest()}:{blob.flags.writeable}")


class SleepsFor:
    """Sleeps as many seconds as its value says, then emits ``done``."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key_suffix, blob, emit, **kw):
        time.sleep(float(bytes(blob)))
        emit(key_suffix, b"done")


class ReadChecks:
    """Reads the key its value names with arguments a read must refuse,
    and emits what each one raised (JSON)."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key_suffix, blob, emit, context, **kw):
        key, out = bytes(blob).decode(), {}
        tries = {
            "negative": {"version": -1},
            "float": {"version": 1.5},
            "str": {"timestamp_us": "5"},
            "both": {"version": 1, "timestamp_us": 1},
        }
        for name, args in tries.items():
            try:
                context.get(key, **args)
                out[name] = "read"
            except Exception as e:  # noqa: BLE001 (reported to the test)
                out[name] = f"{type(e).__name__}: {e}"
        # Past the worker's checks: the node's own.
        try:
            context._w.store_call("get", {"key": key, "version": -1, "timestamp_us": None})
            out["raw"] = "read"
        except Exception as e:  # noqa: BLE001
            out["raw"] = f"{type(e).__name__} {getattr(e, 'kind', None)}: {e}"
        try:
            context.put(key + "-int", 5)
            out["put_int"] = "stored"
        except Exception as e:  # noqa: BLE001
            out["put_int"] = f"{type(e).__name__}: {e}"
        emit(key_suffix, json.dumps(out))


class ThreadEmits:
    """Emits from other threads: one during a call (joined before the call
    returns), one after it returned (the next call reports what both
    raised)."""

    def __init__(self, conf):
        self.errors = {}
        self.gone = threading.Event()

    def _try(self, name, emit):
        try:
            emit(f"/{name}", b"from a thread")
            self.errors[name] = "emitted"
        except Exception as e:  # noqa: BLE001 (reported to the test)
            self.errors[name] = f"{type(e).__name__}: {e}"

    def ocdpo_handler(self, key_suffix, blob, emit, **kw):
        if bytes(blob) == b"start":
            during = threading.Thread(target=self._try, args=("during", emit))
            during.start()
            during.join()

            def later():
                # Once this call returned (the worker's own flag), before
                # the next one starts.
                worker = emit.__self__
                deadline = time.monotonic() + 30
                while getattr(worker, "in_call", False) and time.monotonic() < deadline:
                    time.sleep(0.001)
                self._try("after", emit)
                self.gone.set()

            threading.Thread(target=later, daemon=True).start()
            emit(key_suffix, b"started")
        else:
            self.gone.wait(30)
            emit(key_suffix, json.dumps(self.errors))


class Prints:
    """Prints its value to stdout and stderr."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key_suffix, blob, emit, **kw):
        print("to stdout:", bytes(blob).decode())
        print("to stderr:", bytes(blob).decode(), file=sys.stderr)
        emit(key_suffix, b"printed")


class EmitsMany:
    """Its value is "N,SIZE": emits N values of SIZE bytes."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key_suffix, blob, emit, **kw):
        n, size = map(int, bytes(blob).split(b","))
        for i in range(n):
            emit(f"{key_suffix}/{i}", bytes([i % 256]) * size)


class EmitsForever:
    """Emits without end (a loop that never returns, but keeps answering)."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key_suffix, blob, emit, **kw):
        while True:
            emit(key_suffix, b"again")
