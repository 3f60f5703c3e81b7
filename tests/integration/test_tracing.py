"""Triton mode tracing (--trace-config triton,file=...): the trace extension through
tritonclient over HTTP and gRPC, and the trace file, read after the server stops, for an
ensemble whose second step is a Python model calling another model (BLS)."""

from __future__ import annotations

import json
import queue
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_ensembles import _ensemble, _step
from tests.serverctl import ShoalServer
from tools import modelgen

BLS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "IN0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "IN1").as_numpy()
            answer = pb_utils.InferenceRequest(
                model_name="simple", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", b)],
            ).exec()
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""
CACHED = "response_cache { enable: true }\n"
BLS_CONFIG = """
name: "bls"
backend: "python"
max_batch_size: 8
input [
  { name: "IN0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "IN1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
# A decoupled model: one response per element of IN, then the final flag alone.
REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for v in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy():
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([v], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
REPEAT_CONFIG = """
name: "repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
MODEL = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
         "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]  # fmt: skip
DONE = ["INFER_RESPONSE_COMPLETE"]
HTTP = ["HTTP_RECV_START", "HTTP_RECV_END", *MODEL, *DONE, "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *MODEL, *DONE, "GRPC_SEND_START",
        "GRPC_SEND_END"]  # fmt: skip
HIT = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "REQUEST_END",
       *DONE, "HTTP_SEND_START", "HTTP_SEND_END"]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("tracing")
    modelgen.write_model(repo, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    (repo / "bls" / "1").mkdir(parents=True)
    (repo / "bls" / "1" / "model.py").write_text(textwrap.dedent(BLS))
    (repo / "bls" / "config.pbtxt").write_text(BLS_CONFIG)
    steps = [
        _step("simple", {"INPUT0": "IN0", "INPUT1": "IN1"}, {"OUTPUT0": "SUM", "OUTPUT1": "D"}),
        _step("bls", {"IN0": "SUM", "IN1": "D"}, {"OUT": "OUT"}),
    ]
    _ensemble(repo, "ens", steps, outputs=("OUT",))
    (repo / "repeat" / "1").mkdir(parents=True)
    (repo / "repeat" / "1" / "model.py").write_text(textwrap.dedent(REPEAT))
    (repo / "repeat" / "config.pbtxt").write_text(REPEAT_CONFIG)
    cached = modelgen.SIMPLE_CONFIG.replace('"simple"', '"cached"')
    modelgen.write_model(repo, "cached", modelgen.simple_model(), cached + CACHED)
    ordered = modelgen.SIMPLE_CONFIG.replace('"simple"', '"ordered"')
    ordered += "dynamic_batching { preserve_ordering: true }\n"
    modelgen.write_model(repo, "ordered", modelgen.simple_model(), ordered)
    trace_file = tmp_path_factory.mktemp("traces") / "trace.json"
    srv = ShoalServer(
        repo,
        "--cache-config=local,size=1048576",
        f"--trace-config=triton,file={trace_file}",
        "--trace-level=TIMESTAMPS",  # (the deprecated spelling)
        "--trace-config=rate=1",
    )
    srv.trace_file = trace_file  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        assert srv.stop() == 0


def _parse(
    entries: list[dict[str, Any]],
) -> tuple[dict[int, dict[str, Any]], dict[int, list[tuple[str, int]]]]:
    """A trace file's heads by id, and each trace's stamps in the file's order."""
    heads = {e["id"]: e for e in entries if "model_name" in e}
    stamps: dict[int, list[tuple[str, int]]] = {i: [] for i in heads}
    for e in entries:
        for s in e.get("timestamps", []):
            stamps[e["id"]].append((s["name"], s["ns"]))
    return heads, stamps


def _inputs(module: Any, names: tuple[str, str] = ("IN0", "IN1")) -> list[Any]:
    out = []
    for name in names:
        t = module.InferInput(name, [1, 16], "INT32")
        t.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        out.append(t)
    return out


def test_settings_over_http(server: ShoalServer) -> None:
    http = httpclient.InferenceServerClient(server.url)
    assert "trace" in http.get_server_metadata()["extensions"]
    assert http.get_trace_settings() == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": str(server.trace_file),  # type: ignore[attr-defined]
        "trace_mode": "triton",
    }
    mine = http.update_trace_settings("ens", {"trace_rate": "5", "trace_count": "3"})
    assert (mine["trace_rate"], mine["trace_count"]) == ("5", "3")
    assert http.get_trace_settings()["trace_rate"] == "1"  # the global one is unchanged
    cleared = http.update_trace_settings("ens", {"trace_rate": None, "trace_count": None})
    assert (cleared["trace_rate"], cleared["trace_count"]) == ("1", "-1")
    refusals = [
        ({"trace_rate": "fast"}, "Unable to parse 'trace_rate', got: fast"),
        ({"trace_file": "/x"}, "trace file location can not be updated through network"),
        ({"trace_level": ["OFF", "TENSORS"]}, "Expect only one trace level 'OFF' is specified"),
        ({"trace_rate": "0"}, "Attempting to set invalid trace setting :sample rate must be"),
    ]
    for settings, message in refusals:
        with pytest.raises(InferenceServerException, match=message.replace("(", r"\(")):
            http.update_trace_settings(settings=settings)
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
        http.get_trace_settings("nope")
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
        http.update_trace_settings("nope", {"trace_file": "/x"})  # the model first, as Triton
    assert http.get_trace_settings()["trace_rate"] == "1"  # nothing refused was applied
    http.close()


