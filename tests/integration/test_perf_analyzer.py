"""perf_analyzer, Triton's own load generator, runs unchanged against shoal.

Each case runs the real binary for a few short windows and asserts what it reports:
exit status 0, outputs checked against ``validation_data`` where perf_analyzer can
check them, and the server's statistics and shared-memory registrations afterwards.

The binary comes from ``$PERF_ANALYZER``, then ``perf_analyzer`` on the PATH (``pip
install perf-analyzer`` on hosts with glibc >= 2.38), then where the workplace's
``install-perf-analyzer`` puts it. Without any of them these tests are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import identity_config
from tests.integration import test_decoupled_ensembles as decoupled_ensembles
from tests.serverctl import ShoalServer
from tools import modelgen


def _binary() -> str | None:
    env = os.environ.get("PERF_ANALYZER")
    if env:
        return env
    on_path = shutil.which("perf_analyzer")
    if on_path:
        return on_path
    cached = Path.home() / ".cache" / "shoal-tools" / "perf_analyzer" / "perf_analyzer"
    return str(cached) if cached.is_file() else None


PERF_ANALYZER = _binary()
pytestmark = pytest.mark.skipif(
    PERF_ANALYZER is None,
    reason="perf_analyzer not found (set PERF_ANALYZER, or pip install perf-analyzer)",
)

_SIMPLE_IN = {"INPUT0": list(range(16)), "INPUT1": [3] * 16}
_SIMPLE_OUT = {"OUTPUT0": [i + 3 for i in range(16)], "OUTPUT1": [i - 3 for i in range(16)]}
_ENDPOINTS = {"http": ("-i", "http"), "grpc": ("-i", "grpc"), "grpc-stream": ("-i", "grpc")}


_ENSEMBLE = """
name: "ens" platform: "ensemble" max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "simple" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
    output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "DIFF" } },
  { model_name: "simple" model_version: -1
    input_map { key: "INPUT0" value: "SUM" } input_map { key: "INPUT1" value: "DIFF" }
    output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""


@pytest.fixture(scope="module")
def pa_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("pa-repo")
    modelgen.write_model(repo, "simple", modelgen.simple_model(), None)
    modelgen.write_model(
        repo,
        "identity_bytes",
        modelgen.identity_model("BYTES", [-1], batch=True),
        identity_config("identity_bytes", "BYTES", "[ -1 ]", 8),
    )
    config = modelgen.ACCUMULATE_CONFIG.format(
        name="acc", max_batch_size=4, corrid="TYPE_UINT64", idle_us=5_000_000, strategy="",
        extra="",
    )  # fmt: skip
    modelgen.write_model(repo, "acc", modelgen.accumulate_model(), config)
    (repo / "ens" / "1").mkdir(parents=True)  # simple, twice: OUT = 2 x INPUT0
    (repo / "ens" / "config.pbtxt").write_text(_ENSEMBLE)
    decoupled_ensembles.write_streaming(repo)  # ens_last_final: a response per element
    srv = ShoalServer(repo, "--allow-client-shm=true")
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def perf_analyzer(
    srv: ShoalServer, endpoint: str, model: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """One short perf_analyzer run: concurrency 1 unless ``args`` say otherwise, windows
    of 200 ms, and the first three windows taken as stable."""
    assert PERF_ANALYZER is not None
    port = srv.http_port if endpoint == "http" else srv.grpc_port
    argv = [PERF_ANALYZER, "-m", model, *_ENDPOINTS[endpoint], "-u", f"127.0.0.1:{port}"]
    if endpoint == "grpc-stream":
        argv.append("--streaming")
    argv += ["--measurement-interval", "200", "--stability-percentage", "100"]
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


def requests_counted(run: subprocess.CompletedProcess[str]) -> int:
    """The client's request count in the window perf_analyzer reports (its last)."""
    counts = [ln.split(":")[1] for ln in run.stdout.splitlines() if "Request count:" in ln]
    assert counts, run.stdout + run.stderr
    return int(counts[-1])


def inference_count(srv: ShoalServer, model: str) -> int:
    status, body = srv.http(f"/v2/models/{model}/stats")
    assert status == 200, body
    return int(json.loads(body)["model_stats"][0]["inference_count"])


def input_data(tmp_path: Path, outputs: dict[str, list[int]]) -> str:
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"data": [_SIMPLE_IN], "validation_data": [outputs]}))
    return str(path)


