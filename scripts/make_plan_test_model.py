"""Writes crates/sluice-cli/tests/fixtures/plan/relu.onnx: y = Relu(x) for a
float matrix of any size (n, d). The plan end-to-end test stores it under every
model key a plan chooses, so each exported `onnx` stage runs a real model
on whatever `.npy` tensor reaches it (needs `pip install onnx`; not run in
CI, the file is committed)."""

import pathlib

import onnx
from onnx import TensorProto, helper

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "d"])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "d"])
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="sluice")
model.ir_version = 8
onnx.checker.check_model(model)
out = pathlib.Path(__file__).resolve().parent.parent / "crates/sluice-cli/tests/fixtures/plan/relu.onnx"
out.write_bytes(model.SerializeToString())
print(f"wrote {out} ({out.stat().st_size} bytes)")