def test_settings_over_grpc(server: ShoalServer) -> None:
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    got = grpc.get_trace_settings(model_name="simple", as_json=True)["settings"]
    assert got["trace_level"]["value"] == ["TIMESTAMPS"] and got["trace_rate"]["value"] == ["1"]
    changed = grpc.update_trace_settings("simple", {"trace_level": ["TIMESTAMPS", "TENSORS"]},
                                         as_json=True)["settings"]  # fmt: skip
    assert changed["trace_level"]["value"] == ["TIMESTAMPS", "TENSORS"]
    back = grpc.update_trace_settings("simple", {"trace_level": None}, as_json=True)["settings"]
    assert back["trace_level"]["value"] == ["TIMESTAMPS"]
    with pytest.raises(InferenceServerException, match="Expecting value >= -1, got: -4"):
        grpc.update_trace_settings(settings={"trace_count": "-4"})
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
        grpc.update_trace_settings("nope", {"trace_file": "/x"})
    grpc.close()


def test_streams_and_cache_hits_answer_while_traced(server: ShoalServer) -> None:
    """The requests whose traces the last test reads: a decoupled model over
    /generate_stream and a gRPC stream, a stream of two ordered answers, a cache hit, a
    model that preserves ordering (its answers go through the broker)."""
    status, body = server.http("/v2/models/repeat/generate_stream", b'{"IN": [1, 2, 3]}')
    events = [json.loads(e.removeprefix(b"data: ")) for e in body.split(b"\n\n") if e]
    assert status == 200 and [e["OUT"] for e in events] == [1, 2, 3]
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    values = grpcclient.InferInput("IN", [3], "INT32")
    values.set_data_from_numpy(np.array([4, 5, 6], np.int32))
    grpc.async_stream_infer("repeat", [values])
    got = [answers.get(timeout=60) for _ in range(3)]
    assert [int(r.as_numpy("OUT")[0]) for r, e in got if e is None] == [4, 5, 6]
    for first in (1000, 2000):  # two requests on one stream: answered in their order
        ins = _inputs(grpcclient, ("INPUT0", "INPUT1"))
        ins[0].set_data_from_numpy(np.arange(first, first + 16, dtype=np.int32).reshape(1, 16))
        grpc.async_stream_infer("cached", ins, request_id=f"s{first}")
    got = [answers.get(timeout=60) for _ in range(2)]
    assert [r.get_response().id for r, e in got if e is None] == ["s1000", "s2000"]
    grpc.stop_stream()
    grpc.close()
    http = httpclient.InferenceServerClient(server.url)
    for _ in range(2):  # a miss, then a hit
        assert http.infer("cached", _inputs(httpclient, ("INPUT0", "INPUT1"))) is not None
    assert http.infer("ordered", _inputs(httpclient, ("INPUT0", "INPUT1"))) is not None
    http.close()


