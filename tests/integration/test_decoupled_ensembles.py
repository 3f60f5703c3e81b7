"""Ensembles with decoupled steps, as Triton 2.51 runs them (the pattern of a streaming
pipeline: pre-processing, a model that streams, post-processing of each response).

An ensemble is decoupled when one of its steps is (its config says so, whatever it was
written with). Each response of the decoupled step runs the steps after it once more;
each pass answers the client once, over ModelStreamInfer or generate_stream. The
response sent when nothing is left running carries the final flag; a final flag that
comes alone is sent only when asked for, as an empty response. The first error is the
last response. A step that would mix the responses of different decoupled models with
each other or with the request's tensors fails the ensemble's load, in Triton's words.

The decoupled model is test_decoupled's ``repeat`` (one response per element of IN);
``big`` turns each response into a 32 KiB tensor, so that the ensemble's answers lie
in the frontend's shared memory and each response must show its own."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from tests.integration.test_decoupled import CONFIG, REPEAT, Stream, _final, _post
from tests.serverctl import ShoalServer, served, settled_server

WIDE = 8192  # big's output: INT32 [WIDE], 32 KiB, past what travels inline

# Y = 2 x X, WIDE times; X = 13 is an error response; X = SLOW takes 0.3 s
WIDEN = f"""
import time
import numpy as np
import triton_python_backend_utils as pb_utils

SLOW = {{slow}}


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if x[0] == 13:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("unlucky")))
                continue
            if x[0] == SLOW:
                time.sleep(0.3)
            y = np.full([{WIDE}], 2 * x[0], np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
"""
WIDEN_CONFIG = f"""
name: "{{name}}"
backend: "python"
max_batch_size: 0
input [ {{{{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }}}} ]
output [ {{{{ name: "Y" data_type: TYPE_INT32 dims: [ {WIDE} ] }}}} ]
instance_group [ {{{{ count: {{count}} kind: KIND_CPU }}}} ]
"""
BIG = WIDEN.format(slow=None)
BIG_CONFIG = WIDEN_CONFIG.format(name="big", count=1)
# slow for 1, with two instances: a later response's pass can end first
LATE = WIDEN.format(slow=1)
LATE_CONFIG = WIDEN_CONFIG.format(name="late", count=2)
MODES = ("slow_final", "last_final", "errors", "cancellable")
# A Python model iterating the ensemble's responses (business logic scripting): OUT[i]
# = the first element of the i-th response's OUT.
BLS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="ens_last_final", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN"),
                        pb_utils.Tensor("DELAY_MS", np.zeros(1, np.uint32))],
            )
            got = [r.output_tensors()[0].as_numpy()[0] for r in call.exec(decoupled=True)]
            out = np.array(got, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""
BLS_CONFIG = """
name: "bls"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


_INPUTS = {
    "IN": '{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }',
    "DELAY_MS": '{ name: "DELAY_MS" data_type: TYPE_UINT32 dims: [ 1 ] }',
}


def _ensemble(
    repo: Path,
    name: str,
    steps: list[tuple[str, dict[str, str], dict[str, str]]],
    outputs: dict[str, tuple[str, str]],
    extra: str = "",
    inputs: tuple[str, ...] = ("IN", "DELAY_MS"),
) -> None:
    """``steps``: (model, input_map, output_map); ``outputs``: name -> (type, dims)."""
    text = []
    for model, ins, outs in steps:
        maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in ins.items()]
        maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outs.items()]
        text.append(f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}')
    outs = ", ".join(
        f'{{ name: "{n}" data_type: {t} dims: [ {d} ] }}' for n, (t, d) in outputs.items()
    )
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n{extra}\n'
        f"input [ {', '.join(_INPUTS[n] for n in inputs)} ]\n"
        f"output [ {outs} ]\n"
        f"ensemble_scheduling {{ step [ {', '.join(text)} ] }}\n"
    )


_STREAMED = {"OUT": ("TYPE_INT32", str(WIDE)), "IDX": ("TYPE_UINT32", "1")}
_REPEAT_IN = {"IN": "IN", "DELAY_MS": "DELAY_MS"}


