"""Python lambdas on a GPU, in one run against one node (run by ``sluice
bench python-gpu``, or ``python -m sluice.bench_gpu --addr A``; needs
PyTorch, and a CUDA device unless ``--device cpu``):

- a 1 MB object from a trigger put to a CUDA tensor inside a lambda
  (``torch.from_numpy(blob).to("cuda", non_blocking=True)``), with the
  worker's shared region registered with CUDA (``"pin_cuda": true``) and
  without, and (region pinned) copied into a tensor allocated once, by
  torch's ``copy_`` and, where CuPy is there, by a plain ``cudaMemcpy``
  (the node writing the value with plain stores, and with the streaming
  stores ``pin_cuda`` has by default); next to a plain ``cudaMemcpy`` of
  1 MB from pinned and from pageable host memory, from pinned memory
  rewritten just before each copy, and from a ``/dev/shm`` mapping
  registered with CUDA as a worker's region is, measured in the same
  process and run. Reported:
  the copy inside the lambda, and put -> tensor ready end to end (the
  client's clock and the worker's are the same CLOCK_MONOTONIC);
- batch-1 inference of a torchvision ResNet-18 (random weights: nothing
  is downloaded) inside a lambda (trigger put -> lambda -> emit -> the
  client's notification) next to the same model called directly in
  Python on the same input, taking turns call by call.
"""

import argparse
import json
import os
import sys
import tempfile
import time
import uuid

import sluice
from sluice.bench_udl import clean_up, failures, one_vertex_graph, pct, stage_calls, warn_failures

# The lambdas. `dev` comes from the vertex's configuration.
GPU_SRC = '''
import json
import time
import warnings

import torch

# The region is read-only to the lambda; torch warns once per process.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


_events = []


def timed_to(dev, host, into=None):
    """`host.to(dev)`, as a lambda would write it (or, given `into`, a
    tensor allocated once on `dev`: `into.copy_(host)`); returns the
    tensor, the wall time until it is ready and the copy's own time on the
    GPU (CUDA events; None on the CPU), in ns."""
    if dev.type != "cuda":
        t0 = time.perf_counter_ns()
        t = host.clone() if into is None else into.copy_(host)
        return t, time.perf_counter_ns() - t0, None
    if not _events:
        _events.extend(torch.cuda.Event(enable_timing=True) for _ in range(2))
    e0, e1 = _events
    t0 = time.perf_counter_ns()
    e0.record()
    t = host.to(dev, non_blocking=True) if into is None else into.copy_(host, non_blocking=True)
    e1.record()
    e1.synchronize()
    t1 = time.perf_counter_ns()
    return t, t1 - t0, int(e0.elapsed_time(e1) * 1e6)


class ToDevice:
    """Copies the object to a tensor on the device; emits when the tensor
    was ready and how long the copy took."""

    def __init__(self, conf):
        c = json.loads(conf)
        self.dev = torch.device(c["device"])
        self.into = c.get("into", False)  # copy into a tensor allocated once
        self.dst = None

    def ocdpo_handler(self, key_suffix, blob, emit, cuda_pinned, **kw):
        if self.into and (self.dst is None or self.dst.numel() != len(blob)):
            self.dst = torch.empty(len(blob), dtype=torch.uint8, device=self.dev)
        t, wall, dma = timed_to(self.dev, torch.from_numpy(blob), self.dst if self.into else None)
        r = {"ready_ns": time.perf_counter_ns(), "copy_ns": wall, "dma_ns": dma, "pinned": cuda_pinned, "n": t.numel()}
        emit(key_suffix, json.dumps(r))


class ToDeviceMemcpy:
    """As ToDevice, with a plain cudaMemcpy (CuPy's runtime binding) from
    the object's bytes into a tensor allocated once: the copy without
    torch's per-call work, as the cudaMemcpy baseline does it."""

    def __init__(self, conf):
        import cupy

        self.rt = cupy.cuda.runtime
        self.dev = torch.device(json.loads(conf)["device"])
        self.dst = None

    def ocdpo_handler(self, key_suffix, blob, emit, cuda_pinned, **kw):
        n = len(blob)
        if self.dst is None or self.dst.numel() != n:
            self.dst = torch.empty(n, dtype=torch.uint8, device=self.dev)
            torch.cuda.synchronize(self.dev)
        t0 = time.perf_counter_ns()
        self.rt.memcpy(self.dst.data_ptr(), blob.ctypes.data, n, self.rt.memcpyHostToDevice)
        t1 = time.perf_counter_ns()
        r = {"ready_ns": t1, "copy_ns": t1 - t0, "dma_ns": None, "pinned": cuda_pinned, "n": self.dst.numel()}
        emit(key_suffix, json.dumps(r))


def resnet18(dev):
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval().to(dev)


class Classify:
    """Batch-1 ResNet-18 over a float32 1x3x224x224 image; emits the class."""

    def __init__(self, conf):
        self.dev = torch.device(json.loads(conf)["device"])
        self.model = resnet18(self.dev)

    def ocdpo_handler(self, key_suffix, blob, emit, **kw):
        x = torch.from_numpy(blob).to(self.dev, non_blocking=True).view(torch.float32).view(1, 3, 224, 224)
        with torch.inference_mode():
            y = int(self.model(x).argmax(1).item())
        emit(key_suffix, str(y))
'''


