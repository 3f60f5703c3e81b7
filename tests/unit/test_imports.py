"""The frontend and the broker never import a model framework (only workers do)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = (
    "onnxruntime", "torch", "tensorrt", "cupy", "xgboost", "lightgbm", "treelite", "openvino",
    "tensorflow",
)  # fmt: skip


@pytest.mark.parametrize(
    "module",
    ["shoal.frontend.proc", "shoal.frontend.http_server", "shoal.broker.proc", "shoal.launcher"],
)
def test_role_imports_no_framework(module: str) -> None:
    code = f"import sys, {module}\nprint([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
