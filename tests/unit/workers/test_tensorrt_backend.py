"""TensorRtBackend's load and execute paths on every machine, against stand-ins for
TensorRT's Python API and cupy (numpy memory, an "engine" that adds and subtracts through
the addresses it is given). They check what shoal does with the API (which profile runs a
batch, the shapes and addresses it binds, the copies back), not TensorRT itself:
tests/gpu/test_tensorrt.py runs real engines on a GPU host."""

from __future__ import annotations

import ctypes
import enum
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shoal.configs.model_config import parse_config_text
from shoal.configs.schema import ConfigError
from shoal.configs.spec_reader import read_spec
from shoal.ipc.errors import ServingError
from shoal.workers.tensorrt_backend import TensorRtBackend

DIM = 4
_GROUP = "instance_group [ {{ kind: KIND_GPU gpus: [ 0 ] profile: [ {} ] }} ]"
PROFILES = [((1, DIM), (2, DIM), (4, DIM)), ((1, DIM), (8, DIM), (16, DIM))]


class _Array:
    """A cupy stand-in: numpy memory with cupy's ``data.ptr``."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = np.ascontiguousarray(arr)
        self.shape, self.dtype = self.arr.shape, self.arr.dtype
        self.data = types.SimpleNamespace(ptr=self.arr.ctypes.data if self.arr.size else 0)

    def get(self, stream: object = None, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return self.arr.copy()
        out[...] = self.arr
        return out


class _Stream:
    ptr = 1234

    def __init__(self, non_blocking: bool = False) -> None: ...
    def synchronize(self) -> None: ...
    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None: ...


def _fake_cupy() -> types.ModuleType:
    cp = types.ModuleType("cupy")
    cp.cuda = types.SimpleNamespace(Stream=_Stream)  # type: ignore[attr-defined]
    cp.asarray = lambda a: _Array(np.asarray(a))  # type: ignore[attr-defined]
    cp.empty = lambda shape, dtype: _Array(np.empty(shape, dtype=dtype))  # type: ignore[attr-defined]
    cp.ascontiguousarray = lambda a: a  # type: ignore[attr-defined]
    return cp


def _view(ptr: int, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape))
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr)).reshape(shape)


class _Context:
    def __init__(self, log: list[Any]) -> None:
        self.log, self.shapes, self.addresses, self.profile = log, {}, {}, 0

    def set_optimization_profile_async(self, index: int, stream: int) -> bool:
        self.profile = index
        return index < len(PROFILES)

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        low, _, high = PROFILES[self.profile]
        self.shapes[name] = shape
        return all(lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True))

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shapes["INPUT0"]

    def set_tensor_address(self, name: str, ptr: int) -> None:
        self.addresses[name] = ptr

    def execute_async_v3(self, stream: int) -> bool:
        self.log.append((self.profile, self.shapes["INPUT0"]))
        shape = self.shapes["INPUT0"]
        a, b = (_view(self.addresses[n], shape) for n in ("INPUT0", "INPUT1"))
        _view(self.addresses["OUTPUT0"], shape)[:] = a + b
        _view(self.addresses["OUTPUT1"], shape)[:] = a - b
        return True


def _fake_tensorrt(log: list[Any]) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    mode = enum.Enum("TensorIOMode", "INPUT OUTPUT")
    dtype = enum.Enum("DataType", "FLOAT HALF")
    severity = enum.Enum("Severity", "INTERNAL_ERROR ERROR WARNING INFO VERBOSE")
    names = ["INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"]

    class Engine:
        num_io_tensors = 4
        num_optimization_profiles = len(PROFILES)

        def get_tensor_name(self, i: int) -> str:
            return names[i]

        def get_tensor_mode(self, name: str) -> Any:
            return mode.INPUT if name.startswith("INPUT") else mode.OUTPUT

        def get_tensor_dtype(self, name: str) -> Any:
            return dtype.FLOAT

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return (-1, DIM)

        def is_shape_inference_io(self, name: str) -> bool:
            return False

        def get_tensor_profile_shape(self, name: str, p: int) -> Any:
            return PROFILES[p]

        def create_execution_context(self, strategy: Any) -> _Context:
            return _Context(log)

    class Runtime:
        def __init__(self, logger: Any) -> None: ...
        def deserialize_cuda_engine(self, data: bytes) -> Any:
            return Engine() if data == b"plan" else None

    class ILogger:
        Severity = severity

        def __init__(self) -> None: ...

    trt.Runtime = Runtime  # type: ignore[attr-defined]
    trt.ILogger = ILogger  # type: ignore[attr-defined]
    trt.TensorIOMode = mode  # type: ignore[attr-defined]
    trt.ExecutionContextAllocationStrategy = enum.Enum(  # type: ignore[attr-defined]
        "ExecutionContextAllocationStrategy", "STATIC ON_PROFILE_CHANGE"
    )
    return trt


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    log: list[Any] = []
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(log))
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    return log


def _loaded(tmp_path: Path, body: str = "", plan: bytes = b"plan") -> TensorRtBackend:
    (tmp_path / "model.plan").write_bytes(plan)
    config = parse_config_text(f'name: "m"\nplatform: "tensorrt_plan"\n{body}', "m")
    backend = TensorRtBackend()
    backend.instance_name = "m_0"
    config = backend.auto_complete(tmp_path / "model.plan", config)
    backend.load(tmp_path / "model.plan", read_spec(config), 1, True)
    return backend


def test_auto_complete_and_io_from_the_engine(tmp_path: Path, stand_ins: list[Any]) -> None:
    (tmp_path / "model.plan").write_bytes(b"plan")
    backend = TensorRtBackend()
    config = parse_config_text('name: "m"\nplatform: "tensorrt_plan"', "m")
    completed = backend.auto_complete(tmp_path / "model.plan", config)
    assert completed.max_batch_size == 16
    ins, outs = backend.io_spec()
    assert [(s.name, s.datatype, s.shape) for s in ins] == [
        ("INPUT0", "FP32", [-1, DIM]), ("INPUT1", "FP32", [-1, DIM]),
    ]  # fmt: skip
    assert [s.name for s in outs] == ["OUTPUT0", "OUTPUT1"]


@pytest.mark.parametrize("group", ["", _GROUP.format('"0", "1"')])
def test_each_batch_runs_in_the_nearest_profiles_context(
    tmp_path: Path, stand_ins: list[Any], group: str
) -> None:
    """With the profiles listed, or none (then all of them, where Triton takes profile 0)."""
    backend = _loaded(tmp_path, group)
    for batch in (3, 12):
        a = np.arange(batch * DIM, dtype=np.float32).reshape(batch, DIM)
        b = np.ones((batch, DIM), dtype=np.float32)
        out0, out1 = backend.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
        assert isinstance(out0, np.ndarray)  # host inputs: answers copied down
        np.testing.assert_array_equal(out0, a + b)
        np.testing.assert_array_equal(out1, a - b)
    assert stand_ins == [(0, (3, DIM)), (1, (12, DIM))]


def test_a_batch_no_profile_takes_fails_with_tritons_message(
    tmp_path: Path, stand_ins: list[Any]
) -> None:
    backend = _loaded(tmp_path, _GROUP.format('"0", "1"'))
    big = np.zeros((17, DIM), dtype=np.float32)
    with pytest.raises(ServingError, match=r"failed to find any Optimization Profile among"):
        backend.execute({"INPUT0": big, "INPUT1": big}, ["OUTPUT0"])
    # a lone profile: TensorRT itself refuses the shape
    lone = _loaded(tmp_path, _GROUP.format('"0"'))
    with pytest.raises(ServingError, match=r"request specifies invalid shape for input 'INPUT0'"):
        lone.execute({"INPUT0": big[:5], "INPUT1": big[:5]}, ["OUTPUT0"])


def test_answers_are_copied_down_into_their_destinations(
    tmp_path: Path, stand_ins: list[Any]
) -> None:
    backend = _loaded(tmp_path)
    a = np.full((2, DIM), 3, np.float32)
    dest = np.zeros((2, DIM), np.float32)
    wrong = np.zeros((3, DIM), np.float32)  # not the answer's shape: not written
    out0, out1 = backend.execute(
        {"INPUT0": a, "INPUT1": a}, ["OUTPUT0", "OUTPUT1"], {"OUTPUT0": dest, "OUTPUT1": wrong}
    )
    assert out0 is dest
    np.testing.assert_array_equal(dest, a * 2)
    assert out1 is not wrong and not wrong.any()
    np.testing.assert_array_equal(out1, np.zeros((2, DIM), np.float32))


def test_device_inputs_are_bound_where_they_are_and_answers_stay_there(
    tmp_path: Path, stand_ins: list[Any]
) -> None:
    backend = _loaded(tmp_path)
    cp = sys.modules["cupy"]
    a = cp.asarray(np.full((2, DIM), 3, np.float32))
    b = cp.asarray(np.ones((2, DIM), np.float32))
    for arr in (a, b):
        arr.__cuda_array_interface__ = {}  # what marks a device array for the backend
    (out0,) = backend.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT0"])
    assert isinstance(out0, _Array)  # not copied down
    np.testing.assert_array_equal(out0.arr, np.full((2, DIM), 4, np.float32))


def test_a_plan_tensorrt_cannot_read_fails_the_load(tmp_path: Path, stand_ins: list[Any]) -> None:
    with pytest.raises(ConfigError, match="unable to create TensorRT engine"):
        _loaded(tmp_path, plan=b"junk")
    with pytest.raises(ConfigError, match=r"Expected optimization profile index range 0-1"):
        _loaded(tmp_path, _GROUP.format('"2"'))


def test_the_runtime_is_the_first_of_tensorrts_modules_that_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyPI's wheels name TensorRT's modules tensorrt_bindings and tensorrt_lean_bindings
    (NVIDIA's packages: tensorrt, tensorrt_lean): a host with only the lean runtime's
    wheels serves plans through it; one with none fails the load saying what to install."""
    from shoal.workers import tensorrt_backend

    for name in tensorrt_backend.RUNTIME_MODULES:
        monkeypatch.setitem(sys.modules, name, None)  # (import raises ImportError)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    with pytest.raises(RuntimeError) as err:
        _loaded(tmp_path)
    assert "tensorrt-lean-cu13-bindings and tensorrt-lean-cu13-libs" in str(err.value)
    monkeypatch.setitem(sys.modules, "tensorrt_lean_bindings", _fake_tensorrt([]))
    assert tensorrt_backend._runtime_module() is sys.modules["tensorrt_lean_bindings"]
    assert _loaded(tmp_path).io_spec()[0]
