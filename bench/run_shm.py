"""Benchmark: a 64 MiB FP32 identity through HTTP, gRPC and client system shared memory.

One run: writes a temporary repository holding ``identity64`` (ONNX Identity, FP32
[16777216], max_batch_size 0), starts ``shoal serve --allow-client-shm=true`` on free
loopback ports, and times, in this process with tritonclient (median and p90 per request):

- ``http``: binary tensor data in and out;
- ``grpc``: raw_input_contents / raw_output_contents;
- ``shm``: input and output in system shared memory regions created and registered once
  (over HTTP and over gRPC); the input written once before the loop, and a variant that
  rewrites the input (one numpy copy into the region) on every request;
- perf_analyzer ``--shared-memory system --output-shared-memory-size 67108864`` at
  concurrency 1 over gRPC and HTTP (its avg and p50 latency);

next to two baselines measured in the same run: one 64 MiB memcpy between two pre-faulted
buffers (``np.copyto``), and the model's own work, an in-process ONNX Runtime ``sess.run``
on the same model file. Each path is reported as ms/request, ms above the in-process ORT
time, and that overhead in memcpy-equivalents (the target: the shm path under 2).
``--with-triton-peer`` repeats the tritonclient paths against the real Triton.

    python bench/run_shm.py [--reps 20] [--warmup 3] [--with-triton-peer] [--no-perf-analyzer]

Writes ``bench/results/shm-<timestamp>.md`` (server logs and perf_analyzer output in
``bench/results/shm-<timestamp>-raw/``). Leaves nothing behind: servers stopped, client
regions unregistered and destroyed, the temporary repository removed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from perf_analyzer import perf_analyzer_path, perf_analyzer_version
from servers import (
    REPO_ROOT,
    ServerProcess,
    free_port_block,
    triton_peer_server,
)

MODEL = "identity64"
ELEMS = 16 * 1024 * 1024  # FP32 elements: 64 MiB
NBYTES = ELEMS * 4
CONFIG = f"""\
name: "{MODEL}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {{
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ {ELEMS} ]
  }}
]
output [
  {{
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ {ELEMS} ]
  }}
]
instance_group [
  {{
    count: 1
    kind: KIND_CPU
  }}
]
"""


@dataclass
class Row:
    """One path: its per-request times in ms (or a single perf_analyzer figure)."""

    server: str
    path: str
    times_ms: list[float] = field(default_factory=list)
    median_ms: float | None = None
    p90_ms: float | None = None
    note: str = ""

    def finish(self) -> Row:
        if self.times_ms:
            self.median_ms = statistics.median(self.times_ms)
            self.p90_ms = _pct(self.times_ms, 90)
        return self


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(np.ceil(p / 100 * len(s))) - 1))
    return s[k]


def _timed(fn: Callable[[], object], reps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


# --------------------------------------------------------------------------- baselines


def memcpy_ms(reps: int) -> list[float]:
    src = np.full(ELEMS, 1.5, dtype=np.float32)
    dst = np.zeros(ELEMS, dtype=np.float32)  # zeros may be lazily mapped: touch every page
    dst.fill(0.0)
    return _timed(lambda: np.copyto(dst, src), reps, 3)


def ort_ms(model_path: Path, x: np.ndarray, reps: int) -> list[float]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    feed = {"INPUT0": x}
    out = sess.run(["OUTPUT0"], feed)[0]
    assert np.array_equal(out, x), "ORT identity returned other data"
    del out
    return _timed(lambda: sess.run(["OUTPUT0"], feed), reps, 3)


# --------------------------------------------------------------------------- client paths


def _client_timeouts() -> dict[str, float]:
    return {"connection_timeout": 300.0, "network_timeout": 300.0}


def http_binary(url: str, x: np.ndarray, reps: int, warmup: int) -> list[float]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url, **_client_timeouts())
    try:

        def once() -> np.ndarray:
            inp = httpclient.InferInput("INPUT0", [ELEMS], "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            return client.infer(MODEL, [inp], outputs=[out]).as_numpy("OUTPUT0")

        assert np.array_equal(once(), x), "HTTP identity returned other data"
        return _timed(once, reps, warmup)
    finally:
        client.close()


def grpc_raw(url: str, x: np.ndarray, reps: int, warmup: int) -> list[float]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:

        def once() -> np.ndarray:
            inp = grpcclient.InferInput("INPUT0", [ELEMS], "FP32")
            inp.set_data_from_numpy(x)
            out = grpcclient.InferRequestedOutput("OUTPUT0")
            return client.infer(MODEL, [inp], outputs=[out], client_timeout=300).as_numpy("OUTPUT0")

        assert np.array_equal(once(), x), "gRPC identity returned other data"
        return _timed(once, reps, warmup)
    finally:
        client.close()


def shm_paths(
    protocol: str, url: str, x: np.ndarray, reps: int, warmup: int
) -> tuple[list[float], list[float]]:
    """(input written once, input rewritten per request): both register the regions once."""
    import tritonclient.utils.shared_memory as shm

    if protocol == "http":
        import tritonclient.http as tc

        client = tc.InferenceServerClient(url, **_client_timeouts())
    else:
        import tritonclient.grpc as tc  # type: ignore[no-redef]

        client = tc.InferenceServerClient(url)
    tag = f"shoal_bench_{os.getpid()}_{protocol}"
    names = {"in": f"{tag}_in", "out": f"{tag}_out"}
    handles: dict[str, object] = {}
    registered: list[str] = []
    try:
        for k, name in names.items():
            handles[k] = shm.create_shared_memory_region(name, "/" + name, NBYTES, create_only=True)
        shm.set_shared_memory_region(handles["in"], [x])
        out_view = shm.get_contents_as_numpy(handles["out"], np.float32, [ELEMS])
        out_view.fill(0.0)  # fault the output pages in before the server writes them
        for name in names.values():
            client.register_system_shared_memory(name, "/" + name, NBYTES)
            registered.append(name)

        def once() -> None:
            inp = tc.InferInput("INPUT0", [ELEMS], "FP32")
            inp.set_shared_memory(names["in"], NBYTES)
            out = tc.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(names["out"], NBYTES)
            client.infer(MODEL, [inp], outputs=[out])

        def rewrite_once() -> None:
            shm.set_shared_memory_region(handles["in"], [x])
            once()

        once()
        assert np.array_equal(out_view, x), f"shm over {protocol}: output region differs"
        out_view.fill(0.0)
        fixed = _timed(once, reps, warmup)
        assert np.array_equal(out_view, x), f"shm over {protocol}: output region differs"
        rewrite = _timed(rewrite_once, reps, warmup)
        del out_view  # an exported view would keep the region from closing
        return fixed, rewrite
    finally:
        for name in registered:
            with contextlib.suppress(Exception):
                client.unregister_system_shared_memory(name)
        for h in handles.values():
            with contextlib.suppress(Exception):
                shm.destroy_shared_memory_region(h)
        client.close()


# --------------------------------------------------------------------------- perf_analyzer


_PASS = re.compile(r"Pass \[\d+\] throughput: ([\d.]+) infer/sec\. Avg latency: (\d+) usec")


def _dev_shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir()}


def perf_analyzer_shm(
    pa: str, url: str, protocol: str, raw: Path, interval_ms: int, server: str
) -> Row:
    csv_path = raw / f"pa-{server}-{protocol}-shm.csv"
    argv = [
        pa,
        *("-m", MODEL, "-u", url, "-i", protocol, "-b", "1", "-v"),
        *("--shared-memory", "system", "--output-shared-memory-size", str(NBYTES)),
        *("--concurrency-range", "1:1:1", "--measurement-interval", str(interval_ms)),
        *("--max-trials", "5", "--stability-percentage", "30", "-f", str(csv_path)),
    ]
    before = _dev_shm()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        text, rc = out.stdout + out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        text, rc = f"timed out\n{text}", -1
    (raw / f"pa-{server}-{protocol}-shm.log").write_text(" ".join(argv) + "\n" + text)
    # perf_analyzer names its regions after the tensors; remove any it left behind.
    for name in _dev_shm() - before:
        if not name.startswith("shoal-") and ("INPUT0" in name or "OUTPUT0" in name):
            Path("/dev/shm", name).unlink(missing_ok=True)
    row = Row(server, f"perf_analyzer {protocol} --shared-memory system")
    avg = re.search(r"Avg latency: (\d+) usec", text)
    if rc == 0 and csv_path.exists():
        with csv_path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        if rows:
            r = rows[0]
            row.median_ms = float(r["p50 latency"]) / 1e3
            row.p90_ms = float(r["p90 latency"]) / 1e3
            if "Avg latency" in r:
                row.note = f"avg {float(r['Avg latency']) / 1e3:.1f} ms"
            elif avg:
                row.note = f"avg {int(avg[1]) / 1e3:.1f} ms"
            row.note += f"; {float(r['Inferences/Second']):.2f} infer/s"
            return row
    passes = [(float(m[1]), float(m[2])) for m in _PASS.finditer(text)][-3:]
    if len(passes) == 3:  # never settled: the mean of its last 3 windows, as run.py does
        tput = statistics.fmean(p[0] for p in passes)
        row.median_ms = statistics.fmean(p[1] for p in passes) / 1e3
        row.note = (
            f"unstable: last 3 windows' mean avg latency (in the median column); {tput:.2f} infer/s"
        )
        return row
    tail = " | ".join(text.strip().splitlines()[-2:])
    row.note = f"failed (rc {rc}): {tail[:200]}"
    return row


# --------------------------------------------------------------------------- one server


def measure_server(
    server: str,
    http_url: str,
    grpc_url: str,
    x: np.ndarray,
    args: argparse.Namespace,
    raw: Path,
    pa: str | None,
) -> list[Row]:
    rows: list[Row] = []

    def attempt(path: str, fn: Callable[[], list[float]]) -> None:
        print(f"  {server}: {path} ...", flush=True)
        try:
            rows.append(Row(server, path, fn()).finish())
        except Exception as e:  # a failing path is reported, the rest still run
            rows.append(Row(server, path, note=f"failed: {type(e).__name__}: {str(e)[:160]}"))

    attempt("HTTP binary", lambda: http_binary(http_url, x, args.reps, args.warmup))
    attempt("gRPC", lambda: grpc_raw(grpc_url, x, args.reps, args.warmup))
    for protocol, url in (("gRPC", grpc_url), ("HTTP", http_url)):
        print(f"  {server}: shm over {protocol} ...", flush=True)
        try:
            fixed, rewrite = shm_paths(protocol.lower(), url, x, args.reps, args.warmup)
            rows.append(Row(server, f"shm over {protocol}, input written once", fixed).finish())
            rows.append(Row(server, f"shm over {protocol}, input rewritten", rewrite).finish())
        except Exception as e:
            msg = f"failed: {type(e).__name__}: {str(e)[:160]}"
            rows.append(Row(server, f"shm over {protocol}", note=msg))
    if pa is not None:
        for protocol, url in (("grpc", grpc_url), ("http", http_url)):
            print(f"  {server}: perf_analyzer -i {protocol} --shared-memory system ...", flush=True)
            rows.append(perf_analyzer_shm(pa, url, protocol, raw, args.pa_interval, server))
    return rows


def shoal_shm_server(repo: Path, log_path: Path) -> ServerProcess:
    base = free_port_block(3)
    argv = [
        str(REPO_ROOT / ".venv" / "bin" / "shoal"),
        "serve",
        *("--model-repository", str(repo)),
        *("--http-address", "127.0.0.1", "--http-port", str(base)),
        *("--grpc-address", "127.0.0.1", "--grpc-port", str(base + 1)),
        *("--metrics-port", str(base + 2)),
        "--allow-client-shm=true",
        # The HTTP body is 64 MiB of tensor plus its JSON header: over the 64 MiB default.
        *("--http-max-input-size", str(2 * NBYTES)),
    ]
    return ServerProcess(
        "shoal", argv, f"127.0.0.1:{base}", log_path, grpc_url=f"127.0.0.1:{base + 1}"
    )


# --------------------------------------------------------------------------- report


def _f(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def render(
    rows: list[Row],
    memcpy: list[float],
    ort: list[float],
    args: argparse.Namespace,
    started: str,
    load: str,
    pa_version: str,
) -> str:
    mc = statistics.median(memcpy)
    om = statistics.median(ort)
    lines = [
        f"# 64 MiB FP32 identity: HTTP, gRPC, client system shared memory ({started})",
        "",
        f"- host: {platform.node()}, {os.cpu_count()} CPUs, load average at start {load}",
        f"- model `{MODEL}`: ONNX Identity FP32 [{ELEMS}], max_batch_size 0 ({NBYTES:,} bytes)",
        f"- {args.reps} timed requests per tritonclient path after {args.warmup} warm-ups, "
        "one client in this process, one request at a time",
        f"- perf_analyzer: {pa_version}, concurrency 1, {args.pa_interval} ms windows",
        f"- memcpy of 64 MiB (np.copyto, pre-faulted buffers): median {mc:.2f} ms, "
        f"p90 {_pct(memcpy, 90):.2f} ms ({NBYTES / mc / 1e6:.1f} GB/s), {len(memcpy)} copies",
        f"- model's own work (in-process ORT sess.run, 1 thread): median {om:.2f} ms, "
        f"p90 {_pct(ort, 90):.2f} ms = {om / mc:.2f} memcpys",
        "",
        "Overhead = median minus the in-process ORT median; in memcpys = overhead / memcpy "
        "median. Target: the shared-memory path (input written once) < 2 memcpys.",
        "",
        "| server | path | median ms | p90 ms | overhead ms | overhead in memcpys | note |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        over = None if r.median_ms is None else r.median_ms - om
        lines.append(
            f"| {r.server} | {r.path} | {_f(r.median_ms)} | {_f(r.p90_ms)} | {_f(over)} "
            f"| {_f(None if over is None else over / mc, '.2f')} | {r.note.replace('|', '/')} |"
        )
    lines += ["", "## Target", ""]
    for r in rows:
        if "written once" in r.path and r.median_ms is not None:
            m = (r.median_ms - om) / mc
            verdict = "met" if m < 2 else "not met"
            lines.append(f"- {r.server}, {r.path}: {m:.2f} memcpys over the model: {verdict}")
    by = {(r.server, r.path): r.median_ms for r in rows}
    ratio_lines = []
    for server in dict.fromkeys(r.server for r in rows):
        s = by.get((server, "shm over gRPC, input written once"))
        for other in ("HTTP binary", "gRPC"):
            o = by.get((server, other))
            if s and o:
                ratio_lines.append(f"- {server}: {other} / shm over gRPC = {o / s:.2f}x")
    if ratio_lines:
        lines += ["", "## Ratios (median ms, same server)", "", *ratio_lines]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--memcpy-reps", type=int, default=60)
    ap.add_argument("--pa-interval", type=int, default=3000, help="perf_analyzer window, ms")
    ap.add_argument("--no-perf-analyzer", action="store_true")
    ap.add_argument("--with-triton-peer", action="store_true")
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupt)

    started = time.strftime("%Y%m%d-%H%M%S")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    raw = args.out_dir / f"shm-{started}-raw"
    raw.mkdir(parents=True, exist_ok=True)
    pa = None if args.no_perf_analyzer else perf_analyzer_path()
    pa_version = "not run" if pa is None else perf_analyzer_version(pa)

    sys.path.insert(0, str(REPO_ROOT))  # tools/ (the model generators) is not installed
    from tools.modelgen import identity_model, write_model

    tmp = Path(tempfile.mkdtemp(prefix="shoal-shm-bench-"))
    rows: list[Row] = []
    memcpy: list[float] = []
    ort: list[float] = []
    try:
        repo = tmp / "repo"
        write_model(repo, MODEL, identity_model("FP32", [ELEMS], batch=False), CONFIG)
        x = np.random.default_rng(0).standard_normal(ELEMS, dtype=np.float32)

        print("baselines: memcpy, in-process ORT ...", flush=True)
        memcpy = memcpy_ms(args.memcpy_reps)
        ort = ort_ms(repo / MODEL / "1" / "model.onnx", x, max(args.reps, 20))

        print("starting shoal ...", flush=True)
        with shoal_shm_server(repo, raw / "shoal.log").start(args.ready_timeout) as srv:
            assert srv.grpc_url is not None
            rows += measure_server("shoal", srv.http_url, srv.grpc_url, x, args, raw, pa)
        # A second memcpy sample after the server runs: drift shows as a gap between the two.
        memcpy += memcpy_ms(args.memcpy_reps)

        if args.with_triton_peer:
            print("starting the Triton peer ...", flush=True)
            peer_tmp = tmp / "peer-tmp"
            peer_tmp.mkdir()
            peer = triton_peer_server(repo, raw / "triton.log", peer_tmp)
            with peer.start(args.ready_timeout) as srv:
                assert srv.grpc_url is not None
                rows += measure_server("triton", srv.http_url, srv.grpc_url, x, args, raw, pa)
    except KeyboardInterrupt:
        print("interrupted: writing what was measured", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    if not memcpy or not ort:
        print("baselines not measured; no report", file=sys.stderr)
        return 1
    report = render(rows, memcpy, ort, args, started, load, pa_version)
    out = args.out_dir / f"shm-{started}.md"
    out.write_text(report)
    print(report)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
