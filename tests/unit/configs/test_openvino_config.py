"""An OpenVINO model's parameters and auto-complete, as Triton's OpenVINO backend reads and
completes them."""

from __future__ import annotations

import pytest

from shoal.configs.devices import cpu_only_backends
from shoal.configs.model_config import ConfigError, ModelConfig, parse_config_text
from shoal.configs.openvino_config import (
    OvParams,
    OvTensor,
    autocomplete,
    ov_params,
    ov_properties,
)
from shoal.configs.schema import DEFAULT_MODEL_FILENAME, FILENAME_TO_BACKEND, KNOWN_BACKENDS


def config(extra: str = "", **params: str) -> ModelConfig:
    entries = "".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items()
    )
    return parse_config_text(f'name: "m" backend: "openvino"\n{extra}\n{entries}', "m")


def test_openvino_is_a_known_cpu_backend_of_model_xml() -> None:
    assert "openvino" in KNOWN_BACKENDS
    assert DEFAULT_MODEL_FILENAME["openvino"] == "model.xml"
    assert FILENAME_TO_BACKEND["model.xml"] == "openvino"
    assert "openvino" in cpu_only_backends()


def test_yes_parameters_are_yes_in_any_case_and_nothing_else() -> None:
    got = ov_params(
        config(
            SKIP_OV_DYNAMIC_BATCHSIZE="Yes", ENABLE_BATCH_PADDING="true", RESHAPE_IO_LAYERS="YES"
        )
    )
    assert got == OvParams(skip_dynamic_batch=True, batch_padding=False, reshape_io=True)
    assert ov_params(config(TARGET_DEVICE="cpu")).target_device == "CPU"


def test_properties_in_openvinos_names() -> None:
    got = ov_properties(
        config(
            INFERENCE_NUM_THREADS="2", NUM_STREAMS="auto", PERFORMANCE_HINT="Throughput",
            HINT_BF16="yes", COMPILATION_NUM_THREADS="1",
        )
    )  # fmt: skip
    assert got == {
        "INFERENCE_NUM_THREADS": 2,
        "COMPILATION_NUM_THREADS": 1,
        "INFERENCE_PRECISION_HINT": "bf16",
        "NUM_STREAMS": "AUTO",
        "PERFORMANCE_HINT": "THROUGHPUT",
    }
    assert ov_properties(config(NUM_STREAMS="3")) == {"NUM_STREAMS": "3"}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("INFERENCE_NUM_THREADS", "-1", "to be a non-negative number, got -1"),
        ("COMPILATION_NUM_THREADS", "2x", "to be a non-negative number, got 2x"),
        ("HINT_BF16", "NO", "to be YES, got no"),
        ("NUM_STREAMS", "Many", "to be either AUTO/NUMA/<int_value>, got many"),
        ("PERFORMANCE_HINT", "fast", "to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got fast"),
    ],
)
def test_a_bad_property_fails_with_tritons_message(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        ov_properties(config(**{key: value}))
    assert e.value.message == f"expected the parameter '{key}' {message}"


X = OvTensor("X", "TYPE_FP32", [-1, 8], has_batch=True)
Y = OvTensor("Y", "TYPE_FP16", [-1, 4], has_batch=True)


def test_a_model_with_batch_layouts_gets_the_default_max_batch_size() -> None:
    got, notes = autocomplete(config(), [X], [Y], default_max_batch_size=4)
    assert got.max_batch_size == 4
    assert list(got.dynamic_batching.preferred_batch_size) == [4]
    assert [(i.name, i.data_type, list(i.dims)) for i in got.input] == [("X", 11, [8])]
    assert [(o.name, o.data_type, list(o.dims)) for o in got.output] == [("Y", 10, [4])]
    assert "autofilled max_batch_size to 4 for model 'm'" in notes[0]


def test_max_batch_size_one_adds_no_dynamic_batching() -> None:
    got, _ = autocomplete(config(), [X], [Y], default_max_batch_size=0)
    assert got.max_batch_size == 1 and not got.HasField("dynamic_batching")


def test_a_model_without_batch_layouts_keeps_its_shapes() -> None:
    plain = OvTensor("X", "TYPE_FP32", [-1, 8], has_batch=False)
    got, notes = autocomplete(config(), [plain], [Y], default_max_batch_size=4)
    assert got.max_batch_size == 0
    assert list(got.input[0].dims) == [-1, 8]
    assert notes == []
    _, warned = autocomplete(config("max_batch_size: 2"), [plain], [Y], 4)
    assert "does not support batching while non-zero max_batch_size" in warned[0]


def test_listed_tensors_are_left_as_they_are() -> None:
    listed = config('input [ { name: "X" data_type: TYPE_FP16 dims: [ 8 ] } ]')
    got, notes = autocomplete(listed, [X], [Y], 4)
    assert [(i.name, i.data_type) for i in got.input] == [("X", 10)]  # not filled again
    assert [o.name for o in got.output] == ["Y"]
    assert any("skipping input model configuration auto-complete" in n for n in notes)


def test_a_type_triton_has_none_for_is_invalid() -> None:
    odd = OvTensor("X", "", [-1, 8], has_batch=False)
    got, _ = autocomplete(config(), [odd], [Y], 4)
    assert got.input[0].data_type == 0  # TYPE_INVALID: the load then refuses it
