"""What shoal's stateful and composed models cost: sequences and ensembles, each beside
the same work done plainly, in one run.

Two shoal servers, one after the other (each alone on the cores), on temporary
repositories:

* ``sequences``: ``acc`` (``tools.modelgen.accumulate_model``: a running sum kept in
  Triton's implicit state, Direct strategy, 8 slots) driven by perf_analyzer as
  sequences of ``--sequence-length`` requests, beside ``acc_plain``: the same ONNX model
  as a plain model whose control and state tensors the client sends (perf_analyzer
  fills them with random data). The ratio sequence/plain is what the sequence batcher
  costs: slots, control tensors and the state kept between requests.
* ``ensembles``: ``mlp`` as shipped, beside ``mlp_twice``, an ensemble that runs it twice
  (its output is the second run's input). Each ensemble request is two requests to
  ``mlp``; 2 x ensemble/s over mlp/s is the share of mlp's throughput left once the
  frontend runs the steps.

Baselines in the same run: in-process ONNX Runtime on both models at batch 1 (1 and 2
intra-op threads); for the ensemble, two ``sess.run`` calls per request. A record, not a
test.

    python bench/run_pipelines.py [--concurrency 1,8] [--protocols http,grpc]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import cpu
import ort_baseline
from common import (
    fmt,
    link_model,
    perf_point,
    ratio,
    report_head,
    side_by_side_parser,
    start_run,
    start_server,
    write_report,
)
from perf_analyzer import Measurement
from servers import REPO_ROOT, shoal_server

sys.path.insert(0, str(REPO_ROOT))  # tools/ (the model generators) is not installed
from tools import modelgen

ENSEMBLE = """\
name: "mlp_twice"
platform: "ensemble"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
ensemble_scheduling { step [
  { model_name: "mlp" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "MID" } },
  { model_name: "mlp" model_version: -1
    input_map { key: "INPUT0" value: "MID" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
"""
PLAIN = """\
name: "acc_plain"
platform: "onnxruntime_onnx"
max_batch_size: 8
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
# server -> the models each point drives, and the perf_analyzer flags of each
SERVERS: dict[str, dict[str, tuple[str, ...]]] = {
    "sequences": {"acc": ("--sequence-length", "20"), "acc_plain": ()},
    "ensembles": {"mlp": (), "mlp_twice": ()},
}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    return side_by_side_parser(__doc__.splitlines()[0]).parse_args(argv)


def _repos(src: Path, tmp: Path) -> dict[str, Path]:
    seq, ens = tmp / "sequences", tmp / "ensembles"
    model = modelgen.accumulate_model()
    config = modelgen.ACCUMULATE_CONFIG.format(
        name="acc", max_batch_size=8, corrid="TYPE_UINT64", idle_us=5_000_000, strategy="",
        extra="instance_group [ { count: 1 kind: KIND_CPU } ]",
    )  # fmt: skip
    modelgen.write_model(seq, "acc", model, config)
    modelgen.write_model(seq, "acc_plain", model, PLAIN)
    link_model(src, ens, "mlp", (src / "mlp" / "config.pbtxt").read_text())
    (ens / "mlp_twice" / "1").mkdir(parents=True)
    (ens / "mlp_twice" / "config.pbtxt").write_text(ENSEMBLE)
    return {"sequences": seq, "ensembles": ens}


def _ort(src: Path, seq_repo: Path) -> dict[str, list[Measurement]]:
    out = {}
    for name, path in (("mlp", src / "mlp"), ("acc", seq_repo / "acc")):
        out[name] = [ort_baseline.measure(path / "1" / "model.onnx", name, t) for t in (1, 2)]
    return out


def _report(
    a: argparse.Namespace,
    pa: str,
    got: dict[tuple[str, str, int], Measurement],
    ort: dict[str, list[Measurement]],
    load: float,
) -> str:
    def best(model: str) -> float | None:
        return max((m.throughput for m in ort.get(model, [])), default=None)

    lines = [
        *report_head("shoal: sequences and ensembles", pa, load),
        "In-process ONNX Runtime, batch 1: "
        + "; ".join(
            f"{m.model} {m.server} {m.throughput:,.0f}/s" for ms in ort.values() for m in ms
        ),
        "",
        "| protocol | c | acc (sequences) /s | acc_plain /s | sequence/plain | acc/ORT "
        "| mlp /s | mlp_twice /s | 2 x twice/mlp | twice/(ORT/2) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol in a.protocols:
        for c in a.concurrency:
            rate = {
                model: (m.throughput if (m := got.get((model, protocol, c))) else None)
                for models in SERVERS.values()
                for model in models
            }
            twice = rate["mlp_twice"]
            mlp_ort = best("mlp")
            lines.append(
                f"| {protocol} | {c} | {fmt(rate['acc'], ',.0f')} | "
                f"{fmt(rate['acc_plain'], ',.0f')} | "
                f"{fmt(ratio(rate['acc'], rate['acc_plain']), '.2f')} | "
                f"{fmt(ratio(rate['acc'], best('acc')), '.2f')} | "
                f"{fmt(rate['mlp'], ',.0f')} | {fmt(twice, ',.0f')} | "
                f"{fmt(ratio(2 * twice if twice else None, rate['mlp']), '.2f')} | "
                f"{fmt(ratio(twice, mlp_ort / 2 if mlp_ort else None), '.2f')} |"
            )
    lines += cpu.cpu_table(list(got.values()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    run = start_run(a.out_dir, "pipelines")
    got: dict[tuple[str, str, int], Measurement] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-pipelines-") as tmp:
        repos = _repos(a.repo, Path(tmp))
        for name, models in SERVERS.items():  # one server at a time: each has the cores
            srv = shoal_server(repos[name], run.raw / f"shoal-{name}.log")
            srv.name = f"shoal-{name}"
            try:
                if start_server(srv, a.ready_timeout, skipped) is None:
                    continue
                for c in a.concurrency:
                    for protocol in a.protocols:
                        for model, extra in models.items():
                            what = f"{model} {protocol} c={c}"
                            print(f"[bench] perf_analyzer {what}", flush=True)
                            try:
                                got[(model, protocol, c)] = perf_point(
                                    run, a, srv.url(protocol), server="shoal", model=model,
                                    protocol=protocol, concurrency=c,
                                    name=f"{model}-{protocol}-c{c}", extra=extra,
                                    srv=srv,
                                )  # fmt: skip
                            except (RuntimeError, OSError) as e:
                                skipped.append(f"{what}: {e}")
            except KeyboardInterrupt:
                print("[bench] interrupted: writing what was measured", file=sys.stderr)
                break
            finally:
                srv.stop()
        ort = _ort(a.repo, repos["sequences"])
    report = _report(a, run.pa, got, ort, run.load)
    return write_report(a.out_dir, run.stamp, "pipelines", report, skipped)


if __name__ == "__main__":
    sys.exit(main())
