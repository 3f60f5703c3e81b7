"""shoal's triton_python_backend_utils (workers/pb_utils.py): what Python models call."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import workers.python_backend  # noqa: F401  (registers the module under Triton's name)
from workers import pb_utils


def test_it_is_importable_under_tritons_name() -> None:
    import triton_python_backend_utils  # type: ignore[import-not-found]

    assert triton_python_backend_utils is pb_utils
    assert sys.modules["triton_python_backend_utils"] is pb_utils


def test_text_becomes_bytes_objects_as_in_triton() -> None:
    t = pb_utils.Tensor("T", np.array([["a", "bc"]]))
    assert t.as_numpy().dtype == object and t.as_numpy().tolist() == [[b"a", b"bc"]]
    assert t.name() == "T" and t.shape() == [1, 2] and t.is_cpu()
    with pytest.raises(pb_utils.TritonModelException):
        t.to_dlpack()


def test_getters_and_converters() -> None:
    req = pb_utils.InferenceRequest(
        [pb_utils.Tensor("A", np.ones(2, np.float32))], ["B"], parameters={"k": 1}
    )
    tensor = pb_utils.get_input_tensor_by_name(req, "A")
    assert tensor is not None and tensor.as_numpy().tolist() == [1.0, 1.0]
    assert pb_utils.get_input_tensor_by_name(req, "Z") is None
    assert req.requested_output_names() == ["B"] and json.loads(req.parameters()) == {"k": 1}
    config = {"output": [{"name": "B", "data_type": "TYPE_FP16"}]}
    assert pb_utils.get_output_config_by_name(config, "B") == config["output"][0]
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    resp = pb_utils.InferenceResponse([pb_utils.Tensor("B", np.zeros(1))])
    assert not resp.has_error() and pb_utils.get_output_tensor_by_name(resp, "B") is not None
    err = pb_utils.TritonError("no", pb_utils.TritonError.INVALID_ARG)
    assert (err.message(), err.code()) == ("no", 3)
    with pytest.raises(pb_utils.TritonModelException, match="business logic scripting"):
        req.exec()
