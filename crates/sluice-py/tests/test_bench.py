"""The benchmarks' Python sides. `sluice bench python-gpu`'s
(sluice.bench_gpu): its ratios and report from a known result, its clear
refusal without PyTorch, and, where PyTorch and torchvision are
installed, a whole run on the CPU against a node (CI has no torch: that
test skips there). And every Python benchmark's check that its lambdas
failed no call."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sluice
from sluice import bench_gpu


def stats(p50):
    return {50: p50, 99: 2 * p50, 99.9: 3 * p50}


def known_result():
    return {
        "device": "a GPU",
        "size": 1 << 20,
        "baseline": "cudaMemcpy",
        "paced_gap_us": 600.0,
        "baselines_us": {
            "back_to_back": {
                "memcpy_pinned": {"wall": stats(30.0), "gpu": None},
                "torch_pinned": {"wall": stats(50.0), "gpu": stats(25.0)},
            },
            "paced": {
                "memcpy_pinned": {"wall": stats(60.0), "gpu": None},
                "memcpy_pinned_fresh": {"wall": stats(75.0), "gpu": None},
                "memcpy_shm_off64": {"wall": stats(65.0), "gpu": None},
                "torch_pinned": {"wall": stats(120.0), "gpu": stats(60.0)},
            },
        },
        "lambda_copy_us": {
            "pinned_region": {"wall": stats(120.0), "gpu": stats(75.0)},
            "pageable_region": {"wall": stats(200.0), "gpu": stats(150.0)},
            "pinned_region_cudamemcpy": {"wall": stats(69.0), "gpu": None},
            "pinned_region_cudamemcpy_stream": {"wall": stats(66.0), "gpu": None},
        },
        "put_to_tensor_us": {"pinned_region": stats(600.0), "pageable_region": stats(700.0)},
        "region_pinned": {"pin_cuda": True, "default": False},
        "inference_us": {"lambda": stats(3000.0), "direct": stats(2500.0)},
        "inference_same_class": True,
        "inference_lambda_over_direct_p50": 1.2,
    }


def test_ratios_compare_each_lambda_copy_with_each_baseline_at_the_same_pace():
    q = bench_gpu.ratios(known_result())
    assert q["pinned_region_cudamemcpy_over_memcpy_pinned_paced"] == pytest.approx(69 / 60)
    assert q["pinned_region_cudamemcpy_over_memcpy_pinned_back_to_back"] == pytest.approx(69 / 30)
    assert q["pinned_region_over_torch_pinned_paced"] == pytest.approx(1.0)
    assert q["pinned_region_gpu_over_torch_pinned_gpu_paced"] == pytest.approx(75 / 60)
    # No GPU-side figure where either side has none.
    assert "pinned_region_cudamemcpy_gpu_over_memcpy_pinned_gpu_paced" not in q
    assert "pinned_region_gpu_over_memcpy_pinned_gpu_paced" not in q


def test_the_report_names_the_target_and_every_row(capsys):
    r = known_result()
    r["ratios_p50"] = bench_gpu.ratios(r)
    bench_gpu.report(r)
    out = capsys.readouterr().out
    assert "cudaMemcpy in a lambda, plain stores / a pinned cudaMemcpy as far apart: 1.15x" in out
    assert "cudaMemcpy from pinned memory, 600 µs apart" in out
    assert "in a lambda, region not pinned" in out
    assert "same class every call: True" in out
    # The baselines that say where a lambda's copy loses time, and the
    # copy of a value the node wrote with streaming stores.
    assert "cudaMemcpy from pinned memory rewritten before, 600 µs apart" in out
    assert "the same, 64 bytes past a page, 600 µs apart" in out
    assert "cudaMemcpy in a lambda, plain stores / a pinned cudaMemcpy of bytes just written: 0.92x" in out
    assert "cudaMemcpy in a lambda (pin_cuda's streaming stores) / a pinned cudaMemcpy as far apart (target <= 1.2): 1.10x" in out


def run_bench(args):
    return subprocess.run(
        [sys.executable, "-m", "sluice.bench_gpu", *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_without_torch_it_says_so_and_measures_nothing():
    p = run_bench(["--addr", "127.0.0.1:1"])
    assert p.returncode == 2
    assert "PyTorch is not installed" in p.stderr
    assert p.stdout == ""


def test_a_whole_run_on_the_cpu(node):
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    p = run_bench(["--addr", node.addr, "--device", "cpu", "--n", "20", "--json"])
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["device"] == "cpu"
    assert set(r["lambda_copy_us"]) >= {"pinned_region", "pageable_region"}
    assert r["lambda_copy_us"]["pinned_region"]["wall"]["50"] > 0
    # Without a GPU nothing can be pinned; the worker says so and runs on.
    assert r["region_pinned"] == {"pin_cuda": False, "default": False}
    assert r["inference_same_class"] is True


class FakeClient:
    def __init__(self, graphs):
        self.graphs = graphs

    def dfg_list(self):
        return self.graphs


def test_a_run_whose_lambdas_failed_says_so(capsys):
    from sluice import bench_udl

    c = FakeClient(
        [
            {"id": "bu-py-t1", "status": [{"failures": 1, "panics": 0, "dropped": 2, "last_error": "/k: refused"}]},
            {"id": "bu-rs-t1", "status": [{"failures": 0, "panics": 1, "dropped": 0, "last_error": None}]},
            {"id": "other-t2", "status": [{"failures": 5, "panics": 0, "dropped": 0, "last_error": "not ours"}]},
            {"id": "bu-failed-t1", "state": "failed", "error": "did not load"},
        ]
    )
    assert bench_udl.failures(c, "t1") == (4, "/k: refused")
    # Leaving out a graph counted elsewhere.
    assert bench_udl.failures(c, "t1", skip="bu-py-") == (1, None)
    bench_udl.warn_failures({"failed_calls": 4, "last_error": "/k: refused"})
    assert "WARNING: 4 lambda calls failed" in capsys.readouterr().err
    bench_udl.warn_failures({"failed_calls": 0, "last_error": None})
    assert capsys.readouterr().err == ""


def test_the_client_benchmark_measures_both_asyncio_modes_and_the_rust_client(node):
    # `sluice bench python`'s Python side, briefly: every client puts, in
    # rounds, and the ratio reported is that of the mode io="auto" picks.
    p = subprocess.run(
        [sys.executable, "-m", "sluice.bench", "--addr", node.addr, "--gets", "200",
         "--seconds", "0.6", "--rounds", "2", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    puts, cpu = r["put_ops_per_s"], r["put_cpu_us"]
    for k in ("python", "python_loop", "rust"):
        assert puts[k] > 0 and cpu[k] > 0, (k, puts, cpu)
    assert puts["default_io"] == sluice.default_io()
    chosen = puts["python_loop"] if puts["default_io"] == "loop" else puts["python"]
    assert puts["ratio_default"] == pytest.approx(chosen / puts["rust"])
    assert r["rounds"] == 2
    bad = subprocess.run(
        [sys.executable, "-m", "sluice.bench", "--addr", node.addr, "--rounds", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "--rounds must be at least 1" in bad.stderr


def test_the_cpu_per_put_benchmark_measures_the_package_it_runs(node):
    # `sluice.bench_cpu`, which `scripts/pair-python-builds` runs over two
    # builds at once: it puts, and counts CPU and switches per put.
    r = subprocess.run(
        [sys.executable, "-m", "sluice.bench_cpu", "--addr", node.addr, "--io", "loop",
         "--seconds", "0.8", "--tasks", "4", "--size", "1024", "--node-pid", str(node.proc.pid), "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["io"] == "loop" and out["puts"] > 0 and out["ops_per_s"] > 0
    assert out["client_cpu_us"] > 0 and out["node_cpu_us"] is not None
    assert out["package"] == str(Path(sluice.__file__).parent)
    bad = subprocess.run(
        [sys.executable, "-m", "sluice.bench_cpu", "--addr", node.addr, "--tasks", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "--tasks must be at least 1" in bad.stderr
