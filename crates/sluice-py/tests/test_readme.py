"""The README's Python examples run as written (against the test node):
the client in ten lines, and the lambda with its data flow graph."""

import json
import re
import time
import uuid
from pathlib import Path

import pytest

import sluice

README = Path(__file__).resolve().parents[3] / "README.md"


def blocks(lang):
    text = README.read_text()
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_the_client_in_ten_lines(node, capsys):
    pytest.importorskip("numpy")
    code = blocks("python")[0]
    assert len(code.strip().splitlines()) <= 10
    exec(compile(code.replace("127.0.0.1:7420", node.addr), "README client", "exec"), {})
    out = capsys.readouterr().out
    assert "put /vol/frame/1" in out and "/vol/missing" in out


def test_the_lambda_in_fifteen_lines(node, client, tmp_path):
    code = blocks("python")[1]
    assert len(code.strip().splitlines()) <= 15
    udls = tmp_path / "udls"
    udls.mkdir()
    (udls / "shout.py").write_text(code)
    graph = json.loads(blocks("json")[0].replace("/abs/path/udls", str(udls)))
    name = uuid.uuid4().hex[:6]
    graph[0]["id"] = f"shout-{name}"
    # The README's paths, moved under a fresh pool so the test runs alone.
    text = json.dumps(graph).replace("/trig/in", f"/trig/in-{name}").replace("/vol/out", f"/vol/out-{name}")
    client.dfg_apply(text)
    client.trigger_put(f"/trig/in-{name}/a", b"hello")
    deadline = time.monotonic() + 30
    while True:
        try:
            assert client.get(f"/vol/out-{name}/a").value == b"HELLO"
            assert client.get("/vol/seen/a").value == b"hello"
            break
        except sluice.NotFound:
            assert time.monotonic() < deadline, "the README's lambda gave no output"
            time.sleep(0.02)
