"""Loading a model instance (shoal/workers/loading.py), without a broker: the config found and
completed, the backend loaded, what its batches need read from the config."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.model_config import ConfigError
from shoal.configs.spec_reader import read_spec
from shoal.workers import loading
from shoal.workers.batch_io import BatchAssembler
from shoal.workers.loading import LoadedModel, WorkerSettings
from tests.repos import write_identity


def test_an_onnx_model_loads_with_its_instance_s_threads(tmp_path: Path) -> None:
    write_identity(tmp_path, "ident")
    started: list[bool] = []
    settings = WorkerSettings(tmp_path, "ident", 1, 0, tmp_path, cores=[0, 1])
    loaded = loading.load(settings, lambda: started.append(True))
    try:
        assert loaded.spec.name == "ident" and loaded.spec.max_batch_size == 8
        assert pb.ModelConfig.FromString(loaded.config_bytes).name == "ident"
        assert loaded.threads == 2 and loaded.sequence is None
        assert loaded.output_types == {"OUTPUT0": "FP32"}
        assert loaded.output_dims == {"OUTPUT0": [4]}
        assert started == []  # only a Python model gets a scripting client
    finally:
        loaded.backend.unload()


def test_a_model_that_is_not_there_fails_to_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        loading.load(WorkerSettings(tmp_path, "absent", 1, 0, tmp_path), lambda: None)
    assert "no such model directory" in err.value.message


def test_only_outputs_of_a_shape_known_before_the_run_may_be_written_in_place() -> None:
    config = read_spec(
        text_format.Parse(
            """name: "m" max_batch_size: 4
        input [ { name: "I" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "FIXED" data_type: TYPE_FP32 dims: [ 2, 3 ] },
                 { name: "VARIABLE" data_type: TYPE_INT64 dims: [ -1 ] },
                 { name: "RESHAPED" data_type: TYPE_FP32 dims: [ 6 ]
                   reshape { shape: [ 2, 3 ] } },
                 { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]""",
            pb.ModelConfig(),
        )
    )
    loaded = LoadedModel.of(object(), config, 0, BatchAssembler.from_config(config))  # type: ignore[arg-type]
    assert loaded.output_dims == {"FIXED": [2, 3], "TEXT": [1]}
    assert loaded.output_types == {
        "FIXED": "FP32", "VARIABLE": "INT64", "RESHAPED": "FP32", "TEXT": "BYTES"
    }  # fmt: skip
