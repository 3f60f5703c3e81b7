"""PyTorch 2 archives in process: Triton's names for the leaves of a call specification,
the binding of config names to them, and Triton's TorchScript switches applied."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils import _pytree as pytree

from shoal.configs.model_config import ConfigError, parse_config_text
from shoal.configs.spec_reader import read_spec
from shoal.workers.torch_backend import TorchBackend
from shoal.workers.torch_pt2 import Pt2Model, leaf_names
from tools import torchgen


def test_input_and_result_paths_as_triton_writes_them() -> None:
    args = (torch.ones(1), {"keyA": torch.ones(1), "key2": torch.ones(1)})
    kwargs = {"kwarg1": torch.ones(1)}
    _, in_spec = pytree.tree_flatten((args, kwargs))
    assert leaf_names(in_spec, "ARGS") == [
        "ARGS[0]", "ARGS[1][keyA]", "ARGS[1][key2]", "KWARGS[kwarg1]",
    ]  # fmt: skip
    result = {"AAA": torch.ones(1), "ZZZ": torch.ones(1), "BBB": (torch.ones(1), torch.ones(1))}
    _, out_spec = pytree.tree_flatten(result)
    assert leaf_names(out_spec, "RESULT") == [
        "RESULT[AAA]", "RESULT[ZZZ]", "RESULT[BBB][0]", "RESULT[BBB][1]",
    ]  # fmt: skip
    _, lone = pytree.tree_flatten(torch.ones(1))
    assert leaf_names(lone, "RESULT") == ["RESULT"]


def test_config_names_bind_by_path_or_ordinal(tmp_path: Path) -> None:
    path = tmp_path / "model.pt2"
    path.write_bytes(torchgen.exported_nested())
    program = Pt2Model(path, torch.device("cpu"))
    assert program.kind == "ExportedProgram"
    program.bind("m", ["INPUT__2", "ARGS[1][k]", "ARGS[0]"], ["OUTPUT__1", "RESULT[sum]"])
    x = torch.arange(6.0).reshape(2, 3)
    out = program({"ARGS[0]": x, "ARGS[1][k]": x + 1, "INPUT__2": torch.full((2, 3), 3.0)})
    torch.testing.assert_close(out["OUTPUT__1"], x * 3)  # RESULT[pair][0]
    torch.testing.assert_close(out["RESULT[sum]"], 2 * x + 1)
    with pytest.raises(ConfigError, match="configuration expects 2 inputs, model provides 3"):
        program.bind("m", ["ARGS[0]", "INPUT__1"], [])


def _script_backend(tmp_path: Path, **params: str) -> TorchBackend:
    (tmp_path / "model.pt").write_bytes(torchgen.grad_model())
    entries = "".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items()
    )
    text = (
        'name: "m" platform: "pytorch_libtorch" max_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n' + entries
    )
    backend = TorchBackend()
    backend.load(tmp_path / "model.pt", read_spec(parse_config_text(text, "m")), 1, False)
    return backend


def test_torchscript_switches_reach_torch(tmp_path: Path) -> None:
    try:
        backend = _script_backend(
            tmp_path, DISABLE_OPTIMIZED_EXECUTION="true", INFERENCE_MODE="false"
        )
        assert torch._C._get_graph_executor_optimize() is False
        (out,) = backend.execute({"INPUT0": np.ones((1, 2), np.float32)}, ["OUTPUT__0"])
        np.testing.assert_array_equal(out, [[0, 0]])  # not in inference mode
    finally:
        torch._C._set_graph_executor_optimize(True)
    _script_backend(tmp_path)
    assert torch._C._get_graph_executor_optimize() is True