def test_the_trace_file_links_an_ensemble_its_steps_and_a_bls_call(server: ShoalServer) -> None:
    http = httpclient.InferenceServerClient(server.url)
    http.update_trace_settings("simple", {"trace_level": ["TIMESTAMPS", "TENSORS"]})
    out = http.infer("ens", _inputs(httpclient), request_id="r1").as_numpy("OUT")
    np.testing.assert_array_equal(out, 2 * np.arange(16).reshape(1, 16))
    short = httpclient.InferInput("INPUT0", [1, 3], "INT32")
    short.set_data_from_numpy(np.zeros((1, 3), np.int32))
    with pytest.raises(InferenceServerException, match="unexpected shape"):
        http.infer("simple", [short, *_inputs(httpclient, ("INPUT1", "INPUT1"))[:1]])
    http.close()
    body = json.dumps({"INPUT0": list(range(16)), "INPUT1": [1] * 16}).encode()
    status, answer = server.http("/v2/models/simple/generate", body)
    assert status == 200, answer
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    simple_inputs = _inputs(grpcclient, ("INPUT0", "INPUT1"))
    assert grpc.infer("simple", simple_inputs).as_numpy("OUTPUT0") is not None
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    grpc.async_stream_infer("simple", simple_inputs)
    result, error = answers.get(timeout=60)
    assert error is None and result.as_numpy("OUTPUT0") is not None
    grpc.stop_stream()
    grpc.close()
    assert server.stop() == 0  # the frontend writes its traces as it exits, as Triton
    entries = json.loads(server.trace_file.read_text())  # type: ignore[attr-defined]
    heads, stamps = _parse(entries)
    server.traces = heads, stamps  # type: ignore[attr-defined]
    by_model = {h["model_name"]: i for i, h in heads.items() if h["model_name"] != "simple"}
    ens, bls = by_model["ens"], by_model["bls"]
    simples = [i for i, h in heads.items() if h["model_name"] == "simple"]
    assert heads[ens]["request_id"] == "r1" and "parent_id" not in heads[ens]
    assert heads[bls]["parent_id"] == ens
    called = [i for i in simples if heads[i].get("parent_id") == bls]  # the BLS call's
    step = [i for i in simples if heads[i].get("parent_id") == ens]  # the ensemble's step
    failed = [i for i in simples if stamps[i][-1][0] == "HTTP_RECV_END"]  # (refused: 400)
    generated = [i for i in simples if stamps[i][-1][0] == "HTTP_SEND_END"]  # /generate's
    alone = [i for i in simples if stamps[i][0][0] == "GRPC_WAITREAD_START"]
    assert len(called) == len(step) == len(failed) == len(generated) == 1 and len(alone) == 2
    assert [n for n, _ in stamps[generated[0]]] == HTTP
    assert [n for n, _ in stamps[failed[0]]] == ["HTTP_RECV_START", "HTTP_RECV_END"]
    names = [n for n, _ in stamps[ens]]
    assert names == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
                     "REQUEST_END", *DONE, "HTTP_SEND_START", "HTTP_SEND_END"]  # fmt: skip
    for child in (bls, step[0], called[0]):
        assert [n for n, _ in stamps[child]] == MODEL
    for i in alone:
        assert [n for n, _ in stamps[i]] == GRPC
    # simple's own setting (TENSORS) for its own requests; the ensemble's steps follow it
    tensors = [e for e in entries if "tensor" in e]
    # (the failed one was refused before its tensors were read)
    assert {e["id"] for e in tensors} == {*alone, *generated}
    values = ",".join(map(str, range(16)))
    seen = [(e["activity"], e["tensor"]["name"], e["tensor"]["data"]) for e in tensors
            if e["id"] in alone]  # fmt: skip
    assert seen == 2 * [
        ("TENSOR_QUEUE_INPUT", "INPUT0", values), ("TENSOR_QUEUE_INPUT", "INPUT1", values),
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT0", ",".join(str(2 * i) for i in range(16))),
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT1", ",".join("0" * 16)),
    ]  # fmt: skip
    for trace in stamps.values():  # every trace's stamps in time order
        times = [ns for _, ns in trace]
        assert times == sorted(times)
    # each child runs inside its parent
    for child, parent in ((bls, ens), (step[0], ens), (called[0], bls)):
        inner, outer = dict(stamps[child]), dict(stamps[parent])
        assert outer["REQUEST_START"] <= inner["REQUEST_START"]
        assert inner["REQUEST_END"] <= outer["REQUEST_END"]
    called_at = dict(stamps[called[0]])["REQUEST_START"]
    bls_compute = dict(stamps[bls])
    assert bls_compute["COMPUTE_START"] <= called_at <= bls_compute["COMPUTE_END"]


