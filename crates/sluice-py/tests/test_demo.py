"""The Python demo pipeline: two Python lambdas classify scikit-learn's
held-out digits with the accuracy the model has offline."""

import pytest

pytest.importorskip("sklearn")

from sluice import demo  # noqa: E402


def test_the_python_demo_matches_the_offline_accuracy(node, capsys):
    acc, offline = demo.main(["--addr", node.addr, "--images", "120", "--rate", "400", "--check"])
    assert acc == offline and acc > 0.85
    out = capsys.readouterr().out
    assert "latency breakdown per stage" in out and "/pydemo/features" in out
