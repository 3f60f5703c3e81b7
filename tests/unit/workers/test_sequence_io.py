"""A worker's side of the sequence batcher (shoal/workers/sequence_io.py): the control tensors
it feeds, Direct's null rows, and the implicit state it keeps per slot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import ConfigError
from shoal.configs.spec_reader import read_spec
from shoal.ipc import messages as m
from shoal.workers.sequence_io import SequenceIO

_STATE = 'state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 2 ] } ]'


def _control(name: str, values: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{name} {values} }} ] }}'


def _config(mbs: int = 4, corrid: str = "TYPE_UINT64", state: str = _STATE) -> ModelSpec:
    controls = ", ".join([
        _control("START", "fp32_false_true: [ 0, 1 ]"),
        _control("END", "bool_false_true: [ false, true ]"),
        _control("READY", "int32_false_true: [ 5, 9 ]"),
        _control("CORRID", f"data_type: {corrid}"),
    ])  # fmt: skip
    text = f'name: "acc" max_batch_size: {mbs} '
    text += f"sequence_batching {{ control_input [ {controls} ] {state} }}"
    return read_spec(text_format.Parse(text, pb.ModelConfig()))


def _item(corrid: int | str, slot: int, start: bool = False, end: bool = False) -> m.WorkItem:
    req = m.InferRequest(1, "acc", 1, [], [])
    req.sequence_id, req.sequence_start, req.sequence_end = corrid, start, end
    return m.WorkItem(b"f", req, slot=slot)


def _io(tmp_path: Path, **kw: str | int) -> SequenceIO:
    io = SequenceIO.from_config(_config(**kw), tmp_path)  # type: ignore[arg-type]
    assert io is not None
    return io


def test_controls_carry_the_configs_values_and_types(tmp_path: Path) -> None:
    io = _io(tmp_path)
    feed: dict[str, np.ndarray] = {"INPUT": np.ones((1, 3), np.float32)}
    io.add(_item(2**64 - 1, 0, start=True), feed)
    assert feed["START"].dtype == np.float32 and feed["START"].tolist() == [[1.0]]
    assert feed["END"].dtype == np.bool_ and feed["END"].tolist() == [[False]]
    assert feed["READY"].dtype == np.int32 and feed["READY"].tolist() == [[9]]
    assert feed["CORRID"].dtype == np.uint64 and feed["CORRID"].tolist() == [[2**64 - 1]]
    assert feed["S_IN"].tolist() == [[0, 0]]  # no initial_state: zeros


def test_a_32_bit_corrid_keeps_the_low_bits_and_a_string_one_the_string(tmp_path: Path) -> None:
    feed: dict[str, np.ndarray] = {}
    _io(tmp_path, corrid="TYPE_INT32").add(_item(2**32 + 7, 0), feed)
    assert feed["CORRID"].dtype == np.int32 and feed["CORRID"].tolist() == [[7]]
    _io(tmp_path, corrid="TYPE_STRING", mbs=0).add(_item("abc", 0), feed)
    assert feed["CORRID"].tolist() == [b"abc"]  # no batch dimension: [1]


def test_state_follows_its_slot_and_start_resets_it(tmp_path: Path) -> None:
    io = _io(tmp_path)
    a, b = _item(1, 0, start=True), _item(2, 1, start=True)
    io.keep(a, {"S_OUT": np.array([[3, 4]], np.int32)})
    io.keep(b, {"S_OUT": np.array([[5, 6]], np.int32)})
    feed: dict[str, np.ndarray] = {}
    io.add(_item(1, 0), feed)
    assert feed["S_IN"].tolist() == [[3, 4]]
    io.add(_item(2, 1), feed)
    assert feed["S_IN"].tolist() == [[5, 6]]
    io.add(_item(9, 1, start=True), feed)  # a new sequence in slot 1
    assert feed["S_IN"].tolist() == [[0, 0]]


def test_kept_state_is_a_copy_of_the_output(tmp_path: Path) -> None:
    io = _io(tmp_path)
    out = np.array([[3, 4]], np.int32)
    io.keep(_item(1, 0), {"S_OUT": out})
    out[:] = 0  # the batch's buffer, reused
    feed: dict[str, np.ndarray] = {}
    io.add(_item(1, 0), feed)
    assert feed["S_IN"].tolist() == [[3, 4]]


def test_a_null_row_is_zeros_not_ready(tmp_path: Path) -> None:
    io = _io(tmp_path)
    like: dict[str, np.ndarray] = {"INPUT": np.ones((1, 3), np.float32)}
    io.add(_item(1, 0, start=True), like)
    row = io.null_row(like)
    assert row["INPUT"].tolist() == [[0.0, 0.0, 0.0]]
    assert row["READY"].tolist() == [[5]] and row["START"].tolist() == [[0.0]]
    assert row["END"].tolist() == [[False]] and row["CORRID"].tolist() == [[0]]
    assert row["S_IN"].tolist() == [[0, 0]]


def test_initial_state_comes_from_its_data_file(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init.bin").write_bytes(np.array([7, 8], np.int32).tobytes())
    state = (
        'state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 2 ] '
        'initial_state { name: "i" data_type: TYPE_INT32 dims: [ 2 ] data_file: "init.bin" } } ]'
    )
    feed: dict[str, np.ndarray] = {}
    _io(tmp_path, state=state).add(_item(1, 0, start=True), feed)
    assert feed["S_IN"].tolist() == [[7, 8]]
    (tmp_path / "initial_state" / "init.bin").write_bytes(b"\0\0")
    with pytest.raises(ConfigError, match="initial_state setting expects 8 bytes, but the data"):
        _io(tmp_path, state=state)


def test_controls_and_states_the_model_lacks_fail_the_load(tmp_path: Path) -> None:
    inputs = {"INPUT", "START", "END", "READY", "S_IN"}
    with pytest.raises(ConfigError, match="control tensor 'CORRID' is not an input of the model"):
        SequenceIO.from_config(_config(), tmp_path, inputs, {"S_OUT"})
    with pytest.raises(ConfigError, match="state output 'S_OUT' is not an output of the model"):
        SequenceIO.from_config(_config(), tmp_path, inputs | {"CORRID"}, {"OUT"})
    assert SequenceIO.from_config(ModelSpec("x"), tmp_path) is None


def test_a_slot_s_state_goes_only_to_its_own_sequence(tmp_path: Path) -> None:
    """A sequence whose START never ran (cancelled, failed) must not read the state the
    slot's previous sequence left."""
    io = _io(tmp_path)
    io.keep(_item(1, 0), {"S_OUT": np.array([[3, 4]], np.int32)})
    feed: dict[str, np.ndarray] = {}
    io.add(_item(2, 0), feed)
    assert feed["S_IN"].tolist() == [[0, 0]]


