"""Outputs written in place: ONNX Runtime writes a lone request's output straight where
it goes (the frontend's slot, the client's region) and the worker copies nothing after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shoal.configs.model_spec import ModelSpec
from shoal.ipc import shm
from shoal.ipc.messages import INLINE_MAX_BYTES, OutputSpec
from shoal.workers.onnx_backend import OnnxRuntimeBackend
from shoal.workers.tensors import output_destination, output_ref
from tools import modelgen

N = 8192  # 32 KiB of FP32: above the inline limit
assert N * 4 > INLINE_MAX_BYTES


@pytest.fixture
def backend(tmp_path: Path) -> OnnxRuntimeBackend:
    model = tmp_path / "identity.onnx"
    model.write_bytes(modelgen.identity_model("FP32", [-1], batch=True))
    b = OnnxRuntimeBackend()
    b.load(model, ModelSpec(""), 1, False)
    return b


@pytest.fixture
def slot() -> Iterator[tuple[shm.Slot, shm.RegionMap]]:
    pool = shm.SlabPool("test", 1 << 20)
    regions = shm.RegionMap()
    s = pool.alloc(N * 4)
    yield s, regions
    regions.close()
    pool.free(s)
    pool.close()


def test_the_model_writes_its_output_into_the_destination(
    backend: OnnxRuntimeBackend, slot: tuple[shm.Slot, shm.RegionMap]
) -> None:
    s, regions = slot
    spec = OutputSpec("OUTPUT0", s.region, s.offset, s.nbytes)
    dest = output_destination("OUTPUT0", "FP32", [1, N], spec, regions, {})
    assert dest is not None and dest.shape == (1, N) and dest.flags.writeable
    x = np.arange(N, dtype=np.float32).reshape(1, N)
    (out,) = backend.execute({"INPUT0": x}, ["OUTPUT0"], {"OUTPUT0": dest})
    assert out is dest
    np.testing.assert_array_equal(np.frombuffer(s.view, dtype=np.float32), x.ravel())
    # The answer points at the slot; writing it there again would copy onto itself.
    s.view[:4] = b"\xff" * 4  # a copy would put the model's bytes back over this
    ref = output_ref("OUTPUT0", "FP32", out, spec, regions, {})
    assert (ref.region, ref.offset, ref.nbytes, ref.data) == (s.region, s.offset, N * 4, None)
    assert bytes(s.view[:4]) == b"\xff" * 4


def test_an_output_shape_the_model_disagrees_with_falls_back_to_a_plain_run(
    backend: OnnxRuntimeBackend, slot: tuple[shm.Slot, shm.RegionMap]
) -> None:
    """The config said one shape, the model made another: the run is repeated without
    destinations and its own result comes back (then written like any other)."""
    s, regions = slot
    spec = OutputSpec("OUTPUT0", s.region, s.offset, s.nbytes)
    dest = output_destination("OUTPUT0", "FP32", [2, N // 2], spec, regions, {})
    assert dest is not None
    x = np.arange(N, dtype=np.float32).reshape(1, N)
    (out,) = backend.execute({"INPUT0": x}, ["OUTPUT0"], {"OUTPUT0": dest})
    assert out is not dest and out.shape == (1, N)
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize(
    ("datatype", "shape", "nbytes", "why"),
    [
        ("FP32", [1, 16], 64, "small enough to travel inline"),
        ("FP32", [1, N], N * 4 - 4, "does not fit the slot"),
        ("BYTES", [1, N], N * 4, "no fixed size"),
        ("BF16", [1, N], N * 2, "no numpy type: written by the worker"),
    ],
)
def test_no_destination_where_the_output_will_not_land_as_is(
    slot: tuple[shm.Slot, shm.RegionMap], datatype: str, shape: list[int], nbytes: int, why: str
) -> None:
    s, regions = slot
    spec = OutputSpec("OUTPUT0", s.region, s.offset, nbytes)
    assert output_destination("OUTPUT0", datatype, shape, spec, regions, {}) is None, why
    assert output_destination("OUTPUT0", datatype, shape, None, regions, {}) is None


def test_a_graph_output_that_is_a_graph_input_comes_back_as_its_value(tmp_path: Path) -> None:
    """ONNX Runtime hands such an output back as the input's own value and leaves the
    bound buffer alone: the backend must return that value, not the untouched buffer."""
    from onnx import TensorProto, checker, helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 4])
    graph = helper.make_graph([helper.make_node("Neg", ["X"], ["Y"])], "pass", [x], [x, y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", modelgen.OPSET)])
    model.ir_version = modelgen.IR_VERSION
    checker.check_model(model)
    path = tmp_path / "pass.onnx"
    path.write_bytes(model.SerializeToString())
    b = OnnxRuntimeBackend()
    b.load(path, ModelSpec(""), 1, False)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    dest_x = np.full((2, 4), -7, dtype=np.float32)
    dest_y = np.zeros((2, 4), dtype=np.float32)
    out_x, out_y = b.execute({"X": data}, ["X", "Y"], {"X": dest_x, "Y": dest_y})
    np.testing.assert_array_equal(out_x, data)
    assert out_y is dest_y
    np.testing.assert_array_equal(dest_y, -data)


def test_an_output_the_model_reshapes_is_no_longer_bound(
    backend: OnnxRuntimeBackend, slot: tuple[shm.Slot, shm.RegionMap]
) -> None:
    """After one run in which the model disagreed with a destination's shape, that output
    is not bound again: one extra run, not one per request."""
    s, regions = slot
    spec = OutputSpec("OUTPUT0", s.region, s.offset, s.nbytes)
    x = np.arange(N, dtype=np.float32).reshape(1, N)
    wrong = output_destination("OUTPUT0", "FP32", [2, N // 2], spec, regions, {})
    assert wrong is not None
    backend.execute({"INPUT0": x}, ["OUTPUT0"], {"OUTPUT0": wrong})
    right = output_destination("OUTPUT0", "FP32", [1, N], spec, regions, {})
    assert right is not None
    (out,) = backend.execute({"INPUT0": x}, ["OUTPUT0"], {"OUTPUT0": right})
    assert out is not right  # ONNX Runtime's own array now, copied by output_ref
    np.testing.assert_array_equal(out, x)
