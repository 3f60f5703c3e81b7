"""``shoal analyze`` end to end, with a short budget: it runs its own server, reloads the
model in place between points, and leaves a report, a plot and a recommended config.pbtxt
that shoal's validator accepts and that --write puts beside the model. The recommendation
is measured again, beside the model's own config, on a server of the test's own; and the
built-in load generator is checked against perf_analyzer on one point (where
perf_analyzer is found).

The model is one where the better config wins by a wide margin whatever else the host
does: a Python model whose every execution naps 20 ms, whatever its batch (as a model
bound by a device or a remote call would), served by one instance without dynamic
batching. At 4 requests in flight a second instance doubles its throughput, and that is
the first neighbour the search tries; the nap costs no CPU, so a busy host moves both
configs alike. Measurement windows are tiny (0.3 s) to keep the module within its time."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from shoal.analyze.load import BuiltinLoad, PerfAnalyzerLoad
from shoal.analyze.search import Sample
from shoal.configs.model_config import config_to_json, fill_defaults, parse_config_text
from shoal.configs.validation import validate
from tests.integration.test_perf_analyzer import PERF_ANALYZER
from tests.serverctl import ShoalServer, processes_with, served

MODEL = "nap"
OWN = "instance_group [ { count: 1 kind: KIND_CPU } ]"
NAP = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.02)  # one nap per execution, whatever its batch
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""
CONFIG = f"""name: "{MODEL}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{OWN}
"""
#: The recommendation, measured again beside the model's own config, must beat it by at
#: least this factor: two instances of a napping model do twice the work (the median of
#: three turns each, in turn on one server).
GAIN = 1.4


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(the repository, the report folder, the analyzer's stderr) of one analysis."""
    repo = tmp_path_factory.mktemp("analyze-repo")
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.py").write_text(NAP)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    out = tmp_path_factory.mktemp("analyze-report")
    # four points: its own config, two instances, then both again to confirm the win
    run = subprocess.run(
        [sys.executable, "-m", "shoal", "analyze", f"--model-repository={repo}",
         f"--model={MODEL}", "--concurrency=1,4", "--budget-secs=60", "--max-points=4",
         "--window-secs=0.3", "--load=builtin", f"--output={out}", "--write", "--gpu=all"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert not processes_with(str(repo)), "the analyzer left its server's processes behind"
    return repo, out, run.stderr


@pytest.fixture(scope="module")
def server(analysed: tuple[Path, Path, str]) -> Iterator[ShoalServer]:
    """The analysed repository (where --write left the recommendation as the model's
    config) under explicit model control, as the analyzer's own server runs it."""
    with served(analysed[0], "--model-control-mode=explicit", f"--load-model={MODEL}") as srv:
        yield srv


def test_progress_report_and_plot_are_produced(analysed: tuple[Path, Path, str]) -> None:
    _, out, stderr = analysed
    assert "[analyze] point 1 (0 s of 60 s): 1 inst / mbs 8" in stderr  # its own config first
    assert "[analyze] --gpu: this host shows no GPU" in stderr  # (a host without one)
    assert "[analyze] recommended: 2 inst / mbs 8" in stderr
    report = (out / "report.md").read_text()
    for part in ("## Summary", "## Pareto front", "| config | concurrency | inferences/s",
                 "against the model's own config", "## Recommended config.pbtxt",
                 "### Why it won", "- Against the model's own config it changes instances: "
                 "1 -> 2.", "- instances 2 -> 1: "):  # fmt: skip
        assert part in report, part
    svg = ET.parse(out / "pareto.svg").getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert svg.findall("{http://www.w3.org/2000/svg}circle")
    points = json.loads((out / "results.json").read_text())
    assert len(points) >= 2 and all(p["samples"] or p["error"] for p in points)


def test_the_recommended_config_is_valid_and_written_beside_the_model(
    analysed: tuple[Path, Path, str],
) -> None:
    repo, out, _ = analysed
    text = (out / "config.pbtxt").read_text()
    assert (repo / MODEL / "config.pbtxt").read_text() == text  # --write
    assert OWN.split()[0] in (repo / MODEL / "config.pbtxt.orig").read_text()
    validate(fill_defaults(parse_config_text(text, MODEL), MODEL), MODEL)


def test_the_recommendation_is_no_worse_than_the_models_own_config(
    analysed: tuple[Path, Path, str], server: ShoalServer
) -> None:
    """Measured as the analyzer measures (the model reloaded in place with each config),
    in turn on one server, three times each: the medians compare."""
    repo, out, _ = analysed
    configs = {
        "own": (repo / MODEL / "config.pbtxt.orig").read_text(),
        "recommended": (out / "config.pbtxt").read_text(),
    }
    grpc_url = f"127.0.0.1:{server.grpc_port}"
    runs: dict[str, list[float]] = {name: [] for name in configs}
    with grpcclient.InferenceServerClient(grpc_url) as client:
        for _ in range(3):
            for name, text in configs.items():
                config = config_to_json(parse_config_text(text, MODEL))
                client.load_model(MODEL, config=json.dumps(config))
                runs[name].append(BuiltinLoad(grpc_url, MODEL, config).run(4, 0.3).throughput)
    own, recommended = (statistics.median(runs[n]) for n in ("own", "recommended"))
    assert recommended >= own * GAIN, runs


@pytest.mark.skipif(PERF_ANALYZER is None, reason="perf_analyzer is not installed")
def test_the_built_in_load_and_perf_analyzer_agree_on_one_point(server: ShoalServer) -> None:
    """The best throughput of two turns each, within a factor of three of each other (at
    a fixed concurrency, throughput fixes the mean latency too): perf_analyzer
    is C++ in a process of its own, the built-in generator Python in this one, both on the
    cores the server uses, and each window is short."""
    assert PERF_ANALYZER is not None
    grpc_url = f"127.0.0.1:{server.grpc_port}"
    with grpcclient.InferenceServerClient(grpc_url) as client:
        cfg = client.get_model_config(MODEL, as_json=True)["config"]
    loads = (BuiltinLoad(grpc_url, MODEL, cfg), PerfAnalyzerLoad(PERF_ANALYZER, grpc_url, MODEL))
    runs: dict[str, list[Sample]] = {"built-in": [], "perf_analyzer": []}
    for _ in range(2):
        for load in loads:
            runs[load.name].append(load.run(2, 0.4))
    built_in = max(runs["built-in"], key=lambda s: s.throughput)
    pa = max(runs["perf_analyzer"], key=lambda s: s.throughput)
    assert 1 / 3 <= pa.throughput / built_in.throughput <= 3, runs