def test_a_null_row_s_state_takes_the_shape_of_the_request_s(tmp_path: Path) -> None:
    """A state with -1 dims: the request's state is [1, 3] where the initial one is [1, 1];
    the null row's is [1, 3] zeros, or the batch could not be stacked (Triton copies the
    representative request's state shapes into its null requests)."""
    state = (
        'state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]'
    )
    io = _io(tmp_path, state=state)
    like: dict[str, np.ndarray] = {"INPUT": np.ones((1, 3), np.int32)}
    io.add(_item(1, 0, start=True), like)
    io.keep(_item(1, 0), {"S_OUT": np.array([[7, 8, 9]], np.int32)})
    like = {"INPUT": np.ones((1, 3), np.int32)}
    io.add(_item(1, 0), like)
    assert like["S_IN"].tolist() == [[7, 8, 9]]
    assert io.null_row(like)["S_IN"].tolist() == [[0, 0, 0]]


def test_an_iterative_sequence_s_later_runs_get_its_own_state_and_no_start(
    tmp_path: Path,
) -> None:
    """A rescheduled request's next run (Triton's sequence batcher gives it flags 0):
    START and END false, READY true, and the output states its responses gave since,
    kept per sequence (two such requests share a slot), none after its final one."""
    io = SequenceIO.from_config(_config(state=f"{_STATE} iterative_sequence: true"), tmp_path)
    assert io is not None and io.iterative
    first, second = _item(101, 0, start=True, end=True), _item(102, 0, start=True, end=True)
    feeds: list[dict[str, np.ndarray]] = [{}, {}]
    for item, feed in zip((first, second), feeds, strict=True):
        io.add(item, feed)
    io.keep_given(first, {"S_OUT": np.array([[1, 1]], np.int32)})
    io.keep_given(second, {"S_OUT": np.array([[2, 2]], np.int32)})
    changed = io.rerun(first, feeds[0])
    assert changed["S_IN"].tolist() == [[1, 1]] and feeds[0]["S_IN"].tolist() == [[1, 1]]
    assert (feeds[0]["START"].tolist(), feeds[0]["END"].tolist()) == ([[0.0]], [[False]])
    assert (feeds[0]["READY"].tolist(), feeds[0]["CORRID"].tolist()) == ([[9]], [[101]])
    assert "S_IN" not in io.rerun(first, feeds[0])  # nothing given since: as it was fed
    assert feeds[0]["S_IN"].tolist() == [[1, 1]]
    io.keep_given(second, {"S_OUT": np.array([[3, 3]], np.int32)}, final=True)
    io.ended(second)
    assert "S_IN" not in io.rerun(second, feeds[1])  # (its state went with its end)
