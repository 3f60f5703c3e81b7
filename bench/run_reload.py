"""What a reload costs the requests that keep coming: explicit model control, in one run.

One shoal server (``--model-control-mode=explicit --load-model=mlp``) on a temporary
repository holding ``mlp`` as shipped. For each protocol and concurrency, perf_analyzer
drives ``mlp`` twice, one run after the other:

* ``steady``: nothing else happens;
* ``reloading``: a client reloads ``mlp`` (``POST /v2/repository/models/mlp/load``) every
  ``--reload-every`` seconds while perf_analyzer runs, each time after writing a file in
  its version folder (as in Triton, a load of a model none of whose files changed leaves
  it as it is). Each reload starts a new worker process beside the serving one, switches
  requests to it once it is READY, and stops the old one once it has answered what it
  held.

perf_analyzer stops at a failed request, so a ``reloading`` point that completes is a run
in which no request failed across its reloads; the table gives the throughput and p99
beside ``steady`` and how long each load call took. Baseline in the same run: in-process
ONNX Runtime on ``mlp`` at batch 1 (1 and 2 intra-op threads). A record, not a test.

    python bench/run_reload.py [--concurrency 1,8] [--protocols http,grpc] [--reload-every 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
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
from servers import shoal_server

MODEL = "mlp"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = side_by_side_parser(__doc__.splitlines()[0])
    p.add_argument("--reload-every", type=float, default=1.0, help="seconds between reloads")
    return p.parse_args(argv)


class Reloader(threading.Thread):
    """Reloads the model every ``every`` seconds until stopped; keeps each call's time."""

    def __init__(self, http_url: str, every: float, version_dir: Path) -> None:
        super().__init__(daemon=True)
        self.url = f"http://{http_url}/v2/repository/models/{MODEL}/load"
        self.marker = version_dir / "reloaded"  # (written before each load: a change)
        self.every = every
        self.stop_event = threading.Event()
        self.seconds: list[float] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop_event.wait(self.every):
            t0 = time.monotonic()
            try:
                self.marker.write_text(str(t0))
                req = urllib.request.Request(self.url, data=b"", method="POST")
                with urllib.request.urlopen(req, timeout=120) as r:
                    r.read()
                self.seconds.append(time.monotonic() - t0)
            except OSError as e:
                self.errors.append(str(e))

    def stop(self) -> None:
        self.stop_event.set()
        self.join()


def _report(
    a: argparse.Namespace,
    pa: str,
    got: dict[tuple[str, str, int], Measurement],
    reloads: dict[tuple[str, int], Reloader],
    ort: list[Measurement],
    load: float,
) -> str:
    lines = [
        *report_head("shoal: requests across reloads (explicit model control)", pa, load, ort),
        f"A reload of `{MODEL}` every {a.reload_every:g} s during the `reloading` runs.",
        "",
        "| protocol | c | steady /s | reloading /s | reloading/steady | steady p99 µs "
        "| reloading p99 µs | reloads | load call median s | failed loads |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol in a.protocols:
        for c in a.concurrency:
            steady = got.get(("steady", protocol, c))
            moving = got.get(("reloading", protocol, c))
            r = reloads.get((protocol, c))
            rate = [m.throughput if m else None for m in (steady, moving)]
            p99 = [m.p99_us if m else None for m in (steady, moving)]
            median = statistics.median(r.seconds) if r and r.seconds else None
            lines.append(
                f"| {protocol} | {c} | {fmt(rate[0], ',.0f')} | {fmt(rate[1], ',.0f')} | "
                f"{fmt(ratio(rate[1], rate[0]), '.2f')} | {fmt(p99[0], ',.0f')} | "
                f"{fmt(p99[1], ',.0f')} | {len(r.seconds) if r else '—'} | "
                f"{fmt(median, '.2f')} | {len(r.errors) if r else '—'} |"
            )
    lines += cpu.cpu_table(list(got.values()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    run = start_run(a.out_dir, "reload")
    got: dict[tuple[str, str, int], Measurement] = {}
    reloads: dict[tuple[str, int], Reloader] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-reload-") as tmp:
        repo = Path(tmp) / "repo"
        link_model(a.repo, repo, MODEL, (a.repo / MODEL / "config.pbtxt").read_text())
        srv = shoal_server(
            repo,
            run.raw / "shoal.log",
            extra=("--model-control-mode=explicit", f"--load-model={MODEL}"),
        )
        try:
            if start_server(srv, a.ready_timeout, skipped) is not None:
                for c in a.concurrency:
                    for protocol in a.protocols:
                        for mode in ("steady", "reloading"):
                            what = f"{mode} {protocol} c={c}"
                            print(f"[bench] perf_analyzer {what}", flush=True)
                            reloader = Reloader(srv.http_url, a.reload_every, repo / MODEL / "1")
                            if mode == "reloading":
                                reloads[(protocol, c)] = reloader
                                reloader.start()
                            try:
                                got[(mode, protocol, c)] = perf_point(
                                    run, a, srv.url(protocol), server=f"shoal-{mode}",
                                    model=MODEL, protocol=protocol, concurrency=c,
                                    name=f"{mode}-{protocol}-c{c}",
                                    srv=srv,
                                )  # fmt: skip
                            except (RuntimeError, OSError) as e:
                                skipped.append(f"{what}: {e}")
                            finally:
                                if mode == "reloading":
                                    reloader.stop()
        except KeyboardInterrupt:
            print("[bench] interrupted: writing what was measured", file=sys.stderr)
        finally:
            srv.stop()
    ort = [ort_baseline.measure(a.repo / MODEL / "1" / "model.onnx", MODEL, t) for t in (1, 2)]
    report = _report(a, run.pa, got, reloads, ort, run.load)
    return write_report(a.out_dir, run.stamp, "reload", report, skipped)


if __name__ == "__main__":
    sys.exit(main())