def test_streams_and_cache_hits_have_whole_traces(server: ShoalServer) -> None:
    """A decoupled model's request is one trace: its request's stamps, the worker's
    compute stamps around its responses, and each response's arrival and send (gRPC:
    the first arrival, as Triton); a stream's ordered answers are stamped as they go
    out, in order; a cache hit has Triton's stamps without compute; an answer held for
    preserve_ordering has its compute stamps (L0_batcher's preserve_ordering trace)."""
    heads, stamps = server.traces  # type: ignore[attr-defined]
    by = {m: [i for i, h in heads.items() if h["model_name"] == m] for m in ("repeat", "cached")}
    assert len(by["repeat"]) == 2 and len(by["cached"]) == 4
    order = [*MODEL[:4], "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
    for i in by["repeat"]:
        names = [n for n, _ in stamps[i]]
        at = dict(stamps[i])
        assert [at[n] for n in order] == sorted(at[n] for n in order)
        sent = "HTTP_SEND_END" if names[0] == "HTTP_RECV_START" else "GRPC_SEND_END"
        assert names.count(sent) == 3 and names.count(sent[:-3] + "START") == 3
        assert names.count("INFER_RESPONSE_COMPLETE") == (3 if sent[0] == "H" else 1)
        assert names[:2] in (HTTP[:2], GRPC[:2]) and names[-1] in (sent, "REQUEST_END")
        first = names.index("INFER_RESPONSE_COMPLETE")
        assert at["COMPUTE_INPUT_END"] <= stamps[i][first][1] <= at["REQUEST_END"]
    assert {heads[i].get("model_version") for i in by["repeat"]} == {1}
    streamed = sorted((i for i in by["cached"] if stamps[i][0][0] == "GRPC_WAITREAD_START"),
                      key=lambda i: heads[i]["request_id"])  # fmt: skip
    assert [heads[i]["request_id"] for i in streamed] == ["s1000", "s2000"]
    for i in streamed:
        assert [n for n, _ in stamps[i]] == GRPC
    assert (
        dict(stamps[streamed[0]])["GRPC_SEND_START"] <= dict(stamps[streamed[1]])["GRPC_SEND_START"]
    )
    over_http = [[n for n, _ in stamps[i]] for i in sorted(by["cached"]) if i not in streamed]
    assert over_http == [HTTP, HIT]
    (ordered,) = [i for i, h in heads.items() if h["model_name"] == "ordered"]
    assert [n for n, _ in stamps[ordered]] == HTTP