def summary(us):
    return {p: pct(us, p) for p in (50, 99, 99.9)}


def deploy(c, code_dir, gid, src, dst, cls, config):
    conf = {"python_path": [code_dir], "module": "bench_gpu_udls", "entry_class": cls, **config}
    c.dfg_apply(one_vertex_graph(gid, src, dst, "python", conf))


def memcpy_baselines(torch, dev, size, n, gap_s):
    """µs of host-to-device copies of `size` bytes, taking turns call by
    call, back to back and then `gap_s` apart (as the lambda's copies
    are): a plain cudaMemcpy from pinned and from pageable memory (CuPy's
    binding, where CuPy is there), and torch's `.to(device)` from a tensor
    torch pinned and from a pageable one (wall time and, on a GPU, the
    copy's own time from CUDA events)."""
    import numpy as np

    import bench_gpu_udls

    pageable = np.frombuffer(os.urandom(size), dtype=np.uint8).copy()
    host = torch.from_numpy(pageable)
    copies = {}
    how = "host memcpy (no GPU)"
    if dev.type == "cuda":
        try:
            copies.update(cupy_memcpy(pageable))
            how = "cudaMemcpy (CuPy's runtime binding)"
        except Exception as e:  # noqa: BLE001 (no CuPy, or one that does not match the driver)
            how = f"no plain cudaMemcpy (CuPy: {type(e).__name__}: {e})"
        pinned = host.pin_memory()
    else:
        pinned = host
    copies["torch_pinned"] = lambda: bench_gpu_udls.timed_to(dev, pinned)[1:]
    into = torch.empty(size, dtype=torch.uint8, device=dev)
    copies["torch_pinned_into"] = lambda: bench_gpu_udls.timed_to(dev, pinned, into)[1:]
    copies["torch_pageable"] = lambda: bench_gpu_udls.timed_to(dev, host)[1:]
    out = {}
    for pace, gap in (("back_to_back", 0.0), ("paced", gap_s)):
        for f in copies.values():
            for _ in range(20):
                f()
        walls = {name: [] for name in copies}
        dmas = {name: [] for name in copies}
        for _ in range(n):
            for name, f in copies.items():
                if gap:
                    time.sleep(gap)
                prepare = getattr(f, "prepare", None)
                if prepare is not None:
                    prepare()
                t0 = time.perf_counter_ns()
                dma = f()
                walls[name].append((time.perf_counter_ns() - t0) / 1000)
                if dma is not None and dma[1] is not None:
                    dmas[name].append(dma[1] / 1000)
        out[pace] = {name: {"wall": summary(walls[name]), "gpu": summary(dmas[name]) if dmas[name] else None} for name in copies}
    return how, out


