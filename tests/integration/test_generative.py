"""Generative models served with in-flight batching (tiny_llm, shoal's engine), through
tritonclient's gRPC streams and the HTTP generate endpoint: a request that comes while
others decode gets its tokens before they finish; a request's tokens do not depend on
its batch companions nor on preemptions (greedy and seeded sampling); a cancelled
request's blocks are freed; after a soak of requests, some cancelled, no block is held.

One server for the module, two models, both the shipped tiny_llm in float64 (so that
batched and lone computations cannot round to different tokens): ``tp2``, over two
processes (tensor parallelism on the CPU, gloo between them), and ``small``, in one, with
a pool too small for all its requests at once (it preempts), and a config that names
only the backend, the class and the parameters (auto-complete gives the rest)."""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import shutil
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.serverctl import ShoalServer, served

SHIPPED = Path(__file__).resolve().parents[2] / "model_repository" / "tiny_llm"
GREEDY = {"temperature": 0, "ignore_eos": True}
SEEDED = {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "seed": 5, "ignore_eos": True}


def _model(repo: Path, name: str, extra: dict[str, str], minimal: bool = False) -> None:
    """The shipped tiny_llm as ``name`` with these parameters; ``minimal``: its config
    without inputs, outputs and transaction policy (auto-complete gives them)."""
    shutil.copytree(SHIPPED, repo / name)
    config = (repo / name / "config.pbtxt").read_text().replace('"tiny_llm"', f'"{name}"')
    if minimal:
        kept = ("name:", "backend:", "parameters", "instance_group")
        config = "".join(f"{ln}\n" for ln in config.splitlines() if ln.startswith(kept))
    for key, value in extra.items():
        config = re.sub(rf'(key: "{key}" value: {{ string_value: )"[^"]*"', rf'\1"{value}"', config)
        if f'key: "{key}"' not in config:
            config += f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("generative")
    small = {"dtype": "float64", "kv_cache_blocks": "12", "kv_block_size": "8"}
    _model(repo, "small", small, minimal=True)
    _model(repo, "tp2", {"dtype": "float64", "tensor_parallel_size": "2"})
    with served(repo) as srv:
        yield srv
    for pid in FOLLOWERS:  # a tensor-parallel instance's processes end with it
        assert not Path(f"/proc/{pid}").exists(), f"follower {pid} left behind"


FOLLOWERS: list[int] = []


