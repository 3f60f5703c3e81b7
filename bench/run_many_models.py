"""What idle models cost the busy one: ``mlp`` served beside N idle batching models.

Triton users load dozens or hundreds of models behind one endpoint and drive a few. The
broker's loop turns on every request arrival and every finished batch; whatever it does
per turn for every loaded model, every request pays. This bench measures that tax.

Two shoal servers run side by side, each on a temporary repository (model files linked):

* ``baseline``: ``mlp`` (1 intra-op thread) and one idle model;
* ``crowded``: the same ``mlp`` and ``--idle`` idle models (default 40).

The idle models are copies of ``simple`` with ``dynamic_batching {}`` and one CPU instance
each. Both repositories sort ``mlp`` first, so in both it is pinned to the first core
(shoal shares the cores out round-robin once instances outnumber them) and runs the same
single thread: the servers differ in the idle models alone. perf_analyzer drives ``mlp``
(batch 1, HTTP and gRPC) on each server in turn at each concurrency, so drift hits both
alike. The report gives crowded/baseline: 1.0 means idle models cost nothing.

    python bench/run_many_models.py [--idle 40] [--concurrency 1,8] [--protocols http,grpc]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from common import (
    batching_point,
    fmt,
    link_model,
    ratio,
    report_head,
    side_by_side_parser,
    start_run,
    start_server,
    write_report,
)
from perf_analyzer import Measurement
from servers import ServerProcess, shoal_server

MODEL, IDLE_SRC = "mlp", "simple"
_ONE_THREAD = 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'


def build_repo(src: Path, dst: Path, idle: int) -> Path:
    """``mlp`` (one thread) plus ``idle`` batching copies of ``simple``, named after it."""
    mlp = (src / MODEL / "config.pbtxt").read_text().rstrip("\n") + "\n" + _ONE_THREAD
    link_model(src, dst, MODEL, mlp)
    base = (src / IDLE_SRC / "config.pbtxt").read_text()
    for k in range(idle):
        name = f"{IDLE_SRC}_{k:03d}"  # after "mlp": mlp keeps the first core
        text = base.replace(f'name: "{IDLE_SRC}"', f'name: "{name}"').rstrip("\n")
        text += "\ndynamic_batching {}\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n"
        _link_copy(src, dst, name, text)
    return dst


def _link_copy(src: Path, dst: Path, name: str, config_text: str) -> None:
    """``dst/name``: ``config_text`` and a symlink to ``simple``'s model file."""
    (dst / name / "1").mkdir(parents=True)
    (dst / name / "config.pbtxt").write_text(config_text)
    (dst / name / "1" / "model.onnx").symlink_to((src / IDLE_SRC / "1" / "model.onnx").resolve())


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = side_by_side_parser(__doc__.splitlines()[0])
    p.add_argument("--idle", type=int, default=40, help="idle models beside mlp (crowded)")
    return p.parse_args(argv)


def _report(a: argparse.Namespace, pa: str, results: dict[tuple, Measurement], load: float) -> str:
    lines = [
        *report_head(f"shoal: {MODEL} beside {a.idle} idle batching models", pa, load),
        "baseline: mlp + 1 idle model; crowded: mlp + the idle models. Same core, same thread.",
        "",
        "| protocol | c | baseline infer/s | crowded infer/s | crowded/baseline | "
        "baseline p50 µs | crowded p50 µs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol in a.protocols:
        for c in a.concurrency:
            b, k = results.get(("baseline", protocol, c)), results.get(("crowded", protocol, c))
            rate = [x.throughput if x else None for x in (b, k)]
            p50 = [x.p50_us if x else None for x in (b, k)]
            lines.append(
                f"| {protocol} | {c} | {fmt(rate[0], ',.0f')} | {fmt(rate[1], ',.0f')} | "
                f"{fmt(ratio(rate[1], rate[0]), '.2f')} | {fmt(p50[0], ',.0f')} | "
                f"{fmt(p50[1], ',.0f')} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    run = start_run(a.out_dir, "many")
    stamp, load, raw, pa = run.stamp, run.load, run.raw, run.pa
    results: dict[tuple, Measurement] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-many-") as tmp:
        repos = {
            "baseline": build_repo(a.repo, Path(tmp) / "baseline", 1),
            "crowded": build_repo(a.repo, Path(tmp) / "crowded", a.idle),
        }
        servers: dict[str, ServerProcess] = {}
        try:
            for label, repo in repos.items():  # one at a time: each takes its free ports
                servers[label] = shoal_server(repo, raw / f"shoal-{label}.log")
                start_server(servers[label], a.ready_timeout, skipped)
            live = {k: s for k, s in servers.items() if s.proc and s.proc.poll() is None}
            if len(live) < 2:
                print(f"[bench] a server did not start: {skipped}", file=sys.stderr)
                return 1
            for c in a.concurrency:
                for protocol in a.protocols:
                    for label, srv in live.items():
                        got = batching_point(pa, srv, label, "many", MODEL, c, protocol, a, raw)
                        if not isinstance(got, str):
                            results[(label, protocol, c)] = got.m
        except KeyboardInterrupt:
            print("[bench] interrupted: writing what was measured", file=sys.stderr)
        finally:
            for srv in servers.values():
                srv.stop()
    return write_report(a.out_dir, stamp, "many", _report(a, pa, results, load), [])


if __name__ == "__main__":
    sys.exit(main())
