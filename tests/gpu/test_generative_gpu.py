"""Generative models on GPU instances (tiny_llm, shoal's engine), through the HTTP
generate endpoint: an instance on one GPU gives the greedy tokens the model gives on
the CPU in this process, and a tensor-parallel instance over two GPUs (a process per
GPU, NCCL between them) gives the tokens of the one-GPU instance, alone and batched.

The models run in float64 on both devices, so that the GPU's and the CPU's arithmetic
cannot round to different tokens. The two-GPU test skips on a host with one GPU.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from shoal.configs.devices import gpu_count
from tests.integration.test_generative import SHIPPED, _model
from tests.serverctl import ShoalServer, served

GPUS = gpu_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="no NVIDIA GPU on this host"),
]
needs_two = pytest.mark.skipif(
    GPUS < 2, reason=f"tensor parallelism over GPUs needs 2 GPUs; this host has {GPUS}"
)

PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog", "x" * 37, "hi"]
GREEDY = {"temperature": 0, "max_tokens": 24, "ignore_eos": True}


def _on_gpu(repo: Path, name: str, extra: dict[str, str]) -> None:
    _model(repo, name, {"dtype": "float64", **extra})
    config = repo / name / "config.pbtxt"
    group = "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]"
    config.write_text(
        config.read_text().replace("instance_group [ { count: 1 kind: KIND_CPU } ]", group)
    )
    assert "KIND_GPU" in config.read_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("generative-gpu")
    _on_gpu(repo, "gpu1", {})
    if GPUS >= 2:
        _on_gpu(repo, "gpu2", {"tensor_parallel_size": "2"})
    with served(repo) as srv:
        yield srv


def _generate(srv: ShoalServer, model: str, prompt: str) -> str:
    body = {
        "text_input": prompt,
        "exclude_input_in_output": True,
        "sampling_parameters": json.dumps(GREEDY),
    }
    status, answer = srv.http(f"/v2/models/{model}/generate", json.dumps(body).encode())
    assert status == 200, answer
    return str(json.loads(answer)["text_output"])


def _on_cpu() -> tuple[Any, Any]:
    """tiny_llm in this process on the CPU, float64, and its tokenizer."""
    from tokenizers import Tokenizer

    spec = importlib.util.spec_from_file_location("tiny_llm_model", SHIPPED / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TinyLlm({"dtype": "float64", "torch_threads": "1"}, "cpu")
    return model, Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))


def test_one_gpu_gives_the_greedy_tokens_of_the_cpu(server: ShoalServer) -> None:
    model, tokenizer = _on_cpu()
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt).ids
        tokens = list(model.generate(ids, GREEDY["max_tokens"], ignore_eos=True))
        expected = tokenizer.decode(tokens, skip_special_tokens=True)
        assert _generate(server, "gpu1", prompt) == expected, prompt


@needs_two
def test_two_gpus_give_the_tokens_of_one(server: ShoalServer) -> None:
    alone = {p: _generate(server, "gpu1", p) for p in PROMPTS}
    assert {p: _generate(server, "gpu2", p) for p in PROMPTS} == alone
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # in flight together: one batch
        texts = list(pool.map(lambda p: _generate(server, "gpu2", p), PROMPTS))
    together = dict(zip(PROMPTS, texts, strict=True))
    assert together == alone