class Stream:
    """One gRPC stream; ``events`` gets (request id, text, finish reason, final) or
    (request id, error) in the order responses come."""

    def __init__(self, server: ShoalServer) -> None:
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.client.start_stream(callback=self._got)

    def _got(self, result: Any, error: Any) -> None:
        if error is not None:
            self.events.put(("error", str(error)))
            return
        rid = result.get_response().id
        final = result.get_response().parameters["triton_final_response"].bool_param
        text = result.as_numpy("text_output")
        reason = result.as_numpy("finish_reason")
        self.events.put((
            rid, b"".join(text).decode() if text is not None else "",
            reason[0].decode() if reason is not None else "", final,
        ))  # fmt: skip

    def send(
        self, model: str, rid: str, prompt: str, params: dict[str, Any], stream: bool = True
    ) -> None:
        tensors = {
            "text_input": np.array([prompt.encode()], dtype=np.object_),
            "sampling_parameters": np.array([json.dumps(params).encode()], dtype=np.object_),
            "stream": np.array([stream]),
            "exclude_input_in_output": np.array([True]),
            "return_finish_reason": np.array([True]),
        }
        inputs = []
        for name, value in tensors.items():
            i = grpcclient.InferInput(name, [1], "BYTES" if value.dtype == np.object_ else "BOOL")
            i.set_data_from_numpy(value)
            inputs.append(i)
        self.client.async_stream_infer(
            model, inputs, request_id=rid, enable_empty_final_response=True
        )

    def next(self) -> tuple[Any, ...]:
        return self.events.get(timeout=60)

    def texts(self, count: int) -> dict[str, str]:
        """The whole text of ``count`` requests, once each has its final response."""
        texts: dict[str, str] = {}
        done = 0
        while done < count:
            event = self.next()
            assert event[0] != "error", event
            rid, text, _, final = event
            texts[rid] = texts.get(rid, "") + text
            done += final
        return texts

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def _metric(server: ShoalServer, name: str, model: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        page = r.read().decode()
    found = re.search(rf'^{name}{{[^}}]*model="{model}"[^}}]*}} (\S+)$', page, re.M)
    assert found is not None, f"{name} for {model} not on /metrics"
    return float(found.group(1))


def _until_blocks_free(server: ShoalServer, model: str) -> float:
    deadline = time.monotonic() + 30
    while (
        used := _metric(server, "shoal_llm_kv_blocks_used", model)
    ) and time.monotonic() < deadline:
        time.sleep(0.05)  # (the engine notices a cancel between its steps)
    return used


def test_a_request_arriving_during_decoding_finishes_before_the_long_one(
    server: ShoalServer,
) -> None:
    s = Stream(server)
    try:
        s.send("tp2", "long", "A long story", {**GREEDY, "max_tokens": 200})
        assert s.next()[0] == "long"  # it decodes now
        s.send("tp2", "short", "Hi", {**GREEDY, "max_tokens": 4})
        order = []
        while len(order) < 2:
            rid, _, reason, final = s.next()
            if final:
                order.append((rid, reason))
        assert order == [("short", "length"), ("long", "length")]
    finally:
        s.close()


@pytest.mark.parametrize("model", ["tp2", "small"])
def test_outputs_with_in_flight_batching_equal_outputs_alone(
    server: ShoalServer, model: str
) -> None:
    requests = {
        f"r{i}": (prompt, {**(GREEDY if i % 2 else SEEDED), "max_tokens": 24 + 3 * i})
        for i, prompt in enumerate(
            ["Hello", "The quick brown fox", "abc", "x" * 30, "Why?", "1 2 3"]
        )
    }
    preempted = _metric(server, "shoal_llm_preemptions_total", model)
    hits = _metric(server, "shoal_llm_prefix_cache_hit_tokens_total", model)
    s = Stream(server)
    try:
        for rid, (prompt, params) in requests.items():
            s.send(model, rid, prompt, params)
        together = s.texts(len(requests))
        alone = {}
        for rid, (prompt, params) in requests.items():
            s.send(model, rid, prompt, params, stream=False)  # one response: the whole text
            alone.update(s.texts(1))
    finally:
        s.close()
    assert together == alone
    assert all(len(t) > 0 for t in together.values())
    if model == "small":  # 96 tokens of pool: these need about 300
        assert _metric(server, "shoal_llm_preemptions_total", model) > preempted
    assert _metric(server, "shoal_llm_kv_blocks_used", model) == 0
    if model == "tp2":  # the lone runs found their prompts' blocks cached
        assert _metric(server, "shoal_llm_prefix_cache_hit_tokens_total", model) > hits


def test_a_cancelled_request_frees_its_blocks(server: ShoalServer) -> None:
    before = _metric(server, "shoal_llm_generated_tokens_total", "tp2")
    s = Stream(server)
    s.send("tp2", "c", "Cancel me", {**GREEDY, "max_tokens": 1000})
    assert s.next()[0] == "c"
    assert _metric(server, "shoal_llm_kv_blocks_used", "tp2") > 0
    s.close(cancel=True)
    assert _until_blocks_free(server, "tp2") == 0
    generated = _metric(server, "shoal_llm_generated_tokens_total", "tp2") - before
    assert 0 < generated < 1000  # retired, not run to its end


def test_an_http_client_hanging_up_on_generate_stream_frees_its_blocks(server: ShoalServer) -> None:
    before = _metric(server, "shoal_llm_generated_tokens_total", "tp2")
    params = json.dumps({**GREEDY, "max_tokens": 1000})
    body = json.dumps({"text_input": "Stream me", "sampling_parameters": params, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request("POST", "/v2/models/tp2/generate_stream", body.encode())
    response = conn.getresponse()
    assert response.status == 200
    first = response.readline()
    assert first.startswith(b"data: ") and json.loads(first[6:])["text_output"]
    conn.close()  # (the client hangs up while the model generates)
    assert _until_blocks_free(server, "tp2") == 0
    generated = _metric(server, "shoal_llm_generated_tokens_total", "tp2") - before
    assert 0 < generated < 1000  # retired, not run to its end


def test_a_soak_with_cancels_leaves_no_block_held(server: ShoalServer) -> None:
    kept = Stream(server)
    dropped = [Stream(server) for _ in range(3)]
    try:
        for i in range(24):
            kept.send(
                "small", f"k{i}", f"prompt {i} " * (i % 5 + 1), {"max_tokens": 8 + i % 9, "seed": i}
            )
            if i % 4 == 0:
                dropped[i // 9].send("small", f"d{i}", "never read", {**GREEDY, "max_tokens": 60})
        texts = kept.texts(24)
    finally:
        kept.close()
        for d in dropped:
            d.close(cancel=True)
    assert len(texts) == 24
    assert _until_blocks_free(server, "small") == 0
    assert _metric(server, "shoal_llm_running_sequences", "small") == 0


def test_bad_sampling_parameters_fail_the_request_alone(server: ShoalServer) -> None:
    s = Stream(server)
    try:
        s.send("tp2", "bad", "Hello", {"temperature": -1})
        event = s.next()
        assert event[0] == "error" and "temperature must be at least 0.0" in event[1]
        s.send("tp2", "good", "Hello", {**GREEDY, "max_tokens": 3}, stream=False)
        assert s.texts(1)["good"]
    finally:
        s.close()
    body = json.dumps(
        {"text_input": "Hello", "sampling_parameters": json.dumps({**GREEDY, "max_tokens": 3})}
    )
    status, answer = server.http("/v2/models/tp2/generate", body.encode())
    assert status == 200 and json.loads(answer)["text_output"].startswith("Hello")


def test_too_long_a_request_is_refused(server: ShoalServer) -> None:
    s = Stream(server)
    try:
        s.send("small", "huge", "y" * 200, GREEDY)
        event = s.next()
        assert event[0] == "error" and "KV cache" in event[1]
    finally:
        s.close()


def test_a_tensor_parallel_instance_gives_the_tokens_of_one_process(server: ShoalServer) -> None:
    worker = server.worker_pid("tp2")
    children = Path(f"/proc/{worker}/task/{worker}/children").read_text().split()
    followers = [
        int(c) for c in children if "tensor_parallel" in Path(f"/proc/{c}/cmdline").read_text()
    ]
    assert len(followers) == 1  # rank 1; the worker is rank 0
    FOLLOWERS.extend(followers)
    s = Stream(server)
    try:
        for model in ("small", "tp2"):
            s.send(model, f"{model}-greedy", "Split me", {**GREEDY, "max_tokens": 30})
            s.send(model, f"{model}-seeded", "Split me", {**SEEDED, "max_tokens": 30})
        texts = s.texts(4)
    finally:
        s.close()
    assert texts["tp2-greedy"] == texts["small-greedy"]
    assert texts["tp2-seeded"] == texts["small-seeded"]


def test_the_return_flags_add_their_outputs_to_every_response(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    events: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    flags = [
        "finish_reason",
        "cumulative_logprob",
        "logprobs",
        "num_input_tokens",
        "num_output_tokens",
    ]
    values: dict[str, np.ndarray] = {
        "text_input": np.array([b"Hi"], dtype=np.object_),
        "sampling_parameters": np.array(
            [json.dumps({**GREEDY, "max_tokens": 3}).encode()], dtype=np.object_
        ),
        "stream": np.array([True]),
        **{f"return_{f}": np.array([True]) for f in flags},
    }
    inputs = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, [1], "BYTES" if value.dtype == np.object_ else "BOOL")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    try:
        client.async_stream_infer("small", inputs, enable_empty_final_response=True)
        responses = []
        while not responses or not responses[-1][1]:
            result, error = events.get(timeout=60)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            responses.append((result, final))
    finally:
        client.stop_stream()
        client.close()
    assert len(responses) == 3  # one per token, the last one final
    total = 0.0
    for i, (result, _) in enumerate(responses, start=1):
        assert result.as_numpy("num_input_tokens").tolist() == [3]  # <bos> H i
        assert result.as_numpy("num_output_tokens").tolist() == [i]
        (entry,) = json.loads(result.as_numpy("logprobs")[0])
        (info,) = entry.values()
        assert (
            info["rank"] == 0
            and info["decoded_token"] == result.as_numpy("text_output")[0].decode()
        )
        total += info["logprob"]
        assert result.as_numpy("cumulative_logprob")[0] == pytest.approx(total, abs=1e-5)
        reason = result.as_numpy("finish_reason")[0].decode()
        assert reason == ("length" if i == 3 else "None")


def test_a_killed_tensor_parallel_instance_takes_its_follower_and_fails_its_requests(
    server: ShoalServer,
) -> None:
    """(Last in the module: the instance is restarted after it.)"""
    worker = server.worker_pid("tp2")
    (follower,) = (
        int(c) for c in Path(f"/proc/{worker}/task/{worker}/children").read_text().split()
    )
    FOLLOWERS.append(follower)
    s = Stream(server)
    try:
        s.send("tp2", "doomed", "Run", {**GREEDY, "max_tokens": 1000})
        assert s.next()[0] == "doomed"
        os.kill(worker, signal.SIGKILL)
        while (event := s.next())[0] == "doomed" and not event[3]:
            pass  # (tokens already on their way)
        assert event[0] == "error"  # the request fails: its instance died
    finally:
        s.close()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{follower}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # (the kernel delivers the follower's PDEATHSIG)
    assert not Path(f"/proc/{follower}").exists()
