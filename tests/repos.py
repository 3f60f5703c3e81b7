"""Small model repositories the integration tests write for themselves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tools import modelgen

#: An ensemble ``ens`` of one step: ``simple``'s OUTPUT0 (IN0 + IN1) as its OUT.
SIMPLE_ENSEMBLE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "IN1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "simple" model_version: -1
  input_map { key: "INPUT0" value: "IN0" } input_map { key: "INPUT1" value: "IN1" }
  output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""


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


def infer_identity(url: str, model: str, value: float, dims: int = 4) -> np.ndarray:
    """One request over HTTP to a ``write_identity`` model: [1, dims] of ``value``; its
    OUTPUT0."""
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    inp = httpclient.InferInput("INPUT0", [1, dims], "FP32")
    inp.set_data_from_numpy(np.full((1, dims), value, dtype=np.float32))
    try:
        return client.infer(model, [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()  # in the calling thread: gevent's hub cannot close it from another
