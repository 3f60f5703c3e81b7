"""What a worker adds to a stateful model's batch: Triton's sequence control tensors, the
null rows of a Direct batch, and the implicit state it keeps per sequence slot.

The broker's sequence batcher (shoal/broker/sequencer.py) gives every request of a sequence
the same instance and slot, and runs them one at a time, in order. For each request the
worker feeds the model, beside the client's inputs:

* the control tensors the config's ``control_input`` names: START, END and READY (the
  config's false/true values, INT32, FP32 or BOOL) and CORRID (the correlation ID, as
  the control's data type: a 32-bit type keeps the low 32 bits, TYPE_STRING the string),
  each ``[1]`` per request (``[1, 1]`` when the model batches, ``[n, 1]`` for a batch);
* for each ``state`` entry, the state input: what the model gave as the output state on
  the sequence's previous request, or, on its START (or after nothing), the initial
  state: ``initial_state``'s ``zero_data`` or ``data_file`` (read from the model's
  ``initial_state/`` folder), else zeros (Triton leaves it uninitialized). Its shape is
  ``dims`` with each -1 as 1, after a batch dimension of 1 when the model batches.

A Direct batch has a row per slot up to the highest that has a request; the rows
without one are null rows: zeros in the shape of the first request's inputs, READY,
START and END false, CORRID 0 (or ""), the initial state, and their outputs dropped.
State is kept per slot, with the correlation ID it belongs to: a request gets it only
if it is of that sequence and not its START. So nothing need tell the worker that a
sequence ended, a sequence never sees another's state, and what the worker keeps is
bounded by its slots. A client sees the output state only when the config lists it as
an output. In a batch, the slots' states must have one shape (a state with -1 dims
whose sizes differ between sequences fails that batch).

An iterative sequence (``iterative_sequence: true``) is one request, run again each
time its Python model reschedules it (shoal/workers/rescheduling.py). Its state is kept
per sequence, not per slot (the broker frees the slot after the first run, and the next
request takes it while this one still runs): each run after the first gets START and
END false and READY true, as Triton's sequence batcher gives a rescheduled request, and
as state the output states its earlier runs' responses gave (a decoupled model's; one
that is not decoupled answers only on its last run), else the state it was fed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shoal.configs.model_spec import ModelSpec, SequenceControl, SequenceState
from shoal.configs.schema import ConfigError
from shoal.ipc import datatypes
from shoal.ipc import messages as m
from shoal.workers.tensors import on_host

#: Triton's folder, beside the version folders, of initial state data files.
INITIAL_STATE_FOLDER = "initial_state"


def _blank(arr: Any) -> np.ndarray:
    """Zeros (empty strings for BYTES) in ``arr``'s shape and type."""
    dtype = np.dtype(arr.dtype)  # (a device array's too: no copy to read it)
    if dtype.kind == "O":
        return np.full(arr.shape, b"", dtype=object)
    return np.zeros(arr.shape, dtype=dtype)


@dataclass(frozen=True)
class Control:
    name: str  # the model input
    kind: str  # START, END, READY or CORRID
    dtype: np.dtype  # object for a string CORRID
    false: Any = 0
    true: Any = 1


@dataclass(frozen=True)
class State:
    input: str
    output: str
    initial: np.ndarray  # one request's (batch dimension included when batching)


def _dtype(config: ModelSpec, datatype: str, what: str) -> np.dtype:
    dt = datatypes.datatype(datatype)
    if dt is None:
        raise ConfigError(config.name, f"unsupported data type for {what} of model '{config.name}'")
    return np.dtype(object) if dt.numpy is None else np.dtype(dt.numpy)


def _control(config: ModelSpec, c: SequenceControl) -> Control:
    name, kind = c.input_name, c.kind
    if kind == "CORRID":
        return Control(name, kind, _dtype(config, c.datatype, f"control '{name}'"))
    if len(c.int32_false_true):
        return Control(name, kind, np.dtype(np.int32), *c.int32_false_true)
    if len(c.fp32_false_true):
        return Control(name, kind, np.dtype(np.float32), *c.fp32_false_true)
    return Control(name, kind, np.dtype(np.bool_), *c.bool_false_true)


