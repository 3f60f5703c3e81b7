"""Triton's model_warmup as a worker builds and runs it (shoal.workers.warmup), without a
server: the samples' data, Triton's rules and messages, and the batches it runs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shoal.configs.model_config import parse_config_text
from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import ConfigError
from shoal.configs.spec_reader import read_spec
from shoal.ipc import datatypes
from shoal.workers import warmup
from shoal.workers.batch_io import BatchAssembler

SIMPLE = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def config(warmups: str, io: str = SIMPLE) -> ModelSpec:
    return read_spec(
        parse_config_text(f'name: "m" platform: "onnxruntime_onnx" {io} {warmups}', "m")
    )


def sample(name: str, inputs: dict[str, str], batch_size: int = 1, count: int = 0) -> str:
    body = " ".join(f'inputs {{ key: "{k}" value: {{ {v} }} }}' for k, v in inputs.items())
    return f'model_warmup {{ name: "{name}" batch_size: {batch_size} count: {count} {body} }}'


ZERO16 = "data_type: TYPE_INT32 dims: [ 16 ] zero_data: true"
RANDOM16 = "data_type: TYPE_INT32 dims: [ 16 ] random_data: true"


def test_zero_and_random_data_with_the_batch_dimension(tmp_path: Path) -> None:
    (s,) = warmup.samples(
        config(sample("w", {"INPUT0": ZERO16, "INPUT1": RANDOM16}, 4, 3)), tmp_path, seed=1
    )
    assert (s.name, s.batch_size, s.count) == ("w", 4, 3)
    assert s.request["INPUT0"].shape == (1, 16) and s.request["INPUT0"].dtype == np.int32
    assert not s.request["INPUT0"].any()
    assert s.request["INPUT1"].shape == (1, 16) and s.request["INPUT1"].any()


def test_batch_size_zero_is_skipped_and_count_zero_runs_once(tmp_path: Path) -> None:
    text = sample("skipped", {"INPUT0": ZERO16, "INPUT1": ZERO16}, 0) + sample(
        "once", {"INPUT0": ZERO16, "INPUT1": ZERO16}, 1, 0
    )
    (s,) = warmup.samples(config(text), tmp_path)
    assert (s.name, s.count) == ("once", 1)


def test_a_model_that_does_not_batch_gets_the_dims_alone(tmp_path: Path) -> None:
    io = SIMPLE.replace("max_batch_size: 8", "max_batch_size: 0")
    (s,) = warmup.samples(config(sample("w", {"INPUT0": ZERO16, "INPUT1": ZERO16}), io), tmp_path)
    assert s.request["INPUT0"].shape == (16,)


def test_data_from_a_file_in_the_warmup_folder(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    values = np.arange(20, dtype="<i4")  # more than needed: the first 64 bytes serve
    (tmp_path / "warmup" / "in0").write_bytes(values.tobytes())
    data = "data_type: TYPE_INT32 dims: [ 16 ] input_data_file: 'in0'"
    (s,) = warmup.samples(config(sample("w", {"INPUT0": data, "INPUT1": ZERO16})), tmp_path)
    np.testing.assert_array_equal(s.request["INPUT0"], values[:16].reshape(1, 16))


BYTES_IO = """
max_batch_size: 4
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 3 ] },
        { name: "FLAG" data_type: TYPE_BOOL dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 3 ] } ]
"""


def test_bytes_from_a_file_and_as_empty_elements_and_random_bools(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "text").write_bytes(datatypes.serialize_bytes([b"a", b"", b"xyz"]))
    text = "data_type: TYPE_STRING dims: [ 3 ] input_data_file: 'text'"
    flag = "data_type: TYPE_BOOL dims: [ 2 ] random_data: true"
    (s,) = warmup.samples(config(sample("w", {"TEXT": text, "FLAG": flag}), BYTES_IO), tmp_path)
    assert s.request["TEXT"].tolist() == [[b"a", b"", b"xyz"]]
    assert s.request["FLAG"].dtype == np.bool_ and s.request["FLAG"].shape == (1, 2)
    random_text = "data_type: TYPE_STRING dims: [ 3 ] random_data: true"
    (s,) = warmup.samples(
        config(sample("w", {"TEXT": random_text, "FLAG": flag}), BYTES_IO), tmp_path
    )
    assert s.request["TEXT"].tolist() == [[b"", b"", b""]]  # Triton: zeros for strings


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            {"INPUT0": "data_type: TYPE_INT32 dims: [ -1 ] zero_data: true", "INPUT1": ZERO16},
            "warmup setting expects all variable-size dimensions are specified for input 'INPUT0'",
        ),
        (
            {"INPUT0": "data_type: TYPE_INT32 dims: [ 16 ]", "INPUT1": ZERO16},
            "warmup setting expects input 'INPUT0' to have input_data_type set",
        ),
        (
            {"INPUT0": ZERO16, "INPUT1": ZERO16, "EXTRA": ZERO16},
            "unexpected inference input 'EXTRA' for model 'm'",
        ),
        (
            {"INPUT0": "data_type: TYPE_FP32 dims: [ 16 ] zero_data: true", "INPUT1": ZERO16},
            "inference input 'INPUT0' data-type is 'FP32', but model 'm' expects 'INT32'",
        ),
        (
            {"INPUT0": "data_type: TYPE_INT32 dims: [ 8 ] zero_data: true", "INPUT1": ZERO16},
            "unexpected shape for input 'INPUT0' for model 'm'. Expected [-1,16], got [1,8]",
        ),
        ({"INPUT0": ZERO16}, "warmup sample 'w' is missing required input(s) 'INPUT1'"),
        (
            {"INPUT0": "data_type: TYPE_INT32 dims: [ 16 ] input_data_file: 'short'"},
            "warmup setting expects 64 bytes, but the data provided from short only has 8 bytes",
        ),
        (
            {"INPUT0": "data_type: TYPE_INT32 dims: [ 16 ] input_data_file: '../../../etc/x'"},
            "warmup input_data_file '../../../etc/x' for input 'INPUT0' is outside the model "
            "repository",
        ),
        (
            {"INPUT0": "data_type: TYPE_INT32 dims: [ 16 ] input_data_file: 'absent'"},
            "failed to read warmup data for input 'INPUT0' from warmup/absent: No such file",
        ),
    ],
)
def test_a_sample_that_cannot_be_built_says_why(
    tmp_path: Path, inputs: dict[str, str], message: str
) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "short").write_bytes(b"\x01" * 8)
    (tmp_path / "config.pbtxt").write_text("")
    with pytest.raises(ConfigError) as e:
        warmup.samples(config(sample("w", inputs)), tmp_path)
    assert message in e.value.message


def test_a_bytes_file_that_does_not_make_up_the_shape_is_refused(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "text").write_bytes(datatypes.serialize_bytes([b"a"]))
    text = "data_type: TYPE_STRING dims: [ 3 ] input_data_file: 'text'"
    flag = "data_type: TYPE_BOOL dims: [ 2 ] zero_data: true"
    with pytest.raises(ConfigError, match="expected 3 string elements for inference input 'TEXT'"):
        warmup.samples(config(sample("w", {"TEXT": text, "FLAG": flag}), BYTES_IO), tmp_path)


class Recorder:
    """Stands in for a backend's execute: what it was asked to run."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[dict[str, tuple[int, ...]], list[str]]] = []
        self.fail = fail

    def __call__(self, feeds: Mapping[str, Any], outputs: list[str]) -> list[Any]:
        self.calls.append(({k: v.shape for k, v in feeds.items()}, outputs))
        if self.fail is not None:
            raise self.fail
        return []


