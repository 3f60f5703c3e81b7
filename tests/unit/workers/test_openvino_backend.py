"""The OpenVINO backend in process: Triton's dimension checks on OpenVINO's partial shapes,
the KIND_GPU refusal, and a fixed batch padded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from shoal.configs.model_config import ConfigError, fill_defaults, parse_config_text
from shoal.configs.spec_reader import read_spec
from shoal.ipc.errors import ServingError
from shoal.workers.openvino_backend import OpenVinoBackend, _compare_dims
from tools import ovgen


def shape(*dims: int | tuple[int, int]) -> ov.PartialShape:
    return ov.PartialShape(
        [ov.Dimension(*d) if isinstance(d, tuple) else ov.Dimension(d) for d in dims]
    )


def test_inputs_skip_the_batch_dim_and_minus_one_outputs_compare_every_dim() -> None:
    _compare_dims("m", "X", shape(1, 8), [8], 4, exact=False)  # batch 1 vs 4: not compared
    _compare_dims("m", "X", shape(-1, 8), [-1], 4, exact=False)
    with pytest.raises(ConfigError, match=r"making complete shape \[4,-1\]\)$"):
        _compare_dims("m", "Y", shape(-1, 8), [-1], 4, exact=True)  # static 8 vs -1
    _compare_dims("m", "Y", shape(-1, -1), [3], 4, exact=True)  # dynamic takes anything


def test_without_batching_every_dim_is_compared_and_bounds_are_strict() -> None:
    _compare_dims("m", "X", shape(-1, 8), [-1, 8], 0, exact=False)
    with pytest.raises(ConfigError, match=r"expects 2 dimensions \(shape \[1,8\]\) but .* "
                       r"\(shape \[-1,8\]\)"):  # fmt: skip
        _compare_dims("m", "X", shape(1, 8), [-1, 8], 0, exact=False)
    _compare_dims("m", "X", shape((1, 10), 8), [5, 8], 0, exact=False)
    with pytest.raises(ConfigError):
        _compare_dims("m", "X", shape((1, 10), 8), [10, 8], 0, exact=False)


def test_a_gpu_instance_is_refused_as_triton_refuses_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="supports only Kind CPU and AUTO"):
        OpenVinoBackend().load(
            tmp_path / "model.xml", read_spec(parse_config_text('name: "m"', "m")), 1, True
        )


def test_a_fixed_batch_is_padded_and_its_answers_cut(tmp_path: Path) -> None:
    xml = ovgen.write_ir(tmp_path, "m", ovgen.mlp_onnx(), None)
    text = (
        'name: "m" backend: "openvino" max_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 8 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'parameters { key: "SKIP_OV_DYNAMIC_BATCHSIZE" value { string_value: "YES" } }\n'
    )
    strict = OpenVinoBackend()
    strict.load(xml, read_spec(fill_defaults(parse_config_text(text, "m"), "m")), 1, False)
    x = np.random.default_rng(0).random((3, 8), dtype=np.float32)
    with pytest.raises(ServingError, match="expected requests with batch size '4', got '3'"):
        strict.execute({"X": x}, ["Y"])
    padded = OpenVinoBackend()
    text += 'parameters { key: "ENABLE_BATCH_PADDING" value { string_value: "YES" } }\n'
    padded.load(xml, read_spec(fill_defaults(parse_config_text(text, "m"), "m")), 1, False)
    (got,) = padded.execute({"X": x}, ["Y"])
    assert got.shape == (3, 4)
    np.testing.assert_allclose(got, ovgen.reference(x), rtol=3e-2, atol=3e-2)
