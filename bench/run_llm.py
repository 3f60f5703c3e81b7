"""Generative serving on tiny_llm: in-flight batching against request-level batching and
against the model's own generation loop.

Four ways to generate the same greedy tokens with the same torch module
(model_repository/tiny_llm/1/model.py), in one run on the same machine:

* ``inflight``: shoal's generative engine (``generative_model: "TinyLlm"``): requests join
  the running batch between steps, KV cache in blocks;
* ``request-level``: the same model.py as a plain decoupled Python model (its
  ``TritonPythonModel``: ``TinyLlm.generate`` for one request at a time, streaming each
  token through its response sender), today's decoupled path;
* ``in-process``: ``TinyLlm.generate`` called in this process, one request after another,
  no server;
* ``triton request-level``: the request-level model served by the real tritonserver
  (the Triton peer's build, Python backend), its model.py finding torch and tokenizers in
  shoal's environment (``--no-peer`` leaves it out; a peer that cannot serve it, such as
  a build without GPU support under ``--gpu``, is left out of the report, saying why).

The client: one gRPC stream per concurrent client (``ModelStreamInfer``), each sending
its next request when the last one's final response came, all on one asyncio loop and
channel (``--client threads``: tritonclient's ``start_stream`` / ``async_stream_infer``,
a thread per stream, about three times the client's CPU). Every request asks for
``--tokens`` tokens (``ignore_eos``), streamed. The report gives tokens/s and the median
time to first token (TTFT) at each concurrency, and the ratio of in-flight batching's
tokens/s to each other way's. A record, not a test.

    python bench/run_llm.py [--concurrency 1,8,32] [--tokens 64] [--requests-per-stream 4]
        [--model-params d_model=512,layers=8,heads=8] [--larger] [--gpu]

``--model-params`` overrides tiny_llm's parameters (a larger configuration of the same
model); ``--larger`` is ``--model-params`` set to ``LARGER`` (unless given);
``--gpu`` serves it on KIND_GPU instances and runs the in-process loop on CUDA. On a GPU
host the larger configuration is one command: ``python bench/run_llm.py --gpu --larger``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cpu
import numpy as np
import tritonclient.grpc as grpcclient
from common import csv_ints, git_commit
from servers import REPO_ROOT, ServerProcess, shoal_server, triton_python_server

TINY = REPO_ROOT / "model_repository" / "tiny_llm"
MODES = {"inflight": "tiny_llm", "request-level": "tiny_llm_plain"}
#: ``--larger``: the same model at about 26M parameters (the shipped one: about 0.2M)
LARGER = {"d_model": "512", "layers": "8", "heads": "8"}


@dataclass(frozen=True)
class Point:
    """One way at one concurrency: tokens/s, the median TTFT (s), and CPU µs per token
    (the load of this shared machine moves the first two; CPU time far less): the
    server's processes together (in process: this process's) and shoal's model worker
    alone (None where not measured)."""

    tps: float
    ttft: float
    cpu_us: float | None = None
    worker_us: float | None = None


#: (mode, concurrency) -> its point
Points = dict[tuple[str, int], Point]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=csv_ints, default=[1, 8, 32])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--requests-per-stream", type=int, default=4)
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    p.add_argument("--model-params", type=_key_values, default={})
    p.add_argument("--larger", action="store_true", help=f"--model-params {LARGER}")
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--no-peer", action="store_true", help="leave out the Triton peer")
    p.add_argument("--client", choices=("asyncio", "threads"), default="asyncio")
    a = p.parse_args(argv)
    if a.larger and not a.model_params:
        a.model_params = dict(LARGER)
    return a


def _key_values(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if item)


def _config(a: argparse.Namespace, name: str, generative: bool) -> str:
    """tiny_llm's config as ``name``, with ``--model-params`` and ``--gpu`` applied."""
    lines = (TINY / "config.pbtxt").read_text().replace('"tiny_llm"', f'"{name}"').splitlines()
    if not generative:
        lines = [ln for ln in lines if '"generative_model"' not in ln]
    lines = [ln for ln in lines if not any(f'key: "{k}"' in ln for k in a.model_params)]
    for key, value in a.model_params.items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    text = "\n".join(lines) + "\n"
    return text.replace("KIND_CPU", "KIND_GPU") if a.gpu else text


def _repo(tmp: Path, a: argparse.Namespace) -> Path:
    """tiny_llm, and tiny_llm_plain: the same files without generative_model."""
    repo = tmp / "repo"
    for name, generative in (("tiny_llm", True), ("tiny_llm_plain", False)):
        shutil.copytree(TINY, repo / name)
        (repo / name / "config.pbtxt").write_text(_config(a, name, generative))
    return repo


def _prompt(i: int) -> str:
    return f"Request {i}: tell me a story about the number {i * 7919 % 1000}."


def _inputs(prompt: str, tokens: int) -> list[Any]:
    params = {"temperature": 0, "max_tokens": tokens, "ignore_eos": True}
    values = {
        "text_input": np.array([prompt.encode()], dtype=np.object_),
        "sampling_parameters": np.array([json.dumps(params).encode()], dtype=np.object_),
        "stream": np.array([True]),
    }
    out = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, [1], "BYTES" if value.dtype == np.object_ else "BOOL")
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


