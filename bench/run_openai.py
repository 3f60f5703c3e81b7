"""The OpenAI-compatible API's own cost: the same generation streamed through
``/v1/completions`` and through Triton's ``/v2/models/{m}/generate_stream`` (the
baseline, in the same run on the same server), and sent whole through ``/v1`` too.

The model is the tests' stand-in generative model (tests/generative_standin_model.py):
greedy, it writes the prompt reversed, one token per byte, with no compute of its own, so
what is measured is the path a token takes (worker, broker, frontend, the HTTP stream)
and the API's work on it. Both paths ask the model for the same outputs (the finish
reason and the token counts the API reads). At each concurrency C, C clients (aiohttp,
one event loop) send back to back for ``--seconds``; the report gives tokens/s and the
mean time to first token (streams), and the ratio of /v1 to generate_stream.

    python bench/run_openai.py [--concurrency 1,8,32] [--tokens 256] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from common import csv_ints, fmt, ratio, start_run, start_server, write_report
from servers import REPO_ROOT, shoal_server

sys.path.insert(0, str(REPO_ROOT))
from tests.generative import write_standin

MODEL = "standin"
EXTRAS = {"return_finish_reason": True, "return_num_input_tokens": True,
          "return_num_output_tokens": True}  # fmt: skip

Send = Callable[[aiohttp.ClientSession, str], Awaitable[tuple[int, float]]]


async def _events(resp: aiohttp.ClientResponse, started: float) -> tuple[int, float]:
    """The data events of a server-sent event stream, and when the first came."""
    count, first = 0, 0.0
    async for line in resp.content:
        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
            if count == 0:
                first = time.perf_counter() - started
            count += 1
    return count, first


def _senders(prompt: str, tokens: int) -> dict[str, Send]:
    async def v1(session: aiohttp.ClientSession, url: str, stream: bool) -> tuple[int, float]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "stream": stream}
        t0 = time.perf_counter()
        async with session.post(f"http://{url}/v1/completions", json=body) as resp:
            if stream:
                return await _events(resp, t0)
            doc = await resp.json()
            return int(doc["usage"]["completion_tokens"]), time.perf_counter() - t0

    async def generate(session: aiohttp.ClientSession, url: str) -> tuple[int, float]:
        body = {"text_input": prompt, "stream": True, "exclude_input_in_output": True,
                "sampling_parameters": json.dumps({"max_tokens": tokens}), **EXTRAS}  # fmt: skip
        t0 = time.perf_counter()
        async with session.post(f"http://{url}/v2/models/{MODEL}/generate_stream", json=body) as r:
            return await _events(r, t0)

    return {
        "generate_stream": generate,
        "v1 stream": lambda s, u: v1(s, u, True),
        "v1 whole": lambda s, u: v1(s, u, False),
    }


async def _point(url: str, send: Send, concurrency: int, seconds: float) -> tuple[float, float]:
    """Tokens/s and the mean time to the first token (or to the whole answer)."""
    tokens, firsts = 0, []
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession() as session:

        async def client() -> None:
            nonlocal tokens
            while time.perf_counter() < deadline:
                n, first = await send(session, url)
                tokens += n
                firsts.append(first)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return tokens / elapsed, statistics.mean(firsts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=csv_ints, default=[1, 8, 32])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    a = p.parse_args()
    run = start_run(a.out_dir, "openai")
    repo = Path(tempfile.mkdtemp(prefix="bench-openai-"))
    write_standin(repo, MODEL)
    skipped: list[str] = []
    srv = start_server(shoal_server(repo, run.raw / "shoal.log"), 300.0, skipped)
    if srv is None:
        return write_report(a.out_dir, run.stamp, "openai", "shoal did not start", skipped)
    senders = _senders("abcdefghij" * (a.tokens // 10 + 1), a.tokens)
    rows = [
        "| concurrency | path | tokens/s | mean first token (whole: answer) ms | "
        "/v1 : generate_stream |",
        "|---|---|---|---|---|",
    ]
    try:
        for c in a.concurrency:
            base = None
            for name, send in senders.items():
                asyncio.run(_point(srv.http_url, send, c, 0.5))  # warm up
                rate, first = asyncio.run(_point(srv.http_url, send, c, a.seconds))
                base = rate if base is None else base
                rows.append(f"| {c} | {name} | {rate:,.0f} | {first * 1e3:.1f} | "
                            f"{fmt(ratio(rate, base), '.2f')} |")  # fmt: skip
                print(rows[-1], flush=True)
    finally:
        srv.stop()
    head = [
        f"# The OpenAI API's cost per token ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"load average at start {run.load:.2f}; {a.tokens} tokens per request, "
        f"{a.seconds:.0f} s per point; the stand-in model (no compute)",
        "",
    ]
    return write_report(a.out_dir, run.stamp, "openai", "\n".join(head + rows) + "\n", skipped)


if __name__ == "__main__":
    sys.exit(main())