def cupy_memcpy(pageable):
    """Plain cudaMemcpy calls to the device of `pageable`'s size, by where
    the bytes are: memory CUDA allocated pinned (``cudaHostAlloc``), that
    memory rewritten just before each copy (as an object arriving is),
    `pageable` itself, and memory registered with CUDA as a lambda's
    region is (``cudaHostRegister``): a ``/dev/shm`` file's mapping with
    the bytes at a page and 64 bytes past one, rewritten before each copy,
    and anonymous memory on transparent huge pages where the kernel gives
    them. Returns {name: copy}; a copy's ``prepare``, where it has one,
    runs before it, untimed."""
    import cupy
    import numpy as np

    rt = cupy.cuda.runtime
    size = len(pageable)
    dst = cupy.empty(size, dtype=cupy.uint8)
    kind = rt.memcpyHostToDevice

    def copy_from(host, keep):
        def f():
            rt.memcpy(dst.data.ptr, host.ctypes.data, size, kind)

        host[:] = pageable
        f()
        if not (dst.get() == pageable).all():
            raise RuntimeError("a copy to the device arrived wrong")
        f.keep = keep  # the memory lives as long as the copy
        return f

    def fresh(f, host):
        other = np.frombuffer(os.urandom(size), dtype=np.uint8)
        f.prepare = lambda: np.copyto(host, other)
        return f

    pinned_mem = cupy.cuda.alloc_pinned_memory(size)
    pinned = np.frombuffer(pinned_mem, dtype=np.uint8, count=size)
    copies = {"memcpy_pinned": copy_from(pinned, pinned_mem)}
    pinned2_mem = cupy.cuda.alloc_pinned_memory(size)
    pinned2 = np.frombuffer(pinned2_mem, dtype=np.uint8, count=size)
    copies["memcpy_pinned_fresh"] = fresh(copy_from(pinned2, pinned2_mem), pinned2)
    copies["memcpy_pageable"] = copy_from(pageable, None)
    for name, offset, rewrite in (("memcpy_shm", 4096, False), ("memcpy_shm_off64", 4096 + 64, False), ("memcpy_shm_fresh", 4096, True)):
        try:
            region = registered_shm(size + 8192)
        except Exception as e:  # noqa: BLE001 (this baseline is left out, saying why)
            print(f"(no {name}: {type(e).__name__}: {e})", file=sys.stderr)
            continue
        if region is None:
            continue
        host = np.frombuffer(region[1], dtype=np.uint8, count=size, offset=offset)
        f = copy_from(host, region)
        copies[name] = fresh(f, host) if rewrite else f
    try:
        thp = registered_thp(size)
    except Exception as e:  # noqa: BLE001
        print(f"(no memcpy_thp: {type(e).__name__}: {e})", file=sys.stderr)
        thp = None
    if thp is not None:
        host = np.frombuffer(thp[1], dtype=np.uint8, count=size, offset=thp[2])
        copies["memcpy_thp"] = copy_from(host, thp)
    return copies


def host_register(buf):
    """Registers `buf` (a writable buffer) with CUDA as the lambdas'
    worker does its region; the ctypes array that keeps it exported, or
    None where CUDA refuses."""
    import ctypes

    import torch

    arr = (ctypes.c_char * len(buf)).from_buffer(buf)
    err = torch.cuda.cudart().cudaHostRegister(ctypes.addressof(arr), len(buf), 0)
    return arr if getattr(err, "value", err) == 0 else None


def registered_shm(size):
    """A ``/dev/shm`` file's shared mapping, registered with CUDA (as a
    lambda's region is): (file, mapping, registration) or None."""
    import mmap

    if not os.path.isdir("/dev/shm"):
        return None
    fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="sluice-bench-gpu-")
    try:
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size)
    finally:
        os.close(fd)
        os.unlink(path)
    reg = host_register(m)
    return None if reg is None else (path, m, reg)


def registered_thp(size):
    """Anonymous memory advised onto transparent huge pages, registered
    with CUDA: (mapping, mapping, offset of a 2 MB boundary, registration),
    or None where the kernel has no huge pages for it."""
    import mmap

    huge = 2 << 20
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    m = mmap.mmap(-1, size + 2 * huge)
    m.madvise(mmap.MADV_HUGEPAGE)
    m.write(b"\0" * len(m))  # fault it in
    try:
        with open("/proc/self/smaps_rollup") as f:
            huge_kb = next((int(line.split()[1]) for line in f if line.startswith("AnonHugePages:")), 0)
    except OSError:
        huge_kb = 0
    if huge_kb * 1024 < size:
        return None
    import ctypes

    base = ctypes.addressof((ctypes.c_char * len(m)).from_buffer(m))
    offset = (-base) % huge
    reg = host_register(m)
    return None if reg is None else (m, m, offset, reg)


