"""Python lambdas on a GPU, in one run against one node (run by ``sluice
bench python-gpu``, or ``python -m sluice.bench_gpu --addr A``; needs
PyTorch, and a CUDA device unless ``--device cpu``):

- a 1 MB object from a trigger put to a CUDA tensor inside a lambda
  (``torch.from_numpy(blob).to("cuda", non_blocking=True)``), with the
  worker's shared region registered with CUDA (``"pin_cuda": true``) and
  without; next to a plain ``cudaMemcpy`` of 1 MB from pinned and from
  pageable host memory, measured in the same process and run. Reported:
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
import shutil
import sys
import tempfile
import time
import uuid

import sluice

# The lambdas. `dev` comes from the vertex's configuration.
GPU_SRC = '''
import json
import time
import warnings

import torch

# The region is read-only to the lambda; torch warns once per process.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class ToDevice:
    """Copies the object to a tensor on the device, as a user's lambda
    would; emits when the tensor was ready and how long the copy took."""

    def __init__(self, conf):
        self.dev = torch.device(json.loads(conf)["device"])

    def ocdpo_handler(self, key_suffix, blob, emit, cuda_pinned, **kw):
        t0 = time.perf_counter_ns()
        t = torch.from_numpy(blob).to(self.dev, non_blocking=True)
        sync(self.dev)
        t1 = time.perf_counter_ns()
        emit(key_suffix, json.dumps({"ready_ns": t1, "copy_ns": t1 - t0, "pinned": cuda_pinned, "n": t.numel()}))


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


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def summary(us):
    return {p: pct(us, p) for p in (50, 99, 99.9)}


def deploy(c, code_dir, gid, src, dst, cls, config):
    conf = {"python_path": [code_dir], "module": "bench_gpu_udls", "entry_class": cls, **config}
    c.dfg_apply(
        json.dumps(
            {
                "graphs": [
                    {
                        "id": gid,
                        "graph": [
                            {
                                "pathname": src,
                                "user_defined_logic_list": ["python"],
                                "user_defined_logic_config_list": [conf],
                                "destinations": [{dst: "trigger_put"}],
                            }
                        ],
                    }
                ]
            }
        )
    )


def memcpy_baselines(torch, dev, size, n):
    """µs of a plain host-to-device cudaMemcpy of `size` bytes from pinned
    and from pageable memory (CuPy's binding of cudaMemcpy where CuPy is
    there, else torch's copy_ and a synchronize), taking turns."""
    import numpy as np

    pageable = np.frombuffer(os.urandom(size), dtype=np.uint8).copy()
    if dev.type != "cuda":
        # Only for trying the benchmark without a GPU: a host copy.
        dst = np.empty(size, dtype=np.uint8)

        def pinned_copy():
            dst[:] = pageable

        pageable_copy = pinned_copy
        how = "host memcpy (no GPU)"
    else:
        try:
            pinned_copy, pageable_copy = cupy_memcpy(pageable)
            how = "cudaMemcpy (CuPy's runtime binding)"
        except Exception as e:  # noqa: BLE001 (no CuPy, or one that does not match the driver)
            pinned = torch.from_numpy(pageable).pin_memory()
            src = torch.from_numpy(pageable)
            dst = torch.empty(size, dtype=torch.uint8, device=dev)

            def pinned_copy():
                dst.copy_(pinned, non_blocking=True)
                torch.cuda.synchronize(dev)

            def pageable_copy():
                dst.copy_(src)
                torch.cuda.synchronize(dev)

            how = f"torch copy_ + synchronize (CuPy: {type(e).__name__}: {e})"
    # What a lambda's `.to(...)` does, from a tensor torch itself pinned.
    torch_pinned = torch.from_numpy(pageable)
    if dev.type == "cuda":
        torch_pinned = torch_pinned.pin_memory()

    def torch_to():
        torch_pinned.to(dev, non_blocking=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    copies = (("pinned", pinned_copy), ("pageable", pageable_copy), ("torch_pinned", torch_to))
    for _, f in copies:
        for _ in range(20):
            f()
    out = {name: [] for name, _ in copies}
    for _ in range(n):
        for name, f in copies:
            t0 = time.perf_counter_ns()
            f()
            out[name].append((time.perf_counter_ns() - t0) / 1000)
    return how, out


def cupy_memcpy(pageable):
    """Two calls of a plain cudaMemcpy to the device of `pageable`'s size:
    from pinned memory (a copy of it) and from `pageable` itself."""
    import cupy
    import numpy as np

    rt = cupy.cuda.runtime
    size = len(pageable)
    pinned_mem = cupy.cuda.alloc_pinned_memory(size)
    pinned = np.frombuffer(pinned_mem, dtype=np.uint8, count=size)
    pinned[:] = pageable
    dst = cupy.empty(size, dtype=cupy.uint8)
    kind = rt.memcpyHostToDevice

    def pinned_copy():
        rt.memcpy(dst.data.ptr, pinned.ctypes.data, size, kind)

    def pageable_copy():
        rt.memcpy(dst.data.ptr, pageable.ctypes.data, size, kind)

    pinned_copy()
    if not (dst.get() == pageable).all():
        raise RuntimeError("the pinned copy arrived wrong")
    # Keeps the pinned allocation alive as long as the closures.
    pinned_copy.keep = pinned_mem
    return pinned_copy, pageable_copy


def to_device_latencies(c, stages, size, n):
    """For each (src, dst) stage running ToDevice, taking turns call by
    call: the copy inside the lambda and put -> tensor ready, µs."""
    value = os.urandom(size)
    copy = [[] for _ in stages]
    ready = [[] for _ in stages]
    pinned = [None for _ in stages]
    watches = [c.watch(dst) for _, dst in stages]
    try:
        for _ in range(n):
            for i, (src, _) in enumerate(stages):
                t0 = time.perf_counter_ns()
                c.trigger_put(f"{src}/k", value)
                note = watches[i].next(timeout=30)
                if note is None:
                    raise RuntimeError(f"no output from the stage at {src} in 30 s")
                r = json.loads(bytes(note.value))
                if r["n"] != size:
                    raise RuntimeError(f"the tensor has {r['n']} elements, not {size}")
                copy[i].append(r["copy_ns"] / 1000)
                ready[i].append((r["ready_ns"] - t0) / 1000)
                pinned[i] = r["pinned"]
    finally:
        for w in watches:
            w.close()
    return copy, ready, pinned


def inference_latencies(c, torch, dev, stage, n):
    """µs of batch-1 ResNet-18: a whole lambda stage (trigger put ->
    notification) and the same model called directly on the same input,
    taking turns call by call; and whether both gave the same class."""
    import numpy as np

    sys.path.insert(0, _code_dir)
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
    c = sluice.Client(a.addr)
    _code_dir = tempfile.mkdtemp(prefix="sluice-bench-gpu-")
    with open(os.path.join(_code_dir, "bench_gpu_udls.py"), "w") as f:
        f.write(GPU_SRC)
    tag = uuid.uuid4().hex[:6]
    pools = {}
    for v in ("pin", "page", "inf"):
        pools[v] = (f"/bg-{v}-in-{tag}", f"/bg-{v}-out-{tag}")
        for p in pools[v]:
            c.create_object_pool(p, "trigger")
    deploy(c, _code_dir, f"bg-pin-{tag}", *pools["pin"], "ToDevice", {"device": str(dev), "pin_cuda": True})
    deploy(c, _code_dir, f"bg-page-{tag}", *pools["page"], "ToDevice", {"device": str(dev)})
    deploy(c, _code_dir, f"bg-inf-{tag}", *pools["inf"], "Classify", {"device": str(dev), "pin_cuda": True})
    result = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev), "size": a.size}
    stages = [pools["pin"], pools["page"]]
    to_device_latencies(c, stages, a.size, 50)  # warm up
    copy, ready, pinned = to_device_latencies(c, stages, a.size, a.n)
    how, base = memcpy_baselines(torch, dev, a.size, a.n)
    result["baseline"] = how
    result["memcpy_us"] = {k: summary(v) for k, v in base.items()}
    result["lambda_copy_us"] = {"pinned_region": summary(copy[0]), "pageable_region": summary(copy[1])}
    result["put_to_tensor_us"] = {"pinned_region": summary(ready[0]), "pageable_region": summary(ready[1])}
    result["region_pinned"] = {"pin_cuda": pinned[0], "default": pinned[1]}
    result["lambda_copy_over_pinned_memcpy_p50"] = result["lambda_copy_us"]["pinned_region"][50] / result["memcpy_us"]["pinned"][50]
    inf, agree = inference_latencies(c, torch, dev, pools["inf"], max(50, a.n // 4))
    result["inference_us"] = {k: summary(v) for k, v in inf.items()}
    result["inference_same_class"] = agree
    result["inference_lambda_over_direct_p50"] = result["inference_us"]["lambda"][50] / result["inference_us"]["direct"][50]
    for g in list(c.dfg_list()):
        if g["id"].endswith(tag):
            c.dfg_remove(g["id"])
    shutil.rmtree(_code_dir, ignore_errors=True)
    if a.json:
        print(json.dumps(result, indent=2))
        return
    report(result)


def report(r):
    size = f"{r['size'] / (1 << 20):g} MB" if r["size"] >= (1 << 20) else f"{r['size']} B"
    print(f"device: {r['device']}; baseline: {r['baseline']}")
    print(f"{size} host -> device, µs:")
    print(f"  {'':44} {'p50':>8} {'p99':>8} {'p999':>8}")
    rows = (
        ("cudaMemcpy from pinned memory", r["memcpy_us"]["pinned"]),
        ("cudaMemcpy from pageable memory", r["memcpy_us"]["pageable"]),
        ("torch .to(device) from a pinned tensor", r["memcpy_us"]["torch_pinned"]),
        ("in a lambda, region pinned (pin_cuda)", r["lambda_copy_us"]["pinned_region"]),
        ("in a lambda, region not pinned", r["lambda_copy_us"]["pageable_region"]),
        ("trigger put -> tensor ready, pinned", r["put_to_tensor_us"]["pinned_region"]),
        ("trigger put -> tensor ready, not pinned", r["put_to_tensor_us"]["pageable_region"]),
    )
    for name, s in rows:
        print(f"  {name:44} {s[50]:8.1f} {s[99]:8.1f} {s[99.9]:8.1f}")
    pin = r["region_pinned"]
    print(f"  (region registered with CUDA: pin_cuda {pin['pin_cuda']}, default {pin['default']})")
    print(f"  object -> tensor in a lambda: {r['lambda_copy_over_pinned_memcpy_p50']:.2f}x a pinned cudaMemcpy at p50 (target <= 1.2)")
    inf = r["inference_us"]
    print("batch-1 ResNet-18 (float32 1x3x224x224), µs:")
    for name, label in (("lambda", "in a lambda (put -> class at the client)"), ("direct", "called directly in Python")):
        s = inf[name]
        print(f"  {label:44} {s[50]:8.1f} {s[99]:8.1f} {s[99.9]:8.1f}")
    print(
        f"  the lambda stage costs {r['inference_lambda_over_direct_p50']:.2f}x the direct call at p50"
        f" (+{inf['lambda'][50] - inf['direct'][50]:.1f} µs); same class every call: {r['inference_same_class']}"
    )


if __name__ == "__main__":
    main()
