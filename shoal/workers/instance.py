"""A loaded model instance running batches: the worker's core (no sockets, no threads).

``ModelInstance.run`` turns an ``ExecuteBatch`` into the broker's ``BatchDone`` report and
each request's answer: it maps the requests' inputs (the frontend's slab, the client's
region, inline bytes), gathers them with one copy when there are several (a stateful
model's rows in their slots), executes once, splits the outputs back per request (views)
and writes them where each request asked. The worker (shoal/workers/proc.py) sends what it
returns. A Python model takes its requests one by one; a decoupled one answers through
response senders, which the worker's ``DecoupledStreams`` (shoal/workers/streams.py) own.

The shared memory it maps (``RegionMap``, ``CudaRegions``) is the worker's, which releases
it. One thread (the worker's loop) calls ``run``; ``stream_response`` is called by a
decoupled model's threads too, under the worker's lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from shoal.dataplane import classification
from shoal.ipc import datatypes
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError
from shoal.ipc.shm import RegionMap
from shoal.workers.cancels import RunningCancels
from shoal.workers.cuda_regions import CudaRegions
from shoal.workers.loading import LoadedModel
from shoal.workers.python_backend import error_code
from shoal.workers.rescheduling import Pending, Rescheduled, RescheduledRequests
from shoal.workers.tensors import (
    OutputTooLarge,
    host_span,
    input_array,
    output_destination,
    output_ref,
)

log = logging.getLogger("shoal.worker")

#: The smallest output a backend is given to write in place: below it, binding the
#: output (ONNX Runtime's IOBinding) costs more than copying it afterwards (measured:
#: about +8 us at 16-64 KiB, about even at 256 KiB, -0.3 ms at 4 MiB).
IN_PLACE_MIN_BYTES = 256 << 10

#: A batch's requests whose inputs mapped: (position in the batch, item, inputs by name).
Live = list[tuple[int, m.WorkItem, dict[str, np.ndarray]]]
#: The answers of a batch's requests, in the batch's order (errors included).
Answers = list[tuple[m.WorkItem, m.InferResponse]]


class DecoupledRun(Protocol):
    def execute(self, live: Live, failed: list[int], still_open: list[int]) -> tuple[int, int, int]:
        """Run a decoupled model's requests; returns as ``ModelInstance.run_requests``."""