def to_device_latencies(c, stages, size, n):
    """For each (src, dst) stage running ToDevice, taking turns call by
    call: the copy inside the lambda (wall, and on the GPU by CUDA
    events) and put -> tensor ready, µs."""
    copy = [[] for _ in stages]
    dma = [[] for _ in stages]
    ready = [[] for _ in stages]
    pinned = [None for _ in stages]

    def each(i, t0, note):
        r = json.loads(bytes(note.value))
        if r["n"] != size:
            raise RuntimeError(f"the tensor has {r['n']} elements, not {size}")
        copy[i].append(r["copy_ns"] / 1000)
        if r["dma_ns"] is not None:
            dma[i].append(r["dma_ns"] / 1000)
        ready[i].append((r["ready_ns"] - t0) / 1000)
        pinned[i] = r["pinned"]

    stage_calls(c, stages, size, n, each, timeout=30)
    return copy, dma, ready, pinned


def inference_latencies(c, torch, dev, stage, n):
    """µs of batch-1 ResNet-18: a whole lambda stage (trigger put ->
    notification) and the same model called directly on the same input,
    taking turns call by call; and whether both gave the same class."""
    import numpy as np

    import bench_gpu_udls

    model = bench_gpu_udls.resnet18(dev)
    rng = np.random.default_rng(0)
    image = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
    value = image.tobytes()

    def direct():
        x = torch.from_numpy(image).to(dev)
        with torch.inference_mode():
            return int(model(x).argmax(1).item())

    src, dst = stage
    out = {"lambda": [], "direct": []}
    agree = True
    with c.watch(dst) as w:
        for i in range(n + 20):  # the first 20: warm-up
            t0 = time.perf_counter_ns()
            c.trigger_put(f"{src}/img", value)
            note = w.next(timeout=60)
            if note is None:
                raise RuntimeError("no class from the inference lambda in 60 s")
            t1 = time.perf_counter_ns()
            y = direct()
            t2 = time.perf_counter_ns()
            agree &= int(bytes(note.value)) == y
            if i >= 20:
                out["lambda"].append((t1 - t0) / 1000)
                out["direct"].append((t2 - t1) / 1000)
    return out, agree


_code_dir = None


