"""Triton's sequence batcher end to end: stateful models whose requests carry a
correlation ID, START and END (tritonclient's ``sequence_id``, ``sequence_start``,
``sequence_end``), over HTTP and gRPC.

The model (``modelgen.accumulate_model``) keeps a running sum per sequence in Triton's
implicit state and echoes the control tensors it was fed, so each answer shows what the
server did: which state the sequence got, and START, END, READY and CORRID. Batches are
observed as Triton's QA observes them, through batch_stats, with the worker held by
SIGSTOP so that what queues is known, not raced."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, served
from tools import modelgen

OUTS = ("OUTPUT", "START_OUT", "END_OUT", "READY_OUT", "CORRID_OUT")


def _write(
    repo: Path,
    name: str,
    mbs: int = 4,
    corrid: str = "TYPE_UINT64",
    idle_us: int = 5_000_000,
    strategy: str = "",
    extra: str = "instance_group [ { count: 1 kind: KIND_CPU } ]",
) -> None:
    config = modelgen.ACCUMULATE_CONFIG.format(
        name=name, max_batch_size=mbs, corrid=corrid, idle_us=idle_us, strategy=strategy,
        extra=extra,
    )  # fmt: skip
    model = modelgen.accumulate_model(
        batch=mbs > 0, corrid="BYTES" if "STRING" in corrid else "UINT64"
    )
    modelgen.write_model(repo, name, model, config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("sequence-repo")
    _write(repo, "acc")  # Direct, 4 slots on one instance
    _write(repo, "acc_str", mbs=0, corrid="TYPE_STRING")  # no batching, string IDs
    _write(repo, "acc_one", mbs=1, idle_us=400_000)  # one slot: a backlog, quick idling
    _write(
        repo,
        "acc_oldest",
        strategy="oldest { max_candidate_sequences: 4 }",
        extra="instance_group [ { count: 2 kind: KIND_CPU } ]",
    )
    warmup = (  # the server adds the control tensors and state a sample needs
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT" '
        "value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } } ]"
    )
    _write(repo, "acc_crash", mbs=1, extra=f"instance_group [ {{ count: 2 }} ]\n{warmup}")
    modelgen.write_model(repo, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    modelgen.write_shipped_repository(repo, ("simple_sequence",))
    with served(repo) as srv:
        yield srv


def _send(
    url: str,
    model: str,
    corrid: int | str,
    value: int,
    start: bool = False,
    end: bool = False,
    protocol: Any = httpclient,
) -> dict[str, list]:
    client = protocol.InferenceServerClient(url)
    try:
        mbs0 = model == "acc_str"
        inp = protocol.InferInput("INPUT", [1] if mbs0 else [1, 1], "INT32")
        inp.set_data_from_numpy(np.full([1] if mbs0 else [1, 1], value, np.int32))
        result = client.infer(
            model, [inp], sequence_id=corrid, sequence_start=start, sequence_end=end
        )
        return {name: result.as_numpy(name).reshape(-1).tolist() for name in OUTS}
    finally:
        client.close()


def _stats(url: str, model: str) -> dict:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=5) as r:
        (stats,) = json.loads(r.read())["model_stats"]
    return dict(stats)


def _queued(url: str, model: str) -> int:
    with urllib.request.urlopen(f"http://{url}/v2/shoal/models/{model}", timeout=5) as r:
        return int(json.loads(r.read())["versions"][0]["queued"])


def _until(what: str, check: Any) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


class _Call(threading.Thread):
    """One request in a thread; its answer (or error) once joined."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__()
        self.args_, self.kw = args, kw
        self.answer: dict[str, list] | None = None
        self.error: InferenceServerException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.answer = _send(*self.args_, **self.kw)
        except InferenceServerException as exc:
            self.error = exc

    def result(self) -> dict[str, list]:
        self.join(30)
        assert not self.is_alive() and self.error is None, self.error
        assert self.answer is not None
        return self.answer


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences_each_keep_their_own_state(
    server: ShoalServer, protocol: str
) -> None:
    url, client = server.client(protocol)
    a, b = (101, 102) if protocol == "http" else (201, 202)
    assert _send(url, "acc", a, 10, start=True, protocol=client) == {
        "OUTPUT": [10], "START_OUT": [1], "END_OUT": [0], "READY_OUT": [1], "CORRID_OUT": [a],
    }  # fmt: skip
    assert _send(url, "acc", b, 100, start=True, protocol=client)["OUTPUT"] == [100]
    assert _send(url, "acc", a, 1, protocol=client)["OUTPUT"] == [11]
    assert _send(url, "acc", b, 2, protocol=client)["OUTPUT"] == [102]
    last = _send(url, "acc", a, 5, end=True, protocol=client)
    assert last == {
        "OUTPUT": [16], "START_OUT": [0], "END_OUT": [1], "READY_OUT": [1], "CORRID_OUT": [a],
    }  # fmt: skip
    # a ended: the same ID starts afresh, from the initial state
    assert _send(url, "acc", a, 3, start=True, end=True, protocol=client)["OUTPUT"] == [3]
    assert _send(url, "acc", b, 3, end=True, protocol=client)["OUTPUT"] == [105]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_ids_on_a_model_that_does_not_batch(server: ShoalServer, protocol: str) -> None:
    url, client = server.client(protocol)
    corrid = f"session-{protocol}"
    first = _send(url, "acc_str", corrid, 4, start=True, protocol=client)
    assert first["OUTPUT"] == [4] and first["CORRID_OUT"] == [corrid.encode()]
    assert _send(url, "acc_str", corrid, 6, end=True, protocol=client)["OUTPUT"] == [10]