def _initial(config: ModelSpec, st: SequenceState, model_dir: Path) -> np.ndarray:
    """One request's initial state for the state entry ``st``: in the shape its
    ``initial_state`` gives, else its ``dims`` with each -1 as 1."""
    dtype = _dtype(config, st.datatype, f"state '{st.input_name}'")
    init = st.initial_states[0] if st.initial_states else None
    dims = init.dims if init is not None and len(init.dims) else st.dims
    shape = [1 if d < 0 else int(d) for d in dims]
    if config.max_batch_size > 0:
        shape = [1, *shape]
    count = int(np.prod(shape))
    strings = dtype.kind == "O"
    if init is None or not init.data_file:  # zero_data, or none
        return np.full(shape, b"", dtype=object) if strings else np.zeros(shape, dtype)
    folder = (model_dir / INITIAL_STATE_FOLDER).resolve()
    path = (folder / init.data_file).resolve()
    if not path.is_relative_to(folder):
        raise ConfigError(
            config.name,
            f"initial_state data_file '{init.data_file}' for state input '{st.input_name}' "
            "is outside the model's initial_state folder",
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            config.name, f"failed to read initial_state data_file for '{st.input_name}': {exc}"
        ) from None
    if strings:
        items = datatypes.split_bytes(memoryview(raw))[:count]
        arr = np.full(count, b"", dtype=object)
        arr[: items.size] = items
        return arr.reshape(shape)
    need = count * dtype.itemsize
    if len(raw) < need:
        raise ConfigError(
            config.name,
            f"initial_state setting expects {need} bytes, but the data provided from "
            f"{init.data_file}only has {len(raw)} bytes",
        )  # (Triton's words, without the space)
    return np.frombuffer(raw[:need], dtype=dtype).reshape(shape).copy()