def main():
    global _code_dir
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default=sluice.default_address())
    ap.add_argument("--n", type=int, default=1000, help="calls per variant (taking turns call by call)")
    ap.add_argument("--size", type=int, default=1 << 20, help="object size for the copy, bytes")
    ap.add_argument("--device", help="torch device (default: cuda where there is one)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("sluice bench python-gpu: PyTorch is not installed in this Python: nothing measured", file=sys.stderr)
        sys.exit(2)
    if a.device is None and not torch.cuda.is_available():
        print("sluice bench python-gpu: no CUDA device here: nothing measured (--device cpu tries it on the CPU)", file=sys.stderr)
        sys.exit(2)
    dev = torch.device(a.device or "cuda")
    # Loading torch, a model and CUDA in a new worker can take longer
    # than the default 10 s on a cold machine (dfg apply waits for it).
    c = sluice.Client(a.addr, timeout=120)
    _code_dir = tempfile.mkdtemp(prefix="sluice-bench-gpu-")
    with open(os.path.join(_code_dir, "bench_gpu_udls.py"), "w") as f:
        f.write(GPU_SRC)
    sys.path.insert(0, _code_dir)
    tag = uuid.uuid4().hex[:6]
    pools = {}
    for v in ("pin", "page", "inf", "memcpy", "memcpynt", "into"):
        pools[v] = (f"/bg-{v}-in-{tag}", f"/bg-{v}-out-{tag}")
        for p in pools[v]:
            c.create_object_pool(p, "trigger")
    deploy(c, _code_dir, f"bg-pin-{tag}", *pools["pin"], "ToDevice", {"device": str(dev), "pin_cuda": True})
    deploy(c, _code_dir, f"bg-page-{tag}", *pools["page"], "ToDevice", {"device": str(dev)})
    deploy(c, _code_dir, f"bg-inf-{tag}", *pools["inf"], "Classify", {"device": str(dev), "pin_cuda": True})
    deploy(c, _code_dir, f"bg-into-{tag}", *pools["into"], "ToDevice", {"device": str(dev), "pin_cuda": True, "into": True})
    regions = ["pinned_region", "pageable_region", "pinned_region_into"]
    stages = [pools["pin"], pools["page"], pools["into"]]
    try:
        deploy(c, _code_dir, f"bg-memcpy-{tag}", *pools["memcpy"], "ToDeviceMemcpy", {"device": str(dev), "pin_cuda": True, "stream_copy": False})
        regions.append("pinned_region_cudamemcpy")
        stages.append(pools["memcpy"])
        # As pin_cuda has it by default: the node writes the value with
        # non-temporal stores (stream_copy).
        deploy(c, _code_dir, f"bg-memcpynt-{tag}", *pools["memcpynt"], "ToDeviceMemcpy", {"device": str(dev), "pin_cuda": True})
        regions.append("pinned_region_cudamemcpy_stream")
        stages.append(pools["memcpynt"])
    except sluice.InvalidDfg as e:
        print(f"(no plain cudaMemcpy in a lambda: {str(e).splitlines()[0]})", file=sys.stderr)
    result = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev), "size": a.size}
    to_device_latencies(c, stages, a.size, 50)  # warm up
    copy, dma, ready, pinned = to_device_latencies(c, stages, a.size, a.n)
    result["lambda_copy_us"] = {
        region: {"wall": summary(copy[i]), "gpu": summary(dma[i]) if dma[i] else None}
        for i, region in enumerate(regions)
    }
    result["put_to_tensor_us"] = {region: summary(ready[i]) for i, region in enumerate(regions)}
    result["region_pinned"] = {"pin_cuda": pinned[0], "default": pinned[1]}
    # The lambda's copies come one round trip apart; so do the paced ones.
    gap_s = result["put_to_tensor_us"]["pinned_region"][50] / 1e6
    result["baseline"], result["baselines_us"] = memcpy_baselines(torch, dev, a.size, a.n, gap_s)
    result["paced_gap_us"] = gap_s * 1e6
    result["ratios_p50"] = ratios(result)
    inf, agree = inference_latencies(c, torch, dev, pools["inf"], max(50, a.n // 4))
    result["inference_us"] = {k: summary(v) for k, v in inf.items()}
    result["inference_same_class"] = agree
    result["inference_lambda_over_direct_p50"] = result["inference_us"]["lambda"][50] / result["inference_us"]["direct"][50]
    result["failed_calls"], result["last_error"] = failures(c, tag)
    clean_up(c, tag, _code_dir)
    warn_failures(result)
    if a.json:
        print(json.dumps(result, indent=2))
        return
    report(result)


def ratios(r):
    """The lambda's copy of the object over the baselines, at p50."""
    out = {}
    for region, lam in r["lambda_copy_us"].items():
        for pace, base in r["baselines_us"].items():
            for name, b in base.items():
                out[f"{region}_over_{name}_{pace}"] = lam["wall"][50] / b["wall"][50]
                if lam["gpu"] and b["gpu"]:
                    out[f"{region}_gpu_over_{name}_gpu_{pace}"] = lam["gpu"][50] / b["gpu"][50]
    return out


def report(r):
    size = f"{r['size'] / (1 << 20):g} MB" if r["size"] >= (1 << 20) else f"{r['size']} B"
    print(f"device: {r['device']}; baseline: {r['baseline']}")
    print(f"{size} host -> device, µs (wall: until the tensor is ready; gpu: the copy itself, CUDA events):")
    print(f"  {'':64} {'p50':>8} {'p99':>8} {'p999':>8} {'gpu p50':>8}")

    def row(name, s):
        gpu = f"{s['gpu'][50]:8.1f}" if s["gpu"] else f"{'':>8}"
        w = s["wall"]
        print(f"  {name:64} {w[50]:8.1f} {w[99]:8.1f} {w[99.9]:8.1f} {gpu}")

    labels = {
        "memcpy_pinned": "cudaMemcpy from pinned memory",
        "memcpy_pinned_fresh": "cudaMemcpy from pinned memory rewritten before",
        "memcpy_pageable": "cudaMemcpy from pageable memory",
        "memcpy_shm": "cudaMemcpy from a registered /dev/shm mapping",
        "memcpy_shm_off64": "the same, 64 bytes past a page",
        "memcpy_shm_fresh": "the same, page-aligned, rewritten before",
        "memcpy_thp": "cudaMemcpy from registered huge pages",
        "torch_pinned": "torch .to(device) from a pinned tensor",
        "torch_pinned_into": "torch copy_ from a pinned tensor, allocated once",
        "torch_pageable": "torch .to(device) from a pageable tensor",
    }
    for pace, base in r["baselines_us"].items():
        when = "back to back" if pace == "back_to_back" else f"{r['paced_gap_us']:.0f} µs apart"
        for name, s in base.items():
            row(f"{labels[name]}, {when}", s)
    row("in a lambda, region pinned (pin_cuda)", r["lambda_copy_us"]["pinned_region"])
    row("in a lambda, region not pinned", r["lambda_copy_us"]["pageable_region"])
    if "pinned_region_into" in r["lambda_copy_us"]:
        row("in a lambda, region pinned, copy_ allocated once", r["lambda_copy_us"]["pinned_region_into"])
    if "pinned_region_cudamemcpy" in r["lambda_copy_us"]:
        row("in a lambda, region pinned, cudaMemcpy (CuPy), plain stores", r["lambda_copy_us"]["pinned_region_cudamemcpy"])
    if "pinned_region_cudamemcpy_stream" in r["lambda_copy_us"]:
        row("the same, value written with streaming stores (pin_cuda's default)", r["lambda_copy_us"]["pinned_region_cudamemcpy_stream"])
    names = {
        "pinned_region": "pinned",
        "pageable_region": "not pinned",
        "pinned_region_into": "pinned, copy_",
        "pinned_region_cudamemcpy": "pinned, cudaMemcpy, plain stores",
        "pinned_region_cudamemcpy_stream": "pinned, cudaMemcpy, streaming stores",
    }
    for region, s in r["put_to_tensor_us"].items():
        name = f"trigger put -> tensor ready, {names[region]}"
        print(f"  {name:64} {s[50]:8.1f} {s[99]:8.1f} {s[99.9]:8.1f}")
    pin = r["region_pinned"]
    print(f"  (region registered with CUDA: pin_cuda {pin['pin_cuda']}, default {pin['default']})")
    q = r["ratios_p50"]
    for key, label in (
        ("pinned_region_over_torch_pinned_paced", "torch .to in a lambda / torch .to from a pinned tensor as far apart"),
        ("pinned_region_gpu_over_torch_pinned_gpu_paced", "the same on the GPU (events)"),
        ("pinned_region_over_memcpy_pinned_paced", "torch .to in a lambda / a pinned cudaMemcpy as far apart"),
        ("pinned_region_into_over_torch_pinned_into_paced", "torch copy_ in a lambda / the same from a pinned tensor as far apart"),
        ("pinned_region_into_over_memcpy_pinned_paced", "torch copy_ in a lambda / a pinned cudaMemcpy as far apart"),
        ("pinned_region_cudamemcpy_over_memcpy_pinned_paced", "cudaMemcpy in a lambda, plain stores / a pinned cudaMemcpy as far apart"),
        ("pinned_region_cudamemcpy_over_memcpy_pinned_back_to_back", "cudaMemcpy in a lambda, plain stores / a pinned cudaMemcpy back to back"),
        ("pinned_region_cudamemcpy_over_memcpy_pinned_fresh_paced", "cudaMemcpy in a lambda, plain stores / a pinned cudaMemcpy of bytes just written"),
        ("pinned_region_cudamemcpy_stream_over_memcpy_pinned_paced", "cudaMemcpy in a lambda (pin_cuda's streaming stores) / a pinned cudaMemcpy as far apart (target <= 1.2)"),
        ("pinned_region_cudamemcpy_stream_over_memcpy_pinned_fresh_paced", "the same / a pinned cudaMemcpy of bytes just written"),
    ):
        if key in q:
            print(f"  object -> tensor, p50: {label}: {q[key]:.2f}x")
    inf = r["inference_us"]
    print("batch-1 ResNet-18 (float32 1x3x224x224), µs:")
    for name, label in (("lambda", "in a lambda (put -> class at the client)"), ("direct", "called directly in Python")):
        s = inf[name]
        print(f"  {label:64} {s[50]:8.1f} {s[99]:8.1f} {s[99.9]:8.1f}")
    print(
        f"  the lambda stage costs {r['inference_lambda_over_direct_p50']:.2f}x the direct call at p50"
        f" (+{inf['lambda'][50] - inf['direct'][50]:.1f} µs); same class every call: {r['inference_same_class']}"
    )


if __name__ == "__main__":
    main()
