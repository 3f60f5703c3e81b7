"""OpenVINO IR models for tests and benchmarks, built from small ONNX graphs (needs onnx and
openvino; the server imports this never).

``mlp_onnx(features, outputs, batch)``: ``Y = relu(X @ W)``, X FP32 [batch, features], W
fixed by ``weights(features, outputs)``; ``batch`` is a number or a name (dynamic).
``write_ir(repo, name, onnx_bytes, config_text, layout=...)`` converts it with OpenVINO
into ``<repo>/<name>/1/model.xml`` + ``model.bin`` (FP32 weights kept), giving every input
and output the layout ``layout`` when set (what OpenVINO's auto-complete reads for
batching), and writes ``config.pbtxt`` when given.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper


def weights(features: int, outputs: int) -> np.ndarray:
    return np.random.default_rng(3).standard_normal((features, outputs)).astype(np.float32)


def mlp_onnx(features: int = 8, outputs: int = 4, batch: int | str = "N", hidden: int = 0) -> bytes:
    """One MatMul and a ReLU (``hidden`` > 0: two MatMuls with a ReLU between, of that
    width, for a model with some compute)."""
    nodes, inits = [], []
    if hidden:
        w1 = np.random.default_rng(4).standard_normal((features, hidden)).astype(np.float32)
        w2 = np.random.default_rng(5).standard_normal((hidden, outputs)).astype(np.float32)
        nodes = [
            helper.make_node("MatMul", ["X", "W1"], ["H"]),
            helper.make_node("Relu", ["H"], ["R"]),
            helper.make_node("MatMul", ["R", "W2"], ["Y"]),
        ]
        inits = [
            helper.make_tensor("W1", TensorProto.FLOAT, list(w1.shape), w1.ravel()),
            helper.make_tensor("W2", TensorProto.FLOAT, list(w2.shape), w2.ravel()),
        ]
    else:
        w = weights(features, outputs)
        nodes = [
            helper.make_node("MatMul", ["X", "W"], ["H"]),
            helper.make_node("Relu", ["H"], ["Y"]),
        ]
        inits = [helper.make_tensor("W", TensorProto.FLOAT, [features, outputs], w.ravel())]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, outputs])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def reference(x: np.ndarray, features: int = 8, outputs: int = 4) -> np.ndarray:
    """What ``mlp_onnx(features, outputs)`` computes, in FP32."""
    return np.maximum(x.astype(np.float32) @ weights(features, outputs), 0)


def write_ir(
    repo: Path,
    name: str,
    onnx_bytes: bytes,
    config_text: str | None,
    layout: str | None = None,
) -> Path:
    """The IR in ``<repo>/<name>/1/``; returns its ``model.xml``."""
    import openvino as ov

    version = Path(repo) / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:  # (not beside the IR: a model.onnx there
        source = Path(tmp) / "model.onnx"  # would make the folder an ONNX Runtime model)
        source.write_bytes(onnx_bytes)
        model = ov.Core().read_model(str(source))
    if layout is not None:
        for param in model.get_parameters():
            param.set_layout(ov.Layout(layout))
        for result in model.get_results():
            result.set_layout(ov.Layout(layout))
    xml = version / "model.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    if config_text is not None:
        (Path(repo) / name / "config.pbtxt").write_text(config_text)
    return xml