def _request_proto(model: str, prompt: str, tokens: int) -> Any:
    """One streamed request as the gRPC message, the final flag asked for (built once:
    the asyncio client sends the same bytes each time)."""
    from tritonclient.grpc import _utils

    request = _utils._get_inference_request(
        model_name=model, inputs=_inputs(prompt, tokens), model_version="", request_id="",
        outputs=None, sequence_id=0, sequence_start=False, sequence_end=False, priority=0,
        timeout=None, parameters=None,
    )  # fmt: skip
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


async def _aio_stream(stub: Any, requests: list[Any], ttfts: list[float]) -> None:
    """One gRPC stream sending ``requests`` one after another, each when the last one's
    final response came; each one's TTFT to ``ttfts``."""
    import asyncio

    turn: asyncio.Queue[Any] = asyncio.Queue()

    async def outgoing() -> Any:
        for request in requests:
            yield request
            await turn.get()

    sent = time.perf_counter()
    first = True
    call = stub.ModelStreamInfer(outgoing())
    done = 0
    async for response in call:
        if response.error_message:
            raise RuntimeError(response.error_message)
        if first:
            ttfts.append(time.perf_counter() - sent)
            first = False
        if response.infer_response.parameters["triton_final_response"].bool_param:
            done += 1
            if done == len(requests):
                break
            sent, first = time.perf_counter(), True
            turn.put_nowait(None)
    call.cancel()


