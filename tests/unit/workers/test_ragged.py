"""Ragged inputs, batch inputs and batch outputs as a worker feeds them to the model and
splits its results (shoal.workers.batch_io), with no sockets: Triton's ONNX Runtime backend and
backend_input_collector / backend_output_responder are the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shoal.configs.model_config import parse_config_text
from shoal.configs.spec_reader import read_spec
from shoal.ipc.errors import Code, ServingError
from shoal.workers.batch_io import BatchAssembler, BatchInputKind, batch_input_value
from tools import modelgen

I32 = np.dtype("<i4")
F32 = np.dtype("<f4")


def ragged(*lengths: int, start: float = 1.0) -> list[dict[str, np.ndarray]]:
    """One feed per request: INPUT0 [1, length], consecutive values."""
    feeds, at = [], start
    for n in lengths:
        feeds.append({"INPUT0": np.arange(at, at + n, dtype=np.float32).reshape(1, n)})
        at += n
    return feeds


def assembler(text: str) -> BatchAssembler:
    return BatchAssembler.from_config(read_spec(parse_config_text(text, "m")))


RAGGED_SUM = assembler(modelgen.RAGGED_SUM_CONFIG.format(name="m", extra=""))


# -- ragged inputs ---------------------------------------------------------------------


def test_a_lone_request_ragged_input_is_flattened() -> None:
    # The bug: a batch of one passed [1, n] to a model that takes [-1].
    batch = BatchAssembler(ragged=frozenset({"INPUT0"})).gather(ragged(3))
    assert batch["INPUT0"].shape == (3,)
    np.testing.assert_array_equal(batch["INPUT0"], [1, 2, 3])


def test_ragged_requests_are_concatenated_flat_in_request_order() -> None:
    batch = BatchAssembler(ragged=frozenset({"INPUT0"})).gather(ragged(3, 5))
    assert batch["INPUT0"].shape == (8,)
    np.testing.assert_array_equal(batch["INPUT0"], np.arange(1, 9))


def test_ragged_input_with_more_dims_and_batch_two_is_flattened_whole() -> None:
    feeds = [{"X": np.ones((2, 2, 3), np.int32)}, {"X": np.zeros((1, 4, 3), np.int32)}]
    batch = BatchAssembler(ragged=frozenset({"X"})).gather(feeds)
    assert batch["X"].shape == (24,)


def test_ragged_without_batching_is_flattened_too() -> None:
    feeds = [{"INPUT0": np.arange(6, dtype=np.float32).reshape(2, 3)}]
    batch = BatchAssembler(ragged=frozenset({"INPUT0"})).gather(feeds)
    assert batch["INPUT0"].shape == (6,)


def test_other_inputs_stack_along_the_batch_dimension() -> None:
    plain = BatchAssembler()
    lone = {"INPUT0": np.ones((1, 4), np.float32)}
    assert plain.gather([lone]) is lone  # no copy for a batch of one
    batch = plain.gather([lone, {"INPUT0": np.zeros((2, 4), np.float32)}])
    assert batch["INPUT0"].shape == (3, 4)


def test_ragged_bytes_input() -> None:
    a = np.array([[b"a", b"bc"]], dtype=object)
    b = np.array([[b"d"]], dtype=object)
    batch = BatchAssembler(ragged=frozenset({"S"})).gather([{"S": a}, {"S": b}])
    assert list(batch["S"]) == [b"a", b"bc", b"d"]


# -- batch inputs ----------------------------------------------------------------------

TWO = [(1, 3), (1, 5)]


@pytest.mark.parametrize(
    ("kind", "shapes", "want"),
    [
        ("BATCH_ELEMENT_COUNT", TWO, [3, 5]),
        ("BATCH_ELEMENT_COUNT", [(1, 3)], [3]),
        ("BATCH_ELEMENT_COUNT", [(2, 3)], [6]),  # a request's count spans its batch
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", TWO, [3, 8]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", [(1, 3), (1, 4), (1, 5)], [3, 7, 12]),  # the docs'
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", [(1, 3)], [3]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", TWO, [0, 3, 8]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [(1, 3)], [0, 3]),
        ("BATCH_ELEMENT_COUNT", [(3,), (5,)], [3, 5]),  # max_batch_size 0: no batch dim
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", [(4,)], [4]),
    ],
)
def test_element_counts(
    kind: BatchInputKind, shapes: list[tuple[int, ...]], want: list[int]
) -> None:
    for dtype in (I32, F32):
        value = batch_input_value(kind, dtype, shapes)
        assert value.dtype == dtype
        assert value.shape == (len(want),)
        np.testing.assert_array_equal(value, want)


def test_max_element_count_is_told_by_the_shape() -> None:
    value = batch_input_value("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", F32, [(1, 3), (1, 5), (1, 2)])
    assert value.shape == (5,) and value.dtype == F32
    assert batch_input_value("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", I32, [(1, 3)]).shape == (3,)


def test_item_shape_one_row_per_batch_item_without_the_batch_dim() -> None:
    value = batch_input_value("BATCH_ITEM_SHAPE", I32, [(1, 2, 3), (2, 4, 3)])
    assert value.dtype == I32
    np.testing.assert_array_equal(value, [[2, 3], [4, 3], [4, 3]])
    flat = batch_input_value("BATCH_ITEM_SHAPE_FLATTEN", F32, [(1, 2, 3), (2, 4, 3)])
    assert flat.dtype == F32
    np.testing.assert_array_equal(flat, [2, 3, 4, 3, 4, 3])
    lone = batch_input_value("BATCH_ITEM_SHAPE", I32, [(1, 7)])
    assert lone.shape == (1, 1) and lone[0, 0] == 7


def test_item_shape_takes_the_first_dim_as_batch_even_without_batching() -> None:
    # Triton's collector assumes a batch dimension: a [3] source gives a [3, 0] tensor.
    assert batch_input_value("BATCH_ITEM_SHAPE", I32, [(3,)]).shape == (3, 0)
    assert batch_input_value("BATCH_ITEM_SHAPE_FLATTEN", I32, [(3,)]).shape == (0,)


def test_batch_inputs_from_the_config_are_fed_under_each_target() -> None:
    feeds = ragged(3, 5)
    batch = RAGGED_SUM.gather(feeds)
    assert set(batch) == {"INPUT0", "INDEX", "COUNT"}
    assert batch["INDEX"].dtype == I32 and batch["COUNT"].dtype == F32
    np.testing.assert_array_equal(batch["INDEX"], [3, 8])
    np.testing.assert_array_equal(batch["COUNT"], [3, 5])
    lone = RAGGED_SUM.gather(ragged(4))
    np.testing.assert_array_equal(lone["INDEX"], [4])
    assert lone["INPUT0"].shape == (4,)

    two_targets = assembler(
        'max_batch_size: 4 input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ] '
        "batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO "
        'target_name: [ "A", "B" ] data_type: TYPE_INT32 source_input: "X" } ]'
    )
    batch = two_targets.gather([{"X": np.zeros((1, 2), np.int32)}])
    np.testing.assert_array_equal(batch["A"], [0, 2])
    assert batch["B"] is batch["A"]


def test_a_missing_source_input_is_the_request_s_error() -> None:
    with pytest.raises(ServingError) as info:
        RAGGED_SUM.gather([{"OTHER": np.zeros((1, 2), np.float32)}])
    assert info.value.code == Code.INVALID_ARG
    assert "'INPUT0'" in info.value.message


# -- splitting outputs -----------------------------------------------------------------


def test_outputs_split_along_the_batch_dimension() -> None:
    out = np.array([[6.0], [30.0]], np.float32)
    parts = RAGGED_SUM.scatter(["SUM"], [out], [1, 1], ragged(3, 5))
    assert [p["SUM"].tolist() for p in parts] == [[[6.0]], [[30.0]]]


def test_an_output_without_the_batch_dimension_cannot_be_split() -> None:
    with pytest.raises(ServingError) as info:
        RAGGED_SUM.scatter(["SUM"], [np.zeros(8, np.float32)], [1, 1], ragged(3, 5))
    assert info.value.code == Code.INTERNAL
    assert "cannot be split among the requests" in info.value.message


def test_batch_output_is_scattered_by_the_source_input_shapes() -> None:
    doubled = np.arange(8, dtype=np.float32) * 2
    parts = RAGGED_SUM.scatter(["DOUBLED"], [doubled], [1, 1], ragged(3, 5))
    assert [p["DOUBLED"].shape for p in parts] == [(1, 3), (1, 5)]
    np.testing.assert_array_equal(parts[1]["DOUBLED"], [[6, 8, 10, 12, 14]])
    (lone,) = RAGGED_SUM.scatter(["DOUBLED"], [doubled[:3]], [1], ragged(3))
    assert lone["DOUBLED"].shape == (1, 3)


def test_batch_output_too_short_for_the_requests() -> None:
    with pytest.raises(ServingError) as info:
        RAGGED_SUM.scatter(["DOUBLED"], [np.zeros(7, np.float32)], [1, 1], ragged(3, 5))
    assert info.value.code == Code.INTERNAL


# -- with the model --------------------------------------------------------------------


@pytest.mark.parametrize("lengths", [(3, 5), (4,), (1, 7, 2)])
def test_the_ragged_sum_model_answers_each_request(lengths: tuple[int, ...]) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    sess = ort.InferenceSession(modelgen.ragged_sum_model(), providers=["CPUExecutionProvider"])
    feeds = ragged(*lengths)
    names = ["SUM", "LENGTH", "DOUBLED"]
    arrays = sess.run(names, RAGGED_SUM.gather(feeds))
    parts = RAGGED_SUM.scatter(names, arrays, [1] * len(feeds), feeds)
    for feed, part in zip(feeds, parts, strict=True):
        x = feed["INPUT0"]
        assert part["SUM"].tolist() == [[float(x.sum())]]
        assert part["LENGTH"].tolist() == [[float(x.size)]]
        np.testing.assert_array_equal(part["DOUBLED"], x * 2)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_torchscript_gets_batch_inputs_as_arguments(tmp_path: Path) -> None:
    # Triton's PyTorch backend maps batch input targets like inputs (here by argument name).
    pytest.importorskip("torch")
    from shoal.workers.torch_backend import TorchBackend
    from tools import torchgen

    config = parse_config_text(
        'platform: "pytorch_libtorch" max_batch_size: 4 input [ { name: "INPUT0" '
        "data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ] "
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "INPUT1" data_type: TYPE_FP32 '
        'source_input: "INPUT0" } ] output [ { name: "OUTPUT0" data_type: TYPE_FP32 '
        'dims: [ -1 ] } ] batch_output [ { target_name: "OUTPUT0" '
        'kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT0" } ]',
        "m",
    )
    model = tmp_path / "model.pt"
    model.write_bytes(torchgen.add_sub_model())
    backend = TorchBackend()
    backend.load(model, read_spec(config), 1, False)
    steps = BatchAssembler.from_config(read_spec(config))
    feeds = ragged(3)
    (out,) = backend.execute(steps.gather(feeds), ["OUTPUT0"])  # INPUT0 + its count
    (part,) = steps.scatter(["OUTPUT0"], [out], [1], feeds)
    np.testing.assert_array_equal(part["OUTPUT0"], [[4, 5, 6]])
