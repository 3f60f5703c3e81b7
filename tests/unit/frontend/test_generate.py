"""The generate extension's request mapping (shoal/frontend/generate.py), without a server."""

from __future__ import annotations

import json

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from shoal.dataplane.model_handle import ModelHandle
from shoal.dataplane.types import InferenceResult, OutputTensor
from shoal.frontend import generate
from shoal.ipc.errors import ServingError


@pytest.mark.parametrize(
    ("dims", "batching", "count", "shape"),
    [
        ((1,), False, 1, [1]),
        ((1,), False, 2, None),  # fixed dims hold exactly their count
        ((-1,), False, 3, [3]),
        ((-1,), False, 0, [0]),
        ((2, -1), False, 6, [2, 3]),
        ((2, -1), False, 5, None),
        ((-1, -1), False, 4, [4, 1]),  # the first variable dim takes them
        ((-1,), True, 3, [1, 3]),  # a batching model's request is one sample
        ((3,), True, 3, [1, 3]),
    ],
)
def test_an_input_is_shaped_by_its_config_dims(
    dims: tuple[int, ...], batching: bool, count: int, shape: list[int] | None
) -> None:
    assert generate._shape(dims, batching, count) == shape


def _model() -> ModelHandle:
    cfg = mc.ModelConfig(name="m", backend="python")
    cfg.input.add(name="text_input", data_type=mc.TYPE_STRING, dims=[1])
    cfg.input.add(name="n", data_type=mc.TYPE_INT32, dims=[-1])
    cfg.output.add(name="out", data_type=mc.TYPE_FP32, dims=[-1])
    return ModelHandle("m", 1, [1], cfg.SerializeToString())


def test_keys_become_inputs_or_parameters_and_the_later_parameter_wins() -> None:
    doc = {"a": 1, "text_input": "hi", "id": "x", "parameters": {"n": [1, 2], "a": True}}
    req = generate.decode_request(doc, _model(), "")
    assert (req.id, req.parameters) == ("x", {"a": True, "id": "x"})
    assert {t.name: (t.datatype, t.shape) for t in req.inputs} == {
        "text_input": ("BYTES", [1]),
        "n": ("INT32", [2]),
    }


def test_a_parameter_of_another_type_is_refused() -> None:
    with pytest.raises(ServingError) as err:
        generate.decode_request({"text_input": "a", "parameters": {"k": None}}, _model(), "")
    assert err.value.message == (
        "Converting keyword: 'parameters': parameter 'k' has invalid type. It should be "
        "either 'int', 'bool', or 'string'."
    )


def test_a_response_is_one_flat_object_with_sorted_keys() -> None:
    result = InferenceResult(
        "m", "1", "", [
            OutputTensor("z", "FP32", [2], memoryview(b"\0\0\0?\0\0\xa0?"), {}),
            OutputTensor("b", "BYTES", [1], memoryview(b"\2\0\0\0hi"), {}),
        ],
    )  # fmt: skip
    body = generate.encode_response(result)
    assert body == b'{"b":"hi","model_name":"m","model_version":"1","z":[0.5,1.25]}'
    assert json.loads(body)["z"] == [0.5, 1.25]