@pytest.mark.parametrize(
    ("model", "corrid", "kw", "message"),
    [
        ("acc", 0, {"start": True}, "inference request to model 'acc' must specify a non-zero "
         "or non-empty correlation ID"),
        ("acc", 999, {}, "inference request for sequence 999 to model 'acc' must specify the "
         "START flag on the first request of the sequence"),
        ("acc", "text", {"start": True}, "sequence batching control 'CORRID' data-type is "
         "'BYTES', but model 'acc' expects 'UINT64'"),
        ("acc_str", 5, {"start": True}, "sequence batching control 'CORRID' data-type is "
         "'UINT64', but model 'acc_str' expects 'BYTES'"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_refusals_come_in_tritons_words(
    server: ShoalServer, protocol: str, model: str, corrid: int | str, kw: dict, message: str
) -> None:
    url, client = server.client(protocol)
    with pytest.raises(InferenceServerException) as err:
        _send(url, model, corrid, 1, protocol=client, **kw)
    assert err.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    # (core's sequence scheduler does not name the request; its request validation does)
    named = "sequence batching control" in message
    assert err.value.message() == (f"[request id: <id_unknown>] {message}" if named else message)


def test_a_batch_of_two_is_refused(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    inp = httpclient.InferInput("INPUT", [2, 1], "INT32")
    inp.set_data_from_numpy(np.ones((2, 1), np.int32))
    with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to"):
        client.infer("acc", [inp], sequence_id=7, sequence_start=True)


def test_direct_batches_put_each_sequence_in_its_slot_with_null_rows(
    server: ShoalServer,
) -> None:
    """Three sequences in slots 0-2 of acc's one instance. With the worker stopped while
    it runs the first one's START, the other two queue; the next batch holds them in
    rows 1 and 2, with a null row 0: a batch of 3 that makes 2 inferences."""
    url = server.url
    before = _stats(url, "acc")
    pid = server.worker_pid("acc")
    os.kill(pid, signal.SIGSTOP)
    try:
        first = _Call(url, "acc", 301, 1, start=True)
        # taken into a batch, which the worker, stopped, holds
        _until(
            "the first request runs", lambda: server.model_version("acc")["instances"][0]["busy"]
        )
        second, third = (_Call(url, "acc", c, v, start=True) for c, v in ((302, 20), (303, 30)))
        _until("two queued", lambda: _queued(url, "acc") == 2)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert first.result()["OUTPUT"] == [1]
    assert second.result()["OUTPUT"] == [20] and third.result()["OUTPUT"] == [30]
    after = _stats(url, "acc")
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 2
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    old = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    assert sizes.get(3, 0) - old.get(3, 0) == 1  # rows 0-2, row 0 null
    for corrid in (301, 302, 303):  # each goes on from its own state
        assert _send(url, "acc", corrid, 1, end=True)["OUTPUT"][0] in (2, 21, 31)


def test_a_sequence_waits_in_the_backlog_for_a_slot(server: ShoalServer) -> None:
    """acc_one has one slot: a second sequence waits until the first ends."""
    url = server.url
    assert _send(url, "acc_one", 1, 5, start=True)["OUTPUT"] == [5]
    waiting = _Call(url, "acc_one", 2, 7, start=True)
    _until("2 queued", lambda: _queued(url, "acc_one") == 1)
    time.sleep(0.1)
    assert waiting.is_alive()  # backlogged: 1 holds the slot
    assert server.model_version("acc_one")["sequence_batcher"] == {
        "strategy": "direct", "slots_per_instance": 1, "in_slots": 1, "backlog": 1,
    }  # fmt: skip
    assert _send(url, "acc_one", 1, 1, end=True)["OUTPUT"] == [6]
    assert waiting.result()["OUTPUT"] == [7]
    assert _send(url, "acc_one", 2, 1, end=True)["OUTPUT"] == [8]


def test_an_idle_sequence_is_released(server: ShoalServer) -> None:
    """acc_one's sequences may be idle 0.4 s: after that its slot goes to the next, and
    its own next request needs START again."""
    url = server.url
    assert _send(url, "acc_one", 11, 5, start=True)["OUTPUT"] == [5]
    t0 = time.monotonic()
    waiting = _Call(url, "acc_one", 12, 1, start=True)
    assert waiting.result()["OUTPUT"] == [1]
    assert time.monotonic() - t0 >= 0.3  # it waited for 11 to idle out
    with pytest.raises(InferenceServerException, match="sequence 11 to model 'acc_one' must"):
        _send(url, "acc_one", 11, 1)
    assert _send(url, "acc_one", 12, 1, end=True)["OUTPUT"] == [2]


def test_oldest_runs_many_sequences_at_once_each_in_order(server: ShoalServer) -> None:
    url = server.url
    results: dict[int, list[int]] = {}

    def run(corrid: int) -> None:
        outs = []
        for step in range(6):
            answer = _send(url, "acc_oldest", corrid, corrid, start=step == 0, end=step == 5)
            outs.append(answer["OUTPUT"][0])
        results[corrid] = outs

    threads = [threading.Thread(target=run, args=(c,)) for c in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {c: [c * (k + 1) for k in range(6)] for c in range(1, 7)}
    assert _stats(url, "acc_oldest")["inference_count"] == 36


def test_the_model_shows_only_what_clients_send(server: ShoalServer) -> None:
    """Control tensors and the implicit state are the server's: not in the metadata."""
    meta = httpclient.InferenceServerClient(server.url).get_model_metadata("acc")
    assert [i["name"] for i in meta["inputs"]] == ["INPUT"]
    assert [o["name"] for o in meta["outputs"]] == list(OUTS)
    config = httpclient.InferenceServerClient(server.url).get_model_config("acc")
    assert config["sequence_batching"]["max_sequence_idle_microseconds"] == 5000000


def test_a_crashed_instance_takes_only_its_sequences(server: ShoalServer) -> None:
    """(Its model warms up first, as the config asks.) acc_crash's two instances hold a
    sequence each. One dies with a request of its sequence running and another queued:
    both fail, saying why; the sequence's state died with the worker, so its next
    request is refused until a new START. The other instance's sequence goes on, and
    other models never notice."""
    url = server.url
    assert "instance 0 warmed up with sample 'w' (batch 1" in server.log()
    assert _send(url, "acc_crash", 41, 2, start=True)["OUTPUT"] == [2]
    assert _send(url, "acc_crash", 43, 5, start=True)["OUTPUT"] == [5]

    def busy() -> bool:
        return any(i["busy"] for i in server.model_version("acc_crash")["instances"])

    # Which instance holds 41? Stop each in turn until a request of 41 is held there.
    for inst in server.model_version("acc_crash")["instances"]:
        os.kill(inst["pid"], signal.SIGSTOP)
        running = _Call(url, "acc_crash", 41, 1)
        _until("held or answered", lambda: busy() or not running.is_alive())  # noqa: B023
        if busy():
            pid, name = inst["pid"], f"acc_crash_0_{inst['index']}"
            break
        os.kill(inst["pid"], signal.SIGCONT)
        running.result()  # it ran on the other one
    else:
        raise AssertionError("41 ran on no instance")
    queued = _Call(url, "acc_crash", 41, 1)
    _until("queued", lambda: _queued(url, "acc_crash") == 1)
    os.kill(pid, signal.SIGKILL)
    server.seen_pids.add(pid)
    running.join(30)
    queued.join(30)
    assert running.error is not None and queued.error is not None
    assert running.error.message() == (
        f"Failed to process the request(s) for model instance '{name}', message: the "
        f"instance's worker process (pid {pid}) exited"
    )
    assert queued.error.message() == (
        f"Failed to process the request(s) for model 'acc_crash' version 1, message: "
        f"instance '{name}' (pid {pid}) exited, and with it the state of the sequence they "
        "belong to"
    )

    def restarted() -> bool:
        instances = server.model_version("acc_crash")["instances"]
        return len(instances) == 2 and all(i["state"] == "READY" for i in instances)

    _until("a new instance", restarted)
    with pytest.raises(InferenceServerException, match="for sequence 41 to model 'acc_crash'"):
        _send(url, "acc_crash", 41, 1)
    assert _send(url, "acc_crash", 41, 3, start=True, end=True)["OUTPUT"] == [3]
    assert _send(url, "acc_crash", 43, 1, end=True)["OUTPUT"] == [6]  # went on
    assert _send(url, "acc", 42, 9, start=True, end=True)["OUTPUT"] == [9]


# What Triton's example clients (simple_{http,grpc}_sequence_{sync,stream}_infer_client.py)
# send to the shipped simple_sequence and check: two int sequences and one uuid string.
_VALUES = [11, 7, 5, 3, 2, 0, 1]


def _example_sequences() -> list[tuple[int | str, list[int], list[int]]]:
    """(sequence id, inputs, the answers the example expects)."""
    return [
        (1000, [0, *_VALUES], [1, *_VALUES]),
        (1001, [100, *(-v for v in _VALUES)], [101, *(-v for v in _VALUES)]),
        (str(uuid.uuid4()), [20, *(-v for v in _VALUES)], [21, *(-v for v in _VALUES)]),
    ]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritons_sequence_examples_pass_on_the_shipped_model(
    server: ShoalServer, protocol: str
) -> None:
    url, mod = server.client(protocol)
    client = mod.InferenceServerClient(url)
    for corrid, inputs, expected in _example_sequences():
        got = []
        for i, value in enumerate(inputs):
            inp = mod.InferInput("INPUT", [1, 1], "INT32")
            inp.set_data_from_numpy(np.full([1, 1], value, np.int32))
            result = client.infer(
                "simple_sequence",
                [inp],
                outputs=[mod.InferRequestedOutput("OUTPUT")],
                sequence_id=corrid,
                sequence_start=i == 0,
                sequence_end=i == len(inputs) - 1,
            )
            got.append(int(result.as_numpy("OUTPUT")[0][0]))
        assert got == expected


def test_tritons_streaming_sequence_example_passes(server: ShoalServer) -> None:
    """As simple_grpc_sequence_stream_infer_client.py: both sequences on one stream,
    interleaved, answers in order per sequence."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    sequences = _example_sequences()[:2]
    try:
        for i in range(len(sequences[0][1])):
            for corrid, inputs, _ in sequences:
                inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                inp.set_data_from_numpy(np.full([1, 1], inputs[i], np.int32))
                client.async_stream_infer(
                    "simple_sequence",
                    [inp],
                    request_id=f"{corrid}_{i}",
                    sequence_id=corrid,
                    sequence_start=i == 0,
                    sequence_end=i == len(inputs) - 1,
                )
        got: dict[int | str, list[int]] = {corrid: [] for corrid, _, _ in sequences}
        for _ in range(2 * len(sequences[0][1])):
            result = answers.get(timeout=30)
            assert not isinstance(result, InferenceServerException), result
            corrid = int(result.get_response().id.split("_")[0])
            got[corrid].append(int(result.as_numpy("OUTPUT")[0][0]))
    finally:
        client.stop_stream()
    assert got == {corrid: expected for corrid, _, expected in sequences}
