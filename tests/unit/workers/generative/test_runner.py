"""The engine's shell as the worker drives it (its execute, its response senders), with no
server: a request it cannot run fails alone, a model whose step raises fails the requests
it ran and the engine goes on with the next ones, a config it cannot serve fails the load."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shoal.workers import pb_utils
from shoal.workers.generative.interface import KvLayout
from shoal.workers.generative.runner import runner_for

TINY = Path(__file__).resolve().parents[4] / "model_repository" / "tiny_llm"
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Echo:
    """A model that says token 65 ("A"), unless a prompt holds byte 33 ("!"): that step raises."""

    eos_token_id = 257
    max_positions = 64

    def __init__(self, params: dict[str, str], device: str) -> None:
        pass

    def kv_layout(self) -> KvLayout:
        return KvLayout(1, 1, 2, torch.float32)

    def prefill(self, batch: Any, kv: Any) -> torch.Tensor:
        if any(33 in tokens for tokens in batch.tokens):
            raise RuntimeError("boom")
        return self.decode_step(batch, kv)

    def decode_step(self, batch: Any, kv: Any) -> torch.Tensor:
        logits = torch.zeros((len(batch), 258))
        logits[:, 65] = 1.0
        return logits


def _args(decoupled: bool = True) -> dict[str, Any]:
    config = {
        "model_transaction_policy": {"decoupled": decoupled},
        "parameters": {"kv_cache_blocks": {"string_value": "16"}},
    }
    return {
        "model_config": json.dumps(config),
        "model_repository": str(TINY),
        "model_version": "1",
        "model_name": "echo",
        "model_instance_name": "echo_0",
        "model_instance_kind": "CPU",
    }


@pytest.fixture
def runner() -> Iterator[Any]:
    r = runner_for(Echo)()
    r.initialize(_args())
    yield r
    r.finalize()


def _request(prompt: str, sampling: dict[str, Any], *flags: str) -> tuple[Any, queue.Queue[Any]]:
    """A request; ``flags``: BOOL inputs set true besides exclude_input_in_output."""
    got: queue.Queue[Any] = queue.Queue()
    sender = pb_utils.InferenceResponseSender(lambda response, final: got.put((response, final)))
    tensors = [
        pb_utils.Tensor("text_input", np.array([prompt.encode()], dtype=np.object_)),
        pb_utils.Tensor(
            "sampling_parameters", np.array([json.dumps(sampling).encode()], dtype=np.object_)
        ),
        *(pb_utils.Tensor(name, np.array([True])) for name in ("exclude_input_in_output", *flags)),
    ]
    return pb_utils.InferenceRequest(tensors, ["text_output"], sender=sender), got


def _answer(got: queue.Queue[Any]) -> tuple[str, bool]:
    """The request's one response: its text or its error's message, and its final flag."""
    response, final = got.get(timeout=30)
    error = response.error()
    if error is not None:
        return f"error {error.code()}: {error.message()}", final
    return response.output_tensors()[0].as_numpy()[0].decode(), final


def test_bad_and_failing_requests_fail_alone_and_the_engine_goes_on(runner: Any) -> None:
    bad, bad_got = _request("hi", {"top_p": 2})
    boom, boom_got = _request("hi!", {"max_tokens": 3})
    runner.execute([bad, boom])
    assert _answer(bad_got) == (
        f"error {pb_utils.TritonError.INVALID_ARG}: top_p must be in (0, 1]",
        True,
    )
    assert _answer(boom_got) == (f"error {pb_utils.TritonError.INTERNAL}: RuntimeError: boom", True)
    good, good_got = _request("hi", {"max_tokens": 3, "temperature": 0})
    runner.execute([good])
    assert _answer(good_got) == ("AAA", True)
    assert runner.engine.pool.num_used == 0


def test_a_response_sent_whole_carries_every_tokens_logprobs(runner: Any) -> None:
    # (a stop string that "AA" may begin: the streamed text is held back two tokens,
    # their logprobs go out with the next response)
    sampling = {"max_tokens": 4, "temperature": 0, "logprobs": 1, "stop": ["AAX"]}
    whole, whole_got = _request("hi", sampling, "return_logprobs")
    streamed, streamed_got = _request("hi", sampling, "return_logprobs", "stream")
    runner.execute([whole, streamed])
    response, final = whole_got.get(timeout=30)
    assert final == FINAL and whole_got.empty()
    logprobs = json.loads(pb_utils.get_output_tensor_by_name(response, "logprobs").as_numpy()[0])
    assert [next(iter(entry)) for entry in logprobs] == ["65"] * 4  # "A", then its alternative
    per_token: list[Any] = []
    while True:
        response, final = streamed_got.get(timeout=30)
        tensor = pb_utils.get_output_tensor_by_name(response, "logprobs")
        per_token += json.loads(tensor.as_numpy()[0])
        if final:
            break
    assert per_token == logprobs


def test_a_gpu_group_larger_than_the_servers_gpus_fails_the_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(The GPU branch of a tensor-parallel instance, on a host with no GPU: the group
    is placed before any process starts or CUDA is touched.)"""
    from shoal.configs import devices

    monkeypatch.setattr(devices, "_present", lambda: 0)
    args = _args()
    config = json.loads(args["model_config"])
    config["parameters"]["tensor_parallel_size"] = {"string_value": "2"}
    args |= {"model_config": json.dumps(config), "model_instance_kind": "GPU"}
    with pytest.raises(ValueError, match=r"tensor_parallel_size 2 needs 2 GPUs.*has 0"):
        runner_for(Echo)().initialize(args)


def test_a_config_that_is_not_decoupled_fails_the_load() -> None:
    with pytest.raises(ValueError, match="must be decoupled"):
        runner_for(Echo)().initialize(_args(decoupled=False))


def test_auto_complete_fills_the_vllm_backends_inputs_and_outputs() -> None:
    given = {
        "name": "m",
        "backend": "python",
        "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
    }
    config = runner_for(Echo).auto_complete_config(pb_utils.ModelConfig(json.dumps(given)))
    done = config.as_dict()
    assert [i["name"] for i in done["input"]][:3] == ["text_input", "stream", "sampling_parameters"]
    assert len(done["input"]) == 9 and all(i.get("optional") for i in done["input"][1:])
    assert {o["name"] for o in done["output"]} >= {
        "text_output",
        "finish_reason",
        "num_output_tokens",
    }
    assert done["max_batch_size"] == 0 and done["model_transaction_policy"] == {"decoupled": True}
    not_decoupled = {"name": "m", "model_transaction_policy": {"decoupled": False}}
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        runner_for(Echo).auto_complete_config(pb_utils.ModelConfig(json.dumps(not_decoupled)))