def _python_model(repo: Path, name: str, code: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(config)


def write_streaming(repo: Path, modes: tuple[str, ...] = ("last_final",)) -> None:
    """``repeat_<mode>`` for each of ``modes``, ``big``, and ``ens_<mode>``: repeat, then
    big on each response (OUT = 2 x the element, WIDE times; IDX its position)."""
    for mode in modes:
        name = f"repeat_{mode}"
        _python_model(
            repo, name, textwrap.dedent(REPEAT.format(mode=mode)), CONFIG.format(name=name)
        )
        _ensemble(
            repo,
            f"ens_{mode}",
            [
                (name, _REPEAT_IN, {"OUT": "V", "IDX": "IDX"}),
                ("big", {"X": "V"}, {"Y": "OUT"}),
            ],
            _STREAMED,
        )
    _python_model(repo, "big", BIG, BIG_CONFIG)


def write_repository(repo: Path) -> None:
    write_streaming(repo, MODES)
    _python_model(repo, "late", LATE, LATE_CONFIG)
    _ensemble(
        repo,
        "ens_order",
        [
            ("repeat_last_final", _REPEAT_IN, {"OUT": "V", "IDX": "IDX"}),
            ("late", {"X": "V"}, {"Y": "OUT"}),
        ],
        _STREAMED,
    )
    _python_model(repo, "bls", BLS, BLS_CONFIG)
    # an ensemble of the decoupled ensemble: decoupled too, through it
    _ensemble(
        repo,
        "ens_outer",
        [("ens_last_final", _REPEAT_IN, {"OUT": "OUT", "IDX": "IDX"})],
        _STREAMED,
    )
    # says decoupled but has no decoupled step: it is not
    _ensemble(
        repo,
        "ens_plain",
        [("big", {"X": "IN"}, {"Y": "OUT"})],
        {"OUT": ("TYPE_INT32", str(WIDE))},
        extra="model_transaction_policy { decoupled: true }",
        inputs=("IN",),
    )
    # big reads a response of repeat and the request's DELAY_MS: refused
    _ensemble(
        repo,
        "ens_mixed",
        [
            ("repeat_slow_final", _REPEAT_IN, {"OUT": "V", "IDX": "IDX"}),
            ("repeat_last_final", {"IN": "V", "DELAY_MS": "DELAY_MS"}, {"OUT": "W"}),
            ("big", {"X": "W"}, {"Y": "OUT"}),
        ],
        {"OUT": ("TYPE_INT32", str(WIDE)), "IDX": ("TYPE_UINT32", "1")},
    )
    # one output from each of two decoupled steps: no response could carry both
    _ensemble(
        repo,
        "ens_split",
        [
            ("repeat_slow_final", _REPEAT_IN, {"OUT": "A"}),
            ("repeat_last_final", _REPEAT_IN, {"OUT": "B"}),
        ],
        {"A": ("TYPE_INT32", "1"), "B": ("TYPE_INT32", "1")},
    )


_LOADS = (
    "ens_slow_final",
    "ens_last_final",
    "ens_errors",
    "ens_cancellable",
    "ens_outer",
    "bls",
    "ens_order",
)
_REFUSED = ("ens_mixed", "ens_split")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("decoupled_ensembles")
    write_repository(repo)
    with settled_server(repo, (*_LOADS, "ens_plain", *_REFUSED)) as srv:
        yield srv


@pytest.fixture
def stream(server: ShoalServer) -> Iterator[Stream]:
    s = Stream(server)
    yield s
    s.close()


def _streamed(answers: list[Any]) -> list[tuple[int, int]]:
    """(the element, its index) of each response; every OUT element is 2 x the element."""
    out = []
    for a in answers:
        assert not isinstance(a, InferenceServerException), a
        wide = a.as_numpy("OUT")
        assert wide.shape == (WIDE,) and (wide == wide[0]).all()
        out.append((int(wide[0]) // 2, int(a.as_numpy("IDX")[0])))
    return out


def _config(server: ShoalServer, model: str) -> dict[str, Any]:
    status, body = server.http(f"/v2/models/{model}/config")
    assert status == 200, body
    return dict(json.loads(body))


def test_an_ensemble_is_decoupled_when_a_step_is(server: ShoalServer) -> None:
    for model in ("ens_slow_final", "ens_outer"):
        assert _config(server, model)["model_transaction_policy"] == {"decoupled": True}
    assert _config(server, "ens_plain")["model_transaction_policy"] == {"decoupled": False}
    # over gRPC too the policy is there when false, as Triton's (L0_model_config compares)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert client.get_model_config("ens_plain").config.HasField("model_transaction_policy")


@pytest.mark.parametrize("model", ["ens_slow_final", "ens_last_final", "ens_outer"])
def test_each_response_of_the_decoupled_step_runs_the_steps_after_it(
    stream: Stream, model: str
) -> None:
    stream.send(model, [5, 6, 7, 8], request_id="r1")
    answers = stream.take(4)
    assert _streamed(answers) == [(5, 0), (6, 1), (7, 2), (8, 3)]
    for a in answers:
        response = a.get_response()
        assert (response.id, response.model_name, response.model_version) == ("r1", model, "1")
    # the final flag rides on the last response when the model sent it with its last
    assert [_final(a) for a in answers] == [False] * 3 + [model != "ens_slow_final"]
    assert stream.quiet()


def test_a_python_model_iterates_the_ensembles_responses(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    x = grpcclient.InferInput("IN", [3], "INT32")
    x.set_data_from_numpy(np.array([4, 5, 6], np.int32))
    out = client.infer("bls", [x]).as_numpy("OUT")
    client.close()
    np.testing.assert_array_equal(out, [8, 10, 12])


def test_responses_keep_the_order_of_the_decoupled_responses(stream: Stream) -> None:
    """The pass of the first response takes 0.3 s on one instance of late, the others
    end sooner on the other: their responses wait for it (Triton would send them first)."""
    stream.send("ens_order", [1, 2, 3])
    answers = stream.take(3)
    assert _streamed(answers) == [(1, 0), (2, 1), (3, 2)]
    assert [_final(a) for a in answers] == [False, False, True]


def test_a_final_flag_that_comes_alone_is_sent_only_when_asked_for(stream: Stream) -> None:
    stream.send("ens_slow_final", [1, 2], enable_empty_final_response=True)
    answers = stream.take(3)
    assert _streamed(answers[:2]) == [(1, 0), (2, 1)]
    assert [_final(a) for a in answers] == [False, False, True]
    empty = answers[2].get_response()
    assert (empty.outputs, empty.model_version) == ([], "")
    stream.send("ens_last_final", [3], enable_empty_final_response=True)
    (only,) = stream.take(1)
    assert _streamed([only]) == [(3, 0)] and _final(only)  # no empty response after it
    stream.send("ens_slow_final", [])  # no response at all: nothing
    stream.send("ens_slow_final", [], enable_empty_final_response=True)
    (only,) = stream.take(1)
    assert _final(only) and only.get_response().outputs == []
    assert stream.quiet()


def test_concurrent_requests_each_see_their_own_tensors(server: ShoalServer) -> None:
    """Two streams at once, each response's 32 KiB tensor in the frontend's shared
    memory until it is sent: none shows another's, none is freed before it went."""
    streams = [Stream(server) for _ in range(3)]
    try:
        for i, s in enumerate(streams):
            s.send("ens_slow_final", [100 * i + 20 + k for k in range(30)])
        for i, s in enumerate(streams):
            assert _streamed(s.take(30)) == [(100 * i + 20 + k, k) for k in range(30)]
    finally:
        for s in streams:
            s.close()
    assert _pool_used(server) == 0  # every answer released once sent


def _pool_used(server: ShoalServer) -> int:
    """The bytes of the frontend's shared memory that requests hold, once the last
    answers' releases have run (a response goes out just before its release)."""
    deadline = time.monotonic() + 5
    while True:
        _, body = server.http("/v2/shoal/frontend")
        used = int(json.loads(body)["shm_pool_used_bytes"])
        if used == 0 or time.monotonic() > deadline:
            return used
        time.sleep(0.05)


def _stats(server: ShoalServer, model: str) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    client.close()
    return dict(stats)


def _count(stats: dict[str, Any], key: str) -> int:
    return int(stats["inference_stats"][key].get("count", 0))


def test_the_first_error_is_the_last_response(server: ShoalServer, stream: Stream) -> None:
    before = _stats(server, "ens_errors")
    stream.send("ens_errors", [1, -2, 3], delay_ms=20)
    first, error = stream.take(2)
    assert _streamed([first]) == [(1, 0)]
    assert isinstance(error, InferenceServerException)
    assert error.message() == "in ensemble 'ens_errors', negative value at 1"
    assert stream.quiet(0.5)  # 3's response is dropped
    stream.send("ens_errors", [13])  # a later step's error, the same way
    (error,) = stream.take(1)
    assert isinstance(error, InferenceServerException)
    assert error.message() == "in ensemble 'ens_errors', unlucky"
    stream.send("ens_errors", [4])  # the stream serves on
    assert _streamed(stream.take(1)) == [(4, 0)]
    after = _stats(server, "ens_errors")
    assert _count(after, "fail") - _count(before, "fail") == 2
    assert _count(after, "success") - _count(before, "success") == 1
    assert _pool_used(server) == 0


def test_unary_calls_are_refused_as_for_a_decoupled_model(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    x = grpcclient.InferInput("IN", [1], "INT32")
    x.set_data_from_numpy(np.array([1], np.int32))
    d = grpcclient.InferInput("DELAY_MS", [1], "UINT32")
    d.set_data_from_numpy(np.array([0], np.uint32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("ens_slow_final", [x, d])
    assert err.value.status() == "StatusCode.UNIMPLEMENTED"
    assert err.value.message() == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    )
    client.close()
    body = {
        "inputs": [
            {"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]},
            {"name": "DELAY_MS", "datatype": "UINT32", "shape": [1], "data": [0]},
        ]
    }
    status, answer = server.http("/v2/models/ens_slow_final/infer", json.dumps(body).encode())
    assert (status, json.loads(answer)) == (
        501,
        {"error": "HTTP end point doesn't support models with decoupled transaction policy"},
    )


def test_generate_stream_sends_an_event_per_pass(server: ShoalServer) -> None:
    status, _, body = _post(
        server, "/v2/models/ens_errors/generate_stream", {"IN": [2, 3], "DELAY_MS": 0}
    )
    assert status == 200
    events = [json.loads(e.removeprefix(b"data: ")) for e in body.split(b"\n\n") if e]
    assert [(e["OUT"][0] // 2, e["IDX"], e["model_name"]) for e in events] == [
        (2, 0, "ens_errors"),
        (3, 1, "ens_errors"),
    ]
    status, _, body = _post(
        server, "/v2/models/ens_errors/generate_stream", {"IN": [-1, 2], "DELAY_MS": 0}
    )
    assert status == 400 and json.loads(body.removeprefix(b"data: ")) == {
        "error": "in ensemble 'ens_errors', negative value at 0"
    }


def test_a_closed_stream_cancels_the_decoupled_step(server: ShoalServer) -> None:
    before = server.log().count("cancelled after")
    s = Stream(server)
    s.send("ens_cancellable", list(range(200)), delay_ms=20)
    s.take(1)
    s.close()
    deadline = time.monotonic() + 10
    while server.log().count("cancelled after") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.log().count("cancelled after") == before + 1
    assert _pool_used(server) == 0


def _index(server: ShoalServer) -> dict[str, dict[str, str]]:
    status, body = server.http("/v2/repository/index", b"{}")
    assert status == 200
    return {e["name"]: e for e in json.loads(body)}


def test_steps_that_mix_origins_fail_the_ensembles_load(server: ShoalServer) -> None:
    index = _index(server)
    assert index["ens_mixed"]["state"] == "UNAVAILABLE"
    assert index["ens_mixed"]["reason"] == (
        "in ensemble ens_mixed, step of model 'repeat_last_final' receives inputs originated "
        "from different decoupled models"
    )
    assert index["ens_split"]["state"] == "UNAVAILABLE"
    assert index["ens_split"]["reason"] == (
        "in ensemble ens_split, step of model 'ens_split' receives inputs originated from "
        "different decoupled models"
    )
    assert index["ens_slow_final"]["state"] == "READY"


# repeat's inputs and outputs, answered once: OUT = the first element, IDX = 0
ONCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[:1]),
                pb_utils.Tensor("IDX", np.array([0], np.uint32)),
            ])
            for r in requests
        ]
"""


def _as_json(pbtxt: str) -> dict[str, Any]:
    config = text_format.Parse(pbtxt, mc.ModelConfig())
    return dict(json_format.MessageToDict(config, preserving_proto_field_name=True))


def test_a_step_reloaded_as_not_decoupled_makes_its_ensemble_answer_once(
    tmp_path: Path,
) -> None:
    """The ensemble's mode follows its steps across a reload: every frontend forgets what
    it kept of the ensemble when a model it uses changes."""
    write_repository(tmp_path)
    args = ("--model-control-mode=explicit", "--load-model=ens_last_final")
    with served(tmp_path, *args) as srv:
        srv.wait_ready()
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        config = client.get_model_config("ens_last_final", as_json=True)["config"]
        assert config["model_transaction_policy"] == {"decoupled": True}
        s = Stream(srv)
        try:
            s.send("ens_last_final", [4, 5])
            assert _streamed(s.take(2)) == [(4, 0), (5, 1)]
            once = CONFIG.format(name="repeat_last_final").replace(
                "model_transaction_policy { decoupled: true }", ""
            )
            client.load_model(
                "repeat_last_final",
                config=json.dumps(_as_json(once)),
                files={"file:1/model.py": ONCE.encode()},
            )
            config = client.get_model_config("ens_last_final", as_json=True)["config"]
            assert config.get("model_transaction_policy", {}) == {}  # (false: left out)
            x = grpcclient.InferInput("IN", [2], "INT32")
            x.set_data_from_numpy(np.array([7, 8], np.int32))
            d = grpcclient.InferInput("DELAY_MS", [1], "UINT32")
            d.set_data_from_numpy(np.array([0], np.uint32))
            answer = client.infer("ens_last_final", [x, d])  # unary: no longer refused
            assert _streamed([answer]) == [(7, 0)]
            s.send("ens_last_final", [9, 10])  # a stream gets the one answer, final
            (only,) = s.take(1)
            assert _streamed([only]) == [(9, 0)] and _final(only)
        finally:
            s.close()
            client.close()


def test_a_step_killed_mid_stream_ends_its_requests_alone(server: ShoalServer) -> None:
    """SIGKILL of the decoupled step's instance mid-stream: the ensemble's request ends
    with the step's error after "in ensemble", another ensemble's stream is untouched,
    nothing stays held, and once the instance is back the ensemble streams again."""
    doomed, other = Stream(server), Stream(server)
    try:
        doomed.send("ens_cancellable", list(range(200)), delay_ms=20)
        other.send("ens_last_final", list(range(30, 40)), delay_ms=20)
        assert len(doomed.take(2)) == 2
        os.kill(server.worker_pid("repeat_cancellable"), signal.SIGKILL)
        while not isinstance(last := doomed.take(1)[0], InferenceServerException):
            pass
        assert last.message().startswith("in ensemble 'ens_cancellable', ")
        assert "instance 'repeat_cancellable_0_0'" in last.message()
        assert doomed.quiet()
        assert _streamed(other.take(10)) == [(v, v - 30) for v in range(30, 40)]
        assert _pool_used(server) == 0
        deadline = time.monotonic() + 30
        while server.model_version("repeat_cancellable")["state"] != "READY":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        doomed.send("ens_cancellable", [3])
        assert _streamed(doomed.take(1)) == [(3, 0)]
    finally:
        doomed.close()
        other.close()