@pytest.mark.parametrize("endpoint", list(_ENDPOINTS))
def test_outputs_are_what_perf_analyzer_expects(
    pa_server: ShoalServer, endpoint: str, tmp_path: Path
) -> None:
    before = inference_count(pa_server, "simple")
    run = perf_analyzer(
        pa_server, endpoint, "simple", "--input-data", input_data(tmp_path, _SIMPLE_OUT)
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "error" not in (run.stdout + run.stderr).lower()
    assert "Concurrency: 1, throughput:" in run.stdout
    assert inference_count(pa_server, "simple") - before >= requests_counted(run) > 0


def test_perf_analyzer_catches_a_wrong_output(pa_server: ShoalServer, tmp_path: Path) -> None:
    """The control for the test above: its validation does compare the outputs."""
    wrong = {**_SIMPLE_OUT, "OUTPUT0": [0] * 16}
    run = perf_analyzer(pa_server, "http", "simple", "--input-data", input_data(tmp_path, wrong))
    assert "Output doesn't match expected output" in run.stdout + run.stderr


@pytest.mark.parametrize(
    ("endpoint", "model", "extra"),
    [
        ("http", "simple", ()),
        ("grpc", "simple", ("-b", "4")),
        ("grpc-stream", "simple", ()),
        ("http", "identity_bytes", ("--shape", "INPUT0:4", "--string-data", "shoal")),
        ("grpc", "identity_bytes", ("--shape", "INPUT0:3", "-b", "2")),
    ],
)
def test_system_shared_memory_is_served_and_released(
    pa_server: ShoalServer, endpoint: str, model: str, extra: tuple[str, ...]
) -> None:
    """perf_analyzer registers its regions, infers through them and unregisters them;
    afterwards the server holds no registration. (perf_analyzer cannot validate outputs
    that come back in shared memory, against Triton as against shoal.)"""
    before = inference_count(pa_server, model)
    run = perf_analyzer(
        pa_server,
        endpoint,
        model,
        "--shared-memory",
        "system",
        "--output-shared-memory-size",
        "4096",
        *extra,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "error" not in (run.stdout + run.stderr).lower()
    batch = int(extra[extra.index("-b") + 1]) if "-b" in extra else 1
    assert inference_count(pa_server, model) - before >= requests_counted(run) * batch > 0
    status, body = pa_server.http("/v2/systemsharedmemory/status")
    assert (status, json.loads(body)) == (200, [])


@pytest.mark.parametrize("endpoint", ["http", "grpc-stream"])
def test_request_rate_mode_is_answered(pa_server: ShoalServer, endpoint: str) -> None:
    """Request-rate mode sends asynchronously on a schedule, not one request after
    another: every request is answered."""
    before = inference_count(pa_server, "simple")
    # (a rate the server keeps on a loaded 2-core machine: one perf_analyzer cannot keep
    # up with prints no summary line for it)
    run = perf_analyzer(pa_server, endpoint, "simple", "--request-rate-range", "50")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "error" not in (run.stdout + run.stderr).lower()
    assert any(ln.startswith("Request Rate: 50,") for ln in run.stdout.splitlines()), run.stdout
    assert inference_count(pa_server, "simple") - before >= requests_counted(run) > 0


@pytest.mark.parametrize("endpoint", list(_ENDPOINTS))
def test_sequences_are_driven_as_against_triton(pa_server: ShoalServer, endpoint: str) -> None:
    """perf_analyzer reads sequence_batching from the config and sends sequences (IDs,
    START and END) itself: three at once, four requests each; none is refused."""
    before = inference_count(pa_server, "acc")
    run = perf_analyzer(
        pa_server, endpoint, "acc", "--sequence-length", "4", "--concurrency-range", "3"
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "error" not in (run.stdout + run.stderr).lower()
    assert inference_count(pa_server, "acc") - before >= requests_counted(run) > 0
    status, body = pa_server.http("/v2/models/acc/stats")
    assert status == 200
    assert json.loads(body)["model_stats"][0]["inference_stats"]["fail"]["count"] == 0


@pytest.mark.parametrize("endpoint", list(_ENDPOINTS))
def test_an_ensemble_is_driven_and_its_outputs_checked(
    pa_server: ShoalServer, endpoint: str, tmp_path: Path
) -> None:
    """perf_analyzer reads the ensemble's config (and its composing models' statistics);
    its outputs are validated: OUT = 2 x INPUT0."""
    before = inference_count(pa_server, "ens")
    expected = {"OUT": [2 * v for v in _SIMPLE_IN["INPUT0"]]}
    run = perf_analyzer(pa_server, endpoint, "ens", "--input-data", input_data(tmp_path, expected))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "error" not in (run.stdout + run.stderr).lower()
    assert inference_count(pa_server, "ens") - before >= requests_counted(run) > 0


def test_a_decoupled_ensemble_is_streamed(pa_server: ShoalServer) -> None:
    """perf_analyzer reads the ensemble's config (decoupled, from its step), streams to
    it and counts each request's four responses; the ensemble counts the requests."""
    before = inference_count(pa_server, "ens_last_final")
    run = perf_analyzer(
        pa_server, "grpc-stream", "ens_last_final", "--shape", "IN:4", "--input-data", "zero"
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "error" not in (run.stdout + run.stderr).lower()
    assert "Detected decoupled model" in run.stdout

    def rate(label: str) -> float:  # the figure of the last window perf_analyzer reports
        found = [ln.split(":")[1] for ln in run.stdout.splitlines() if ln.strip().startswith(label)]
        assert found, run.stdout
        return float(found[-1].split()[0])

    assert rate("Response Throughput:") == pytest.approx(4 * rate("Throughput:"), rel=0.05)
    assert inference_count(pa_server, "ens_last_final") - before >= requests_counted(run) > 0
