"""TYPE_STRING tensors of a TorchScript model, on TorchBackend in this process: a batch's
strings reach forward as one List[str]; a List[str] output answers [len] BYTES; what
torch cannot take is refused clearly (the served case: tests/integration/
test_torch_backend.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shoal.configs.model_config import parse_config_text
from shoal.configs.spec_reader import read_spec
from shoal.ipc.errors import Code, ServingError

torch_backend = pytest.importorskip("shoal.workers.torch_backend")
torchgen = pytest.importorskip("tools.torchgen")

_IO = (
    'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },'
    ' { name: "SCALE" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
    'output [ { name: "SHOUTED" data_type: TYPE_STRING dims: [ 1 ] },'
    ' { name: "LENGTH" data_type: %s dims: [ 1 ] } ]\n'
)


def _backend(tmp_path: Path, length_type: str = "TYPE_INT64", file: str = "model.pt") -> object:
    (tmp_path / file).write_bytes(torchgen.shout_model())
    config = parse_config_text(
        f'name: "m"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n{_IO % length_type}', "m"
    )
    backend = torch_backend.TorchBackend()
    backend.load(tmp_path / file, read_spec(config), 1, False)
    return backend


def test_a_batch_of_strings_is_one_list(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    text = np.array([[b"ab"], [b"cde"]], dtype=object)  # [batch 2, 1]
    shouted, length = backend.execute(  # type: ignore[attr-defined]
        {"TEXT": text, "SCALE": np.array([[1], [1]], dtype=np.int64)}, ["SHOUTED", "LENGTH"]
    )
    assert shouted.dtype == object and shouted.tolist() == [b"AB!", b"CDE!"]
    # [2] lengths times SCALE [2, 1]: torch broadcasts
    assert length.tolist() == [[2, 3], [2, 3]]


def test_bytes_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    with pytest.raises(ServingError) as err:
        backend.execute(  # type: ignore[attr-defined]
            {
                "TEXT": np.array([[b"ok"], [b"\xff"]], dtype=object),
                "SCALE": np.ones((2, 1), np.int64),
            },
            ["SHOUTED"],
        )
    assert err.value.code == Code.INVALID_ARG
    assert "BYTES input 'TEXT' element 1 is not valid UTF-8" in err.value.message


def test_a_tensor_for_a_string_output_is_refused(tmp_path: Path) -> None:
    backend = _backend(tmp_path, "TYPE_STRING")  # LENGTH is a tensor, not List[str]
    with pytest.raises(ServingError) as err:
        backend.execute(  # type: ignore[attr-defined]
            {"TEXT": np.array([[b"a"]], dtype=object), "SCALE": np.ones((1, 1), np.int64)},
            ["LENGTH"],
        )
    assert err.value.code == Code.INVALID_ARG
    assert "must return a List[str] for it, not Tensor of INT64" in err.value.message


def test_a_pt2_archive_takes_no_strings(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TYPE_STRING, which a PyTorch 2 archive cannot take"):
        _backend(tmp_path, file="model.pt2")


def test_an_argument_that_is_neither_tensor_nor_list_fails_the_load(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(torchgen.takes_int_model())
    config = parse_config_text(
        'name: "m"\nplatform: "pytorch_libtorch"\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] },'
        ' { name: "TIMES" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n',
        "m",
    )
    with pytest.raises(ValueError) as err:
        torch_backend.TorchBackend().load(tmp_path / "model.pt", read_spec(config), 1, False)
    assert str(err.value) == (
        "An input of type 'int' was detected in the model. Only a single input of type "
        "Dict(str, Tensor) or input(s) of type Tensor are supported."
    )