def test_a_sample_runs_count_times_as_one_batch_of_batch_size(tmp_path: Path) -> None:
    cfg = config(sample("w", {"INPUT0": ZERO16, "INPUT1": RANDOM16}, 5, 2))
    (s,) = warmup.samples(cfg, tmp_path)
    rec = Recorder()
    warmup.run(cfg, s, rec, BatchAssembler.from_config(cfg).gather)
    shapes = {"INPUT0": (5, 16), "INPUT1": (5, 16)}
    assert rec.calls == [(shapes, ["OUTPUT0", "OUTPUT1"])] * 2


def test_a_batch_over_the_models_maximum_fails_as_tritons_backends_do(tmp_path: Path) -> None:
    cfg = config(sample("big", {"INPUT0": ZERO16, "INPUT1": ZERO16}, 9))
    (s,) = warmup.samples(cfg, tmp_path)
    rec = Recorder()
    with pytest.raises(ConfigError) as e:
        warmup.run(cfg, s, rec, BatchAssembler.from_config(cfg).gather)
    assert e.value.message == (
        "failed to run warmup sample 'big': batch size 9 for 'm', max allowed is 8; "
    )
    assert rec.calls == []


def test_an_execution_that_fails_fails_the_warmup_with_its_message(tmp_path: Path) -> None:
    cfg = config(sample("w", {"INPUT0": ZERO16, "INPUT1": ZERO16}, 1, 3))
    (s,) = warmup.samples(cfg, tmp_path)
    rec = Recorder(RuntimeError("the model fell over"))
    with pytest.raises(ConfigError) as e:
        warmup.run(cfg, s, rec, BatchAssembler.from_config(cfg).gather)
    assert e.value.message == (
        "failed to run warmup sample 'w': RuntimeError: the model fell over; "
    )
    assert len(rec.calls) == 1  # the first failure ends it


def test_a_reshaped_input_reaches_the_model_reshaped_and_an_optional_one_may_be_left_out(
    tmp_path: Path,
) -> None:
    io = """
    max_batch_size: 2
    input [ { name: "IMG" data_type: TYPE_FP32 dims: [ 16 ] reshape: { shape: [ 4, 4 ] } },
            { name: "MASK" data_type: TYPE_FP32 dims: [ 16 ] optional: true } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """
    img = "data_type: TYPE_FP32 dims: [ 16 ] zero_data: true"
    (s,) = warmup.samples(config(sample("w", {"IMG": img}), io), tmp_path)
    assert list(s.request) == ["IMG"] and s.request["IMG"].shape == (1, 4, 4)


def test_a_warmup_file_may_be_a_link_to_data_shared_in_the_repository(tmp_path: Path) -> None:
    """As in Triton: the path is read as written, links followed (repositories share
    data across models so); only a path that leads out of the repository is refused."""
    model, shared = tmp_path / "m", tmp_path / "shared"
    (model / "warmup").mkdir(parents=True)
    shared.mkdir()
    values = np.arange(16, dtype="<i4")
    (shared / "in0").write_bytes(values.tobytes())
    (model / "warmup" / "in0").symlink_to(shared / "in0")
    via_link = "data_type: TYPE_INT32 dims: [ 16 ] input_data_file: 'in0'"
    via_parent = "data_type: TYPE_INT32 dims: [ 16 ] input_data_file: '../../shared/in0'"
    for data in (via_link, via_parent):
        (s,) = warmup.samples(config(sample("w", {"INPUT0": data, "INPUT1": ZERO16})), model)
        np.testing.assert_array_equal(s.request["INPUT0"], values.reshape(1, 16))
