"""``shoal analyze --gpu`` on a GPU host: the model's own config, KIND_GPU on GPU 0, is the
first point; it is measured on the GPU (a Python model, which any GPU host serves), the
search names the GPUs it covers, and the recommendation is a config shoal accepts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.configs.model_config import fill_defaults, parse_config_text
from shoal.configs.validation import validate
from tests.measured.test_analyze import MODEL, NAP
from tests.serverctl import processes_with

pytestmark = pytest.mark.gpu

CONFIG = f"""name: "{MODEL}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_GPU gpus: [ 0 ] }} ]
"""


@pytest.mark.timeout(240)  # (its search's budget is 90 s: over the suite's 120 s a test)
def test_a_kind_gpu_config_is_measured_on_the_gpu_and_searched_from(tmp_path: Path) -> None:
    repo, out = tmp_path / "repo", tmp_path / "report"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.py").write_text(NAP)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    run = subprocess.run(
        [sys.executable, "-m", "shoal", "analyze", f"--model-repository={repo}",
         f"--model={MODEL}", "--concurrency=1,4", "--budget-secs=90", "--max-points=4",
         "--window-secs=0.3", "--load=builtin", f"--output={out}", "--gpu=0"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert not processes_with(str(repo)), "the analyzer left its server's processes behind"
    assert "KIND_GPU instances searched too, on GPU(s) [0]" in run.stderr
    points = json.loads((out / "results.json").read_text())
    first = points[0]
    assert first["point"]["kind"] == "KIND_GPU" and "/GPU" in first["label"], first
    assert first["samples"] and not first["error"], first
    text = (out / "config.pbtxt").read_text()
    validate(fill_defaults(parse_config_text(text, MODEL), MODEL), MODEL)