class SequenceIO:
    """The control tensors and implicit state of one instance of a sequence model."""

    def __init__(
        self, controls: list[Control], states: list[State], batching: bool, iterative: bool = False
    ) -> None:
        self.controls = controls
        self.states = states
        self.batching = batching
        self.iterative = iterative
        # an iterative sequence's output states since its last run, by sequence
        self._iterations: dict[int | str, dict[str, np.ndarray]] = {}
        self.added = {c.name for c in controls} | {s.input for s in states}
        self.state_outputs = [s.output for s in states]
        self._shape = (1, 1) if batching else (1,)
        # START, END, READY: one array per value, the same for every request (models read
        # their inputs, never write them; a batch of several is a copy anyway)
        self._flags = {
            (c.name, flag): np.full(self._shape, c.true if flag else c.false, dtype=c.dtype)
            for c in controls
            if c.kind != "CORRID"
            for flag in (False, True)
        }
        # slot -> (the sequence it is of, state input -> value)
        self._held: dict[int, tuple[int | str, dict[str, np.ndarray]]] = {}

    @classmethod
    def from_config(
        cls,
        config: ModelSpec,
        model_dir: Path,
        model_inputs: set[str] | None = None,
        model_outputs: set[str] | None = None,
    ) -> SequenceIO | None:
        """None for a model without sequence batching; raises ConfigError for a control
        or state the model does not have (when its tensors are known)."""
        sb = config.sequence_batching
        if sb is None:
            return None
        controls = [_control(config, c) for c in sb.controls]
        states = [
            State(st.input_name, st.output_name, _initial(config, st, model_dir))
            for st in sb.states
        ]
        name = config.name
        for c in controls:
            if model_inputs is not None and c.name not in model_inputs:
                raise ConfigError(
                    name,
                    f"unable to load model '{name}', sequence batching control tensor "
                    f"'{c.name}' is not an input of the model",
                )
        for s in states:
            if model_inputs is not None and s.input not in model_inputs:
                raise ConfigError(
                    name,
                    f"unable to load model '{name}', state input '{s.input}' is not an input "
                    "of the model",
                )
            if model_outputs is not None and s.output not in model_outputs:
                raise ConfigError(
                    name,
                    f"unable to load model '{name}', state output '{s.output}' is not an "
                    "output of the model",
                )
        return cls(controls, states, config.max_batch_size > 0, sb.iterative_sequence)

    def _value(self, c: Control, flag: bool | None, corrid: int | str) -> np.ndarray:
        shape = self._shape
        if c.kind != "CORRID":
            return self._flags[(c.name, bool(flag))]
        if c.dtype == object:
            value: Any = corrid.encode() if isinstance(corrid, str) else str(corrid).encode()
            return np.full(shape, value, dtype=object)
        number = corrid if isinstance(corrid, int) else 0
        if c.dtype.itemsize < 8:
            number &= 0xFFFFFFFF
        return np.array(number, dtype=np.uint64).astype(c.dtype).reshape(shape)

    def add(self, item: m.WorkItem, feed: dict[str, Any]) -> None:
        """Put the request's control tensors and state inputs into ``feed``."""
        req = item.request
        flags = {"START": req.sequence_start, "END": req.sequence_end, "READY": True}
        for c in self.controls:
            feed[c.name] = self._value(c, flags.get(c.kind), req.sequence_id)
        feed.update(self.state_inputs(item))

    def state_inputs(self, item: m.WorkItem) -> dict[str, np.ndarray]:
        """The state inputs of the request ``item``: its sequence's output states of its
        previous request, or the initial ones."""
        req = item.request
        held = None if req.sequence_start else self._held.get(item.slot)
        values = held[1] if held is not None and held[0] == req.sequence_id else {}
        return {s.input: values.get(s.input, s.initial) for s in self.states}

    def null_row(self, like: dict[str, Any]) -> dict[str, Any]:
        """A Direct batch's row for a slot without a request, shaped after ``like`` (a
        request's feed)."""
        row: dict[str, Any] = {}
        for name, arr in like.items():
            if name not in self.added:
                row[name] = _blank(arr)
        for c in self.controls:
            row[c.name] = self._value(c, False, "" if c.dtype == object else 0)
        for s in self.states:
            # shaped as the request's state, as Triton's null request copies its states'
            # shapes (a state with -1 dims may differ from its initial one)
            row[s.input] = _blank(like[s.input]) if s.input in like else s.initial
        return row

    def warmup_row(self, feed: dict[str, Any]) -> dict[str, Any]:
        """A warmup sample's request (model_warmup lists the client's inputs) with the
        controls of a sequence's lone request, START and END, and the initial state."""
        row = dict(feed)
        for c in self.controls:
            row[c.name] = self._value(c, True, "" if c.dtype == object else 0)
        for s in self.states:
            row[s.input] = s.initial
        return row

    def keep(
        self, item: m.WorkItem, outs: dict[str, Any], fed: dict[str, Any] | None = None
    ) -> None:
        """The output states of the request ``item``: its sequence's next state inputs.
        With ``fed`` (a Python model's, which may leave an output state out of a
        response), a state the outputs lack stays the one the request was fed."""
        if not self.states:
            return
        values = {
            s.input: np.array(on_host(outs[s.output] if fed is None or s.output in outs
                                      else fed[s.input]), copy=True)
            for s in self.states
        }  # fmt: skip
        self._held[item.slot] = (item.request.sequence_id, values)

    def keep_given(self, item: m.WorkItem, outs: dict[str, Any], final: bool = False) -> None:
        """A decoupled Python model's response to ``item``: the output states it gives
        (if any) become its sequence's next state inputs (an iterative sequence's next
        run's, unless the response is its ``final`` one)."""
        if self.iterative:
            given = {
                s.input: np.array(on_host(outs[s.output]), copy=True)
                for s in self.states
                if s.output in outs
            }
            if given and not final:
                self._iterations.setdefault(item.request.sequence_id, {}).update(given)
            return
        if any(s.output in outs for s in self.states):
            self.keep(item, outs, self.state_inputs(item))

    def rerun(self, item: m.WorkItem, feed: dict[str, Any]) -> dict[str, Any]:
        """The inputs of an iterative sequence's next run of ``item`` (fed ``feed`` on
        its last run, which this updates): the controls of a run after the first, and
        the output states its runs gave since. Returns the inputs that changed."""
        req = item.request
        changed: dict[str, Any] = {
            c.name: self._value(c, c.kind == "READY", req.sequence_id) for c in self.controls
        }
        changed.update(self._iterations.pop(req.sequence_id, {}))
        feed.update(changed)
        return changed

    def ended(self, item: m.WorkItem) -> None:
        """``item``'s final response went out: an iterative sequence's state goes."""
        if self.iterative:
            self._iterations.pop(item.request.sequence_id, None)
