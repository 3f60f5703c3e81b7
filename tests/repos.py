"""Small model repositories the integration tests write for themselves."""

from __future__ import annotations

from pathlib import Path

from shoal import modelgen


def write_identity(
    repo: Path, name: str, extra: str = "", dims: str = "[ 4 ]", mbs: int = 8
) -> None:
    """An FP32 identity model (INPUT0 -> OUTPUT0) that batches, with ``extra`` config text
    (dynamic_batching, instance_group, metric_tags...) after its inputs and outputs."""
    modelgen.write_model(
        repo, name, modelgen.identity_model("FP32", [-1], batch=True),
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {mbs}\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }} ]\n{extra}',
    )  # fmt: skip