class ModelInstance:
    def __init__(
        self,
        loaded: LoadedModel,
        model: str,
        version: int,
        regions: RegionMap,
        cuda: CudaRegions,
    ) -> None:
        self.model, self.version = model, version
        self.backend: Any = loaded.backend
        self.max_batch_size = loaded.spec.max_batch_size
        self.assembler = loaded.assembler
        self.sequence = loaded.sequence
        self.labels = loaded.labels
        self.output_types = loaded.output_types
        self.output_dims = loaded.output_dims
        self.regions, self.cuda = regions, cuda
        # (a backend's kind is fixed once it is loaded: read once, not per batch)
        self.per_request = bool(getattr(self.backend, "per_request", False))  # Python's
        self.decoupled = bool(getattr(self.backend, "decoupled", False))
        self.writes_in_place = bool(getattr(self.backend, "writes_in_place", False))
        #: How a decoupled model's requests run (the worker's streams): set by the worker.
        self.streams: DecoupledRun | None = None
        #: Which running requests were cancelled (a Python model's): set by the worker.
        self.cancels: RunningCancels | None = None
        #: Requests a Python model rescheduled, to run again (shoal/workers/rescheduling.py).
        self.rescheduled = RescheduledRequests()

    def run(self, batch: m.ExecuteBatch, t0: int) -> tuple[m.BatchDone, Answers]:
        """Run one batch; ``t0``: when the worker took it (perf_counter_ns). Returns its
        report and its requests' answers, in the batch's order (a decoupled model's
        requests answer through their senders, not here)."""
        failed: list[int] = []
        refused: list[int] = []
        answers: Answers = []
        live = self.inputs(batch, failed, refused, answers)
        t1 = t2 = t0
        samples = 0
        still_open: list[int] = []
        if live:
            if self.streams is not None:
                t1, t2, samples = self.streams.execute(live, failed, still_open)
            elif self.per_request:
                t1, t2, samples = self.run_requests(live, failed, answers, batch.rows, still_open)
            else:
                t1, t2, samples = self.run_batch(live, failed, answers, batch.rows, t0)
        t3 = time.perf_counter_ns()
        done = m.BatchDone(
            batch.batch_id, samples, t1 - t0, t2 - t1, t3 - t2, failed, refused, still_open
        )
        return done, answers

    def inputs(
        self, batch: m.ExecuteBatch, failed: list[int], refused: list[int], answers: Answers
    ) -> Live:
        """Each request's inputs as arrays over where they lie; a request whose inputs do
        not map fails (its position in ``failed``, and in ``refused`` when it was the
        request's own fault in Triton's words) with its answer in ``answers``."""
        live: Live = []
        for pos, item in enumerate(batch.items):
            clients = {c.reg_id: c for c in item.regions}
            try:
                tensors = {
                    t.name: input_array(t, self.regions, clients, self.cuda, item.request.model)
                    for t in item.request.inputs
                }
                live.append((pos, item, tensors))
            except datatypes.BytesLayoutError as exc:  # Triton's own words, as they are
                failed.append(pos)
                refused.append(pos)
                answers.append(
                    (item, error(item, Code.INVALID_ARG, exc.message, exc.names_request))
                )
            except Exception as exc:
                failed.append(pos)
                answers.append((item, error(item, Code.INVALID_ARG, f"bad input reference: {exc}")))
        return live

    def run_batch(
        self, live: Live, failed: list[int], answers: Answers, rows: int = 0, t0: int = 0
    ) -> tuple[int, int, int]:
        """Gather, execute once, scatter and write: the answers go to ``answers`` (the
        failures' positions to ``failed``). A Direct sequence batch of ``rows`` rows puts
        each request in its slot's row. Returns when the execution began (``t0``, the
        batch's start, if it failed before) and ended, and the samples it ran."""
        seq = self.sequence
        names = sorted({o.name for _, it, _ in live for o in it.request.outputs})
        sizes = [max(it.request.batch_size, 1) for _, it, _ in live]
        samples = sum(sizes) if self.max_batch_size > 0 else len(live)
        t1 = t0
        try:
            requests = [f for _, _, f in live]
            at: list[int] = []  # a Direct batch's row of each live request
            if seq is not None:
                names = sorted({*names, *seq.state_outputs})
                for _, it, f in live:
                    seq.add(it, f)
                if rows:
                    requests, at, sizes = self.sequence_rows(rows, live)
                    samples = len(requests)
            feeds = self.assembler.gather(requests)
            t1 = time.perf_counter_ns()
            in_place = len(live) == 1 and self.writes_in_place and seq is None
            dests = self.destinations(live[0][1]) if in_place else None
            arrays = self.backend.execute(feeds, names, dests)
            per_request = self.assembler.scatter(names, arrays, sizes, requests)
            if at:
                per_request = [per_request[row] for row in at]
            if seq is not None:
                for (_, it, _), outs in zip(live, per_request, strict=True):
                    seq.keep(it, outs)
        except Exception as exc:
            code, message = (
                (exc.code, exc.message)
                if isinstance(exc, ServingError)
                else (Code.INTERNAL, f"{type(exc).__name__}: {exc}")
            )
            if code == Code.INTERNAL:
                log.exception("execution failed")
            for pos, it, _ in live:
                failed.append(pos)
                answers.append((it, error(it, code, message)))
            return t1, time.perf_counter_ns(), samples
        t2 = time.perf_counter_ns()
        for (pos, it, _), outs in zip(live, per_request, strict=True):
            resp = self.result(it, outs)
            if resp.error is not None:
                failed.append(pos)
            answers.append((it, resp))
        return t1, t2, samples

    def run_requests(
        self,
        live: Live,
        failed: list[int],
        answers: Answers,
        rows: int = 0,
        still_open: list[int] | None = None,
    ) -> tuple[int, int, int]:
        """A backend that takes the batch's requests one by one (Python models): each
        request's own tensors in, its own outputs or error out. A Direct sequence batch
        of ``rows`` rows also gets a null request (READY false) for each row without a
        request, as Triton gives the model, and their answers are dropped. A request the
        model rescheduled is held (``rescheduled``), its position in ``still_open``.
        Returns as ``run_batch``."""
        backend = self.backend
        t1 = time.perf_counter_ns()
        pairs = [(it.request, tensors) for _, it, tensors in live]
        positions = list(range(len(live)))  # each live request's place among the requests
        requests: list[Any] = []
        try:
            if self.sequence is not None:
                for _, it, tensors in live:
                    self.sequence.add(it, tensors)
                if rows > len(live):
                    pairs, positions = self.null_requests(rows, live)
            cancelled: list[Callable[[], bool] | None] | None = None
            if self.cancels is not None:
                cancelled = [None] * len(pairs)  # (a null request has no client)
                watches = self.cancels.begin([it for _, it, _ in live])
                for i, watch in zip(positions, watches, strict=True):
                    cancelled[i] = watch
            requests = backend.requests(pairs, cancelled=cancelled)
            t1 = time.perf_counter_ns()
            results = backend.execute_requests(requests)
            results = [results[i] for i in positions]
            requests = [requests[i] for i in positions]
        except Exception as exc:  # the model's fault, never the worker's end
            log.exception("model '%s': requests could not be run", self.model)
            results = [ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")] * len(live)
        finally:
            if self.cancels is not None:
                self.cancels.end()
        t2 = time.perf_counter_ns()
        for i, ((pos, it, tensors), result) in enumerate(zip(live, results, strict=True)):
            if isinstance(result, Rescheduled):
                self.rescheduled.add(it, tensors, requests[i])
                if still_open is not None:
                    still_open.append(pos)
                continue
            answer = self.answer(it, tensors, result)
            if answer.error is not None:
                failed.append(pos)
            answers.append((it, answer))
        if rows > len(live):
            return t1, t2, rows
        return t1, t2, self.samples(live)

    def answer(self, it: m.WorkItem, tensors: dict[str, Any], result: Any) -> m.InferResponse:
        """A Python model's result for the request ``it`` (fed ``tensors``) as its
        answer, its outputs written where it asked."""
        asked = it.request.outputs
        if not isinstance(result, ServingError):
            if self.sequence is not None:  # (its output states: the next inputs)
                self.sequence.keep(it, result, tensors)
            # a requested output the model did not give is left out, as Triton's
            # Python backend leaves it (the response has the others)
            asked = [s for s in asked if s.name in result]
            result = self.model_outputs(it, result, asked)
        if isinstance(result, ServingError):
            if result.code == Code.INTERNAL:
                log.error("%s", result.message)
            return error(it, result.code, result.message)
        resp = self.result(it, result, asked)
        if resp.error is None and (params := getattr(result, "parameters", None)):
            resp.parameters = params  # (python_backend.Answered)
        return resp

    def next_runs(self) -> list[Pending]:
        """The requests the model rescheduled, to run again now: each with the controls
        and state of its sequence's next run (shoal/workers/sequence_io.py)."""
        pending = self.rescheduled.take()
        if self.sequence is not None:
            for p in pending:
                self.backend.refeed(p.request, self.sequence.rerun(p.item, p.tensors))
        return pending

    def rerun(self) -> tuple[m.RerunDone, Answers]:
        """Run the requests the model rescheduled, together (a model that is not
        decoupled): the run's report, and the answers of those it does not reschedule
        again, whose keys go to ``rescheduled.ended``."""
        t0 = time.perf_counter_ns()
        pending = self.next_runs()
        items = [p.item for p in pending]
        t1 = time.perf_counter_ns()
        try:
            if self.cancels is not None:
                self.cancels.begin(items)
            results = self.backend.execute_requests([p.request for p in pending])
        except Exception as exc:  # the model's fault, never the worker's end
            log.exception("model '%s': requests could not be run", self.model)
            results = [ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")] * len(items)
        finally:
            if self.cancels is not None:
                self.cancels.end()
        t2 = time.perf_counter_ns()
        answers: Answers = []
        ok: list[m.WorkItem] = []
        for p, result in zip(pending, results, strict=True):
            if isinstance(result, Rescheduled):
                self.rescheduled.pending.append(p)
                ok.append(p.item)
                continue
            answer = self.answer(p.item, p.tensors, result)
            answers.append((p.item, answer))
            if answer.error is None:
                ok.append(p.item)
            self.rescheduled.ended.append((p.item.frontend, p.item.request.req_id))
        done = self.rerun_done(len(items), ok, t0, t1, t2)
        return done, answers

    def rerun_done(self, ran: int, ok: list[m.WorkItem], t0: int, t1: int, t2: int) -> m.RerunDone:
        """The report of a run of ``ran`` rescheduled requests (``ok`` those that did
        not fail) begun at ``t0``, executed from ``t1`` to ``t2``."""
        size = self.max_batch_size > 0
        samples = sum(max(it.request.batch_size, 1) if size else 1 for it in ok)
        done = m.BatchDone(-1, ran, t1 - t0, t2 - t1, time.perf_counter_ns() - t2)
        return m.RerunDone(done, len(ok), samples, ran - len(ok))

    def samples(self, live: Live) -> int:
        """The samples a batch of these requests runs (one each without batching)."""
        if self.max_batch_size > 0:
            return sum(max(it.request.batch_size, 1) for _, it, _ in live)
        return len(live)

    def null_requests(
        self, rows: int, live: Live
    ) -> tuple[list[tuple[m.InferRequest, dict[str, np.ndarray]]], list[int]]:
        """A Direct batch's requests for a Python model, one per row: each live request
        in its slot's row, a null request (no correlation ID, READY false, zeros shaped
        as the first request's inputs, its outputs asked for) in the others. Returns
        them and each live request's row."""
        assert self.sequence is not None
        first = live[0][1].request
        null = m.InferRequest(0, first.model, first.version, [], first.outputs)
        by_row: list[tuple[m.InferRequest, dict[str, np.ndarray]] | None] = [None] * rows
        for _, it, tensors in live:
            by_row[it.slot] = (it.request, tensors)
        pairs = [p if p is not None else (null, self.sequence.null_row(live[0][2])) for p in by_row]
        return pairs, [it.slot for _, it, _ in live]

    def sequence_rows(
        self, count: int, live: Live
    ) -> tuple[list[dict[str, np.ndarray]], list[int], list[int]]:
        """A Direct batch of ``count`` rows: each live request in its slot's row, null
        rows in the others. Returns the rows' feeds, each live request's row, and the
        rows' sizes (one sample each)."""
        assert self.sequence is not None
        by_row: list[dict[str, np.ndarray] | None] = [None] * count
        for _, it, f in live:
            by_row[it.slot] = f
        if len(live) < count:  # (most batches fill every row they span: no null row)
            null = self.sequence.null_row(live[0][2])
            by_row = [f if f is not None else null for f in by_row]
        feeds = [f for f in by_row if f is not None]
        return feeds, [it.slot for _, it, _ in live], [1] * count

    def model_outputs(
        self, item: m.WorkItem, outs: dict[str, Any], specs: list[m.OutputSpec] | None = None
    ) -> dict[str, Any] | ServingError:
        """A Python model's outputs for ``item`` (``specs`` of them, if not all it asked
        for), checked before they are written: each one it gave, as an array of its
        config's data type or one that casts to it within its kind (FP64 to FP32, say);
        otherwise the model's fault (INTERNAL). One it asked for that the model did not
        give is left out of the answer, as Triton's Python backend leaves it out."""
        for spec in item.request.outputs if specs is None else specs:
            arr = outs.get(spec.name)
            if arr is None:
                continue
            dt = datatypes.datatype(self.output_types.get(spec.name, ""))
            if dt is None or dt.numpy is None:  # BYTES: any elements, written as bytes
                continue
            got = getattr(arr, "dtype", None)
            if got is None or not np.can_cast(got, dt.numpy, casting="same_kind"):
                return ServingError(
                    Code.INTERNAL,
                    f"output '{spec.name}' of model '{self.model}' has data type {got}, "
                    f"which its config's {self.output_types[spec.name]} cannot hold",
                )
        return outs

    def destinations(self, item: m.WorkItem) -> dict[str, np.ndarray] | None:
        """Where a lone request's outputs will go, as arrays of their exact shape, for
        the backend to write them in place (no copy afterwards): those of a known shape
        that go to its client's region or to a slot of the frontend's slab, unless they
        overlap one of its inputs or another such output (the model would overwrite what
        it still reads). Below IN_PLACE_MIN_BYTES the binding costs more than the copy."""
        specs = [
            s
            for s in item.request.outputs
            if s.name in self.output_dims and s.region and s.nbytes >= IN_PLACE_MIN_BYTES
        ]  # (a classification output has no slot: it always travels inline)
        if not specs:  # most requests: nothing to look up
            return None
        clients = {c.reg_id: c for c in item.regions}
        taken = [
            host_span(t.region, t.offset, t.nbytes, clients)
            for t in item.request.inputs
            if t.data is None
        ]
        out = {}
        for spec in specs:
            dims = self.output_dims[spec.name]
            shape = [item.request.batch_size, *dims] if self.max_batch_size > 0 else dims
            dest = output_destination(
                spec.name, self.output_types[spec.name], shape, spec, self.regions, clients
            )
            if dest is None or dest.nbytes < IN_PLACE_MIN_BYTES:
                continue
            where, start, end = host_span(spec.region, spec.offset, dest.nbytes, clients)
            if not any(w == where and s < end and start < e for w, s, e in taken):
                out[spec.name] = dest
                taken.append((where, start, end))
        return out or None

    def result(
        self,
        item: m.WorkItem,
        outs: dict[str, np.ndarray],
        specs: list[m.OutputSpec] | None = None,
    ) -> m.InferResponse:
        """Write the request's outputs (``specs``, if not those it asked for) where it
        asked; its answer (or why not)."""
        refs = []
        clients = {c.reg_id: c for c in item.regions}
        try:
            for spec in item.request.outputs if specs is None else specs:
                dtype = self.output_types.get(spec.name, "")
                arr = outs[spec.name]
                if spec.classification > 0:
                    arr = classification.top_k(
                        arr,
                        spec.classification,
                        dtype,
                        self.max_batch_size > 0,
                        self.labels.get(spec.name),
                    )
                    dtype = "BYTES"
                refs.append(
                    output_ref(spec.name, dtype, arr, spec, self.regions, clients, self.cuda)
                )
        except OutputTooLarge as exc:  # Triton's response allocator: INTERNAL
            return error(item, Code.INTERNAL, str(exc))
        except ValueError as exc:  # a reference this instance cannot serve
            return error(item, Code.INVALID_ARG, str(exc))
        except Exception as exc:
            return error(item, Code.INTERNAL, f"failed to write output: {exc}")
        return m.InferResponse(item.request.req_id, refs, None, self.version)

    def stream_response(self, item: m.WorkItem, response: Any, final: bool) -> m.InferResponse:
        """One response of a decoupled model to ``item`` (a pb_utils.InferenceResponse;
        None: the final flag alone) as its answer: its error, or the outputs the request
        asked for that the model gave, inline or into the client's region (a frontend's
        slot holds one response, and this request may have many)."""
        version = self.version
        if final and self.sequence is not None:
            self.sequence.ended(item)
        if response is None:
            return m.InferResponse(item.request.req_id, [], None, version, final=True, empty=True)
        if response.has_error():
            err = response.error()
            info = m.ErrorInfo(int(error_code(err.code())), str(err.message()))
            return m.InferResponse(item.request.req_id, [], info, version, final=final)
        given = {t.name(): t.data() for t in response.output_tensors()}
        if self.sequence is not None:
            self.sequence.keep_given(item, given, final)
        asked = [s for s in item.request.outputs if s.name in given]
        checked = self.model_outputs(item, given, asked)
        if isinstance(checked, ServingError):
            return error(item, checked.code, checked.message, final=final)
        specs = [s if s.region.startswith(m.CLIENT_REGION) else _inline(s) for s in asked]
        resp = self.result(item, given, specs)
        resp.final = final
        if resp.error is None:
            resp.parameters = response.parameter_values()
        return resp


def error(
    item: m.WorkItem, code: Code, message: str, names_request: bool = False, final: bool = True
) -> m.InferResponse:
    """``item``'s answer that it failed."""
    info = m.ErrorInfo(int(code), message, names_request)
    return m.InferResponse(item.request.req_id, [], info, final=final)


def _inline(spec: m.OutputSpec) -> m.OutputSpec:
    return m.OutputSpec(spec.name, classification=spec.classification)