def _aio_point(url: str, model: str, concurrency: int, a: argparse.Namespace) -> Point:
    """Tokens/s and median TTFT of ``concurrency`` streams, all on one asyncio loop and
    one channel (a lighter client than a thread per stream: more of the cores for the
    server)."""
    import asyncio

    import grpc
    from tritonclient.grpc import service_pb2_grpc

    per = a.requests_per_stream

    async def run() -> tuple[float, list[float]]:
        ttfts: list[float] = []
        async with grpc.aio.insecure_channel(url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            streams = [
                [_request_proto(model, _prompt(c * per + i), a.tokens) for i in range(per)]
                for c in range(concurrency)
            ]
            start = time.perf_counter()
            await asyncio.gather(*(_aio_stream(stub, reqs, ttfts) for reqs in streams))
            return time.perf_counter() - start, ttfts

    elapsed, ttfts = asyncio.run(run())
    return Point(concurrency * per * a.tokens / elapsed, statistics.median(ttfts))


def _stream_client(
    url: str, model: str, first: int, count: int, tokens: int, ttfts: list[float]
) -> None:
    """``count`` requests one after another on one stream; each one's TTFT to ``ttfts``."""
    events: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        for i in range(first, first + count):
            sent = time.perf_counter()
            client.async_stream_infer(
                model, _inputs(_prompt(i), tokens), enable_empty_final_response=True
            )
            got_first = False
            while True:
                result, error = events.get(timeout=300)
                if error is not None:
                    raise RuntimeError(str(error))
                if not got_first:
                    ttfts.append(time.perf_counter() - sent)
                    got_first = True
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
    finally:
        client.stop_stream()
        client.close()


def _served_point(url: str, model: str, concurrency: int, a: argparse.Namespace) -> Point:
    """Tokens/s and median TTFT (s) of ``concurrency`` streams."""
    ttfts: list[float] = []
    per = a.requests_per_stream
    threads = [
        threading.Thread(target=_stream_client, args=(url, model, c * per, per, a.tokens, ttfts))
        for c in range(concurrency)
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if len(ttfts) != concurrency * per:
        raise RuntimeError(f"{model}: {len(ttfts)} of {concurrency * per} requests answered")
    return Point(concurrency * per * a.tokens / elapsed, statistics.median(ttfts))


def _in_process(a: argparse.Namespace, count: int) -> Point:
    """The model's own loop, one request after another: tokens/s, median TTFT, and this
    process's CPU per token."""
    spec = importlib.util.spec_from_file_location("tiny_llm_model", TINY / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    device = "cuda" if a.gpu else "cpu"
    model = module.TinyLlm({"torch_threads": "1", **a.model_params}, device)
    ttfts = []
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(count):
        sent = time.perf_counter()
        for n, _ in enumerate(model.generate(tokenizer.encode(_prompt(i)).ids, a.tokens, True)):
            if n == 0:
                ttfts.append(time.perf_counter() - sent)
    tokens = count * a.tokens
    cpu_us = (time.process_time() - cpu_start) * 1e6 / tokens
    return Point(tokens / (time.perf_counter() - start), statistics.median(ttfts), cpu_us)


def _cell(us: float | None) -> str:
    return "" if us is None else f"{us:,.0f} µs"


def _report(a: argparse.Namespace, load: float, got: Points) -> str:
    own = got[("in-process", 1)]
    peer = any(mode == "triton request-level" for mode, _ in got)
    lines = [
        f"# Generative serving, tiny_llm ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"commit {git_commit()}; load average at start {load:.2f}; "
        f"{len(os.sched_getaffinity(0))} cores (shared with other work: the load says how much); "
        f"{a.tokens} tokens per request, greedy, streamed; {a.requests_per_stream} requests "
        f"per stream; client {a.client}; model parameters "
        f"{a.model_params or 'as shipped'}{' on the GPU' if a.gpu else ''}",
        "",
        f"In-process (the model's own loop, one request at a time): {own.tps:,.0f} tokens/s, "
        f"TTFT {own.ttft * 1e3:.1f} ms, {_cell(own.cpu_us)} of CPU per token",
        "",
        "CPU per token: all of the server's processes (in process: the bench's), and shoal's "
        "model worker alone.",
        "",
        "| concurrency | mode | tokens/s | TTFT p50 | inflight / this (tokens/s) "
        "| CPU/token | worker CPU/token |",
        "|---|---|---|---|---|---|---|",
    ]
    modes = [*MODES, *(["triton request-level"] if peer else [])]
    for c in a.concurrency:
        inflight = got[("inflight", c)].tps
        for mode, pt in [
            *((m, got[(m, c)]) for m in modes),
            ("in-process (own loop, serial)", own),
        ]:
            lines.append(
                f"| {c} | {mode} | {pt.tps:,.0f} | {pt.ttft * 1e3:.1f} ms "
                f"| {inflight / pt.tps:.2f} | {_cell(pt.cpu_us)} | {_cell(pt.worker_us)} |"
            )
    return "\n".join(lines) + "\n"


def _peer_repo(tmp: Path, a: argparse.Namespace) -> Path:
    """tiny_llm_plain for the Triton peer: its model.py runs the shipped one with torch,
    tokenizers and shoal (the model's own loop uses its cache types) found in shoal's
    environment, after the peer's own numpy (its stub ignores $PYTHONPATH)."""
    repo = tmp / "peer-repo"
    shutil.copytree(TINY, repo / "tiny_llm_plain")
    (repo / "tiny_llm_plain" / "config.pbtxt").write_text(_config(a, "tiny_llm_plain", False))
    site = next(p for p in sys.path if p.endswith("site-packages") and str(REPO_ROOT) in p)
    (repo / "tiny_llm_plain" / "1" / "model.py").write_text(
        "import os, sys\n"
        "sys.path += [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep)"
        " if p not in sys.path]\n"
        f"sys.path += [{site!r}, {str(REPO_ROOT)!r}]\n"
        f"exec(compile(open({str(TINY / '1' / 'model.py')!r}).read(), 'model.py', 'exec'))\n"
    )
    return repo


def _measure(
    srv: ServerProcess, modes: dict[str, str], a: argparse.Namespace, got: Points, shoal: bool
) -> None:
    """Each of ``modes`` (way -> model) at each concurrency, with the server's CPU per
    token (by role on shoal: its model worker's apart)."""
    srv.start(300)
    try:
        assert srv.grpc_url is not None and srv.proc is not None
        for mode, model in modes.items():
            point = _aio_point if a.client == "asyncio" else _served_point
            point(srv.grpc_url, model, 1, a)  # (warm: the first steps, the caches)
            for c in a.concurrency:
                with cpu.PerRequest(srv.proc.pid, srv.http_url, model, by_role=shoal) as use:
                    pt = point(srv.grpc_url, model, c, a)
                per = use.result or {}  # (µs per request)
                server, worker = per.get("server"), per.get("worker")
                got[(mode, c)] = replace(
                    pt,
                    cpu_us=None if server is None else server / a.tokens,
                    worker_us=None if worker is None else worker / a.tokens,
                )
                print(f"[bench] {mode} c={c}: {pt.tps:,.0f} tok/s", flush=True)
    finally:
        srv.stop()


def _measure_peer(tmp: Path, a: argparse.Namespace, got: Points) -> None:
    """The Triton peer's request-level serving, where it can serve the model (with
    ``--gpu``, where its build has the GPU); else the report goes without it."""
    mode = "triton request-level"
    try:
        peer = triton_python_server(_peer_repo(tmp, a), tmp / "triton.log")
        _measure(peer, {mode: "tiny_llm_plain"}, a, got, shoal=False)
    except Exception as exc:  # (its start, or a request it failed: both say why)
        for key in [k for k in got if k[0] == mode]:
            del got[key]
        print(f"[bench] the Triton peer was not measured: {type(exc).__name__}: {exc}")


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    load = os.getloadavg()[0]
    got: Points = {}
    got[("in-process", 1)] = _in_process(a, max(4, a.requests_per_stream))
    with tempfile.TemporaryDirectory(prefix="shoal-bench-llm-") as tmp:
        srv = shoal_server(_repo(Path(tmp), a), Path(tmp) / "shoal.log")
        _measure(srv, MODES, a, got, shoal=True)
        if not a.no_peer:
            _measure_peer(Path(tmp), a, got)
    report = _report(a, load, got)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    out = a.out_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-llm.md"
    out.write_text(report)
    print(report)
    print(f"[bench] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
