"""L0_trace: the trace extension and the Triton-mode trace file.

Its test.sh serves a repository of ``simple`` (onnx_int32_int32_int32), an ensemble of it,
Python models (``bls_simple``, ``input_all_required``, ``identity_fp32``), L0_decoupled's
``repeat_int32`` and two models of Triton's C++ ``identity`` backend that sleep
``execute_delay_ms`` per execution (``dynamic_batch``, ``custom_identity_int32``), which
shoal's built-in ``identity`` backend serves from test.sh's configs. L0_decoupled's C++
repeat backend is in no source tree: the runner writes its Python stand-in. test.sh
drives its servers with curl and with Triton's C++ ``simple_http_infer_client`` and
``simple_grpc_infer_client`` (one inference of ``simple`` each); the runner sends the same
requests with tritonclient, then reads the trace files with the suite's own
``qa/common/trace_summary.py``, counting test.sh's greps one check each.

test.sh downloads the OpenTelemetry Collector; the runner writes a stand-in at run time
(``OTELCOL``: an OTLP/HTTP receiver, the batch processor and the file exporter as
trace-config.yaml sets them) that opentelemetry_unittest.py and the opentelemetry
sections start as ``./otelcol``. ``TRACE_RUNS`` names sections to run (default: all, in
test.sh's order; ``TRACE_STRESS_S`` shortens the 120-second stress loops). Left out, with
their reasons printed: the C++ identity backend's custom tracing API and SageMaker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from triton_qa import PYTHON, QA, suite
from triton_qa_suites_decoupled import REPEAT, REPEAT_CONFIG

SUITE = "L0_trace"

# test.sh's two models of Triton's identity backend (shoal's is built in: backend
# "identity", execute_delay_ms as Triton's; enable_custom_tracing asks for the C++ backend's
# custom activities, which shoal's has not: their tests are left out)
DYNAMIC_BATCH = """backend: "identity"
max_batch_size: 1
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
instance_group [{ count: 1 kind: KIND_CPU }]
dynamic_batching {
  preferred_batch_size: [ 1 ]
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 1000000
                         max_queue_size: 8 }
}
parameters [{ key: "execute_delay_ms" value: { string_value: "8000" } }]
"""
CUSTOM_IDENTITY = """name: "custom_identity_int32"
backend: "identity"
max_batch_size: 1024
input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }]
instance_group [{ kind: KIND_CPU }]
parameters [{ key: "execute_delay_ms" value: { string_value: "500" } },
            { key: "enable_custom_tracing" value: { string_value: "true" } }]
"""

# test.sh's send_inference_requests: the C++ simple clients, one inference each.
CLIENTS = """
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

a = np.arange(16, dtype=np.int32).reshape(1, 16)
b = np.ones((1, 16), np.int32)
for module, url in ((httpclient, "localhost:8000"), (grpcclient, "localhost:8001")):
    client = module.InferenceServerClient(url)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),
              module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("simple", inputs)
    if not (result.as_numpy("OUTPUT0") == a + b).all():
        sys.exit("wrong OUTPUT0")
    if not (result.as_numpy("OUTPUT1") == a - b).all():
        sys.exit("wrong OUTPUT1")
"""


def _write(models: Path, name: str, source: str, config: str) -> None:
    (models / name / "1").mkdir(parents=True, exist_ok=True)
    (models / name / "1" / "model.py").write_text(source)
    (models / name / "config.pbtxt").write_text(config)


def _models(qa: QA, here: Path) -> Path:
    """test.sh's MODELSDIR, with the stand-ins in the C++ backends' place."""
    models = qa.fresh(here / "trace_models")
    base = qa.generated("qa_model_repository") / "onnx_int32_int32_int32"
    for name in ("simple", "global_simple"):
        model = qa.copy(base, models / name)
        for version in ("2", "3"):
            subprocess.run(["rm", "-r", str(model / version)], check=True)
        QA.sed(model / "config.pbtxt", r"^name:.*", f'name: "{name}"')
    ensembles = qa.generated("qa_ensemble_model_repository/qa_model_repository")
    ens = qa.copy(ensembles / "simple_onnx_int32_int32_int32",
                  models / "ensemble_add_sub_int32_int32_int32")  # fmt: skip
    for version in ("2", "3"):
        subprocess.run(["rm", "-r", str(ens / version)], check=True)
    QA.sed(ens / "config.pbtxt", r"^name:.*", 'name: "ensemble_add_sub_int32_int32_int32"')
    QA.sed(ens / "config.pbtxt", r"model_name:.*", 'model_name: "simple"')
    qa.copy(here / "models" / "input_all_required", models / "input_all_required")
    (models / "bls_simple" / "1").mkdir(parents=True)
    bls = qa.qa / "python_models" / "bls_simple" / "bls_simple.py"
    (models / "bls_simple" / "1" / "model.py").write_text(bls.read_text())
    repeat = REPEAT_CONFIG.replace("decoupled: True", "decoupled: False")
    _write(models, "repeat_int32", REPEAT, repeat)
    for name, config in (
        ("dynamic_batch", DYNAMIC_BATCH),
        ("custom_identity_int32", CUSTOM_IDENTITY),
    ):
        (models / name / "1").mkdir(parents=True)  # (no model file: the backend is built in)
        (models / name / "config.pbtxt").write_text(config)
    identity = qa.qa / "python_models" / "identity_fp32"
    (models / "identity_fp32" / "1").mkdir(parents=True)
    (models / "identity_fp32" / "1" / "model.py").write_text((identity / "model.py").read_text())
    (models / "identity_fp32" / "config.pbtxt").write_text(
        (identity / "config.pbtxt").read_text()
    )  # fmt: skip
    return models


class _Curl:
    """test.sh's curl calls and their greps; each check counts one."""

    def __init__(self, qa: QA, here: Path, what: str) -> None:
        self.qa, self.here, self.what = qa, here, what
        self.code, self.body = 0, ""
        self.passed = self.total = 0
        self.failed: list[str] = []  # each failed check, and what it looked at

    def call(self, model: str = "", body: dict[str, Any] | None = None) -> None:
        path = f"/v2/models/{model}/trace/setting" if model else "/v2/trace/setting"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://localhost:8000{path}", data=data)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                self.code, self.body = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            self.code, self.body = e.code, e.read().decode()

    def control(self, action: str, model: str) -> None:
        """POST /v2/repository/models/<model>/<action> (load, unload)."""
        req = urllib.request.Request(
            f"http://localhost:8000/v2/repository/models/{model}/{action}", data=b""
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                self.code, self.body = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            self.code, self.body = e.code, e.read().decode()

    def check(self, ok: bool, what: str = "") -> None:
        self.total += 1
        self.passed += ok
        if not ok:
            self.failed.append(f"#{self.total} {what or self.body[:200]}")

    def ok(self, expected: bool = True) -> None:
        self.check((self.code == 200) == expected)

    def has(self, *settings: str) -> None:
        """test.sh's ``grep -c '"<key>":<value>' ./curl.out`` == 1, each."""
        compact = self.body
        for s in settings:
            self.check(compact.count(s) == 1, f"{s} in {compact[:300]}")

    def send(self, times: int) -> None:
        """send_inference_requests: the HTTP then the gRPC client, ``times`` times."""
        good = True
        for _ in range(times):
            run = subprocess.run([str(PYTHON), "-c", CLIENTS], cwd=self.here,
                                 env=self.qa.env, capture_output=True, timeout=120)  # fmt: skip
            good = good and run.returncode == 0
        self.check(good)

    def summary(self, file: str, counts: dict[str, int]) -> None:
        """trace_summary.py -t <file>, then test.sh's ``grep -c <pattern>`` == n."""
        path = self.here / file
        if not path.exists():
            for _ in counts:
                self.check(False, f"no {file}")
            return
        run = subprocess.run(
            [str(PYTHON), "../common/trace_summary.py", "-t", file],
            cwd=self.here, env=self.qa.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        lines = run.stdout.splitlines()
        for pattern, n in counts.items():
            got = sum(1 for x in lines if re.search(pattern, x))
            self.check(got == n, f"{file}: {got} lines match {pattern}, not {n}")

    def done(self) -> None:
        self.qa.count(SUITE, self.passed, self.total, self.what)
        if self.failed and self.qa.verbose:
            print("    failed: " + "\n    failed: ".join(self.failed), flush=True)


def _settings(level: str, rate: str, count: str, freq: str, file: str) -> tuple[str, ...]:
    return (
        f'"trace_level":["{level}"]',
        f'"trace_rate":"{rate}"',
        f'"trace_count":"{count}"',
        f'"log_frequency":"{freq}"',
        f'"trace_file":"{file}"',
        '"trace_mode":"triton"',
    )


def _args(models: Path, file: str, level: str, rate: str, *more: str) -> Sequence[str]:
    return (f"--trace-config=triton,file={file}", f"--trace-config=level={level}",
            f"--trace-config=rate={rate}", *more, f"--model-repository={models}")  # fmt: skip


def _off_to_min(qa: QA, here: Path, models: Path) -> None:
    c = _Curl(qa, here, "level OFF, then TIMESTAMPS through the API (trace_off_to_min.log)")
    with qa.serve(here, *_args(models, "trace_off_to_min.log", "OFF", "1"), log="off") as up:
        if up:
            c.call("", {"trace_level": ["TIMESTAMPS"]})
            c.ok()
            c.has(*(s for s in _settings("TIMESTAMPS", "1", "", "0", "trace_off_to_min.log")
                    if "trace_count" not in s))  # fmt: skip
            c.send(10)
    c.summary("trace_off_to_min.log", {"COMPUTE_INPUT_END": 20, "^simple": 20})
    c.done()


def _model_setting(qa: QA, here: Path, models: Path) -> None:
    c = _Curl(qa, here, "a model's own log_frequency (global_trace.log.0/.1)")
    with qa.serve(here, *_args(models, "global_trace.log", "TIMESTAMPS", "6"), log="model") as up:
        if up:
            c.call("simple", {"trace_file": "global_trace.log"})
            c.ok(False)
            c.has('"error":"trace file location can not be updated through network protocol"')
            c.call("simple", {"log_frequency": "2"})
            c.ok()
            c.has(*_settings("TIMESTAMPS", "6", "-1", "2", "global_trace.log"))
            c.send(10)
    c.check(not (here / "simple_trace.log").exists())
    c.summary("global_trace.log.0", {"COMPUTE_INPUT_END": 2, "^simple": 2})
    c.summary("global_trace.log.1", {"COMPUTE_INPUT_END": 1, "^simple": 1})
    c.done()


def _update_and_clear(qa: QA, here: Path, models: Path) -> None:
    c = _Curl(qa, here, "a model's setting updated, then cleared (global_trace.log)")
    (here / "global_trace.log").unlink(missing_ok=True)
    with qa.serve(here, *_args(models, "global_trace.log", "TIMESTAMPS", "6"), log="clear") as up:
        if up:
            c.call("simple", {"trace_rate": "1"})
            c.ok()
            c.call("simple", {"trace_level": ["OFF"]})
            c.ok()
            c.has(*_settings("OFF", "1", "-1", "0", "global_trace.log"))
            c.send(10)
            c.call("simple", {"trace_level": None})
            c.ok()
            c.has(*_settings("TIMESTAMPS", "1", "-1", "0", "global_trace.log"))
            c.send(5)
    c.check(not (here / "update_trace.log").exists())
    c.summary("global_trace.log", {"COMPUTE_INPUT_END": 10, "^simple": 10})
    c.done()


def _count(qa: QA, here: Path, models: Path) -> None:
    c = _Curl(qa, here, "trace_count (global_count.log and .0)")
    with qa.serve(here, *_args(models, "global_count.log", "TIMESTAMPS", "1"), log="count") as up:
        if up:
            c.send(10)
            c.call("simple")
            c.ok()
            c.has(*_settings("TIMESTAMPS", "1", "-1", "0", "global_count.log"))
            c.call("", {"trace_count": "5"})
            c.ok()
            c.has(*_settings("TIMESTAMPS", "1", "5", "0", "global_count.log"))
            c.send(10)
            c.call("simple")
            c.ok()
            c.has(*_settings("TIMESTAMPS", "1", "0", "0", "global_count.log"))
            c.check((here / "global_count.log.0").exists())
            for setting in ("trace_count", "trace_rate", "log_frequency"):
                c.call("simple", {setting: "10000000000"})
                c.ok(False)
    c.summary("global_count.log", {"COMPUTE_INPUT_END": 20, "^simple": 20})
    c.summary("global_count.log.0", {"COMPUTE_INPUT_END": 5, "^simple": 5})
    c.done()


CONTEXT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"  # test.sh's


def _send_bls(qa: QA, here: Path, context: bool = False) -> None:
    """test.sh's ``python -c 'import opentelemetry_unittest; ...send_bls_request(...)'``."""
    headers = f", headers={{'traceparent': '{CONTEXT}'}}" if context else ""
    send = ("import opentelemetry_unittest; opentelemetry_unittest.send_bls_request("
            f'model_name="ensemble_add_sub_int32_int32_int32"{headers})')  # fmt: skip
    subprocess.run([str(PYTHON), "-c", send], cwd=here, env=qa.env,
                   capture_output=True, timeout=120)  # fmt: skip


def _bls(qa: QA, here: Path, models: Path) -> None:
    c = _Curl(qa, here, "--trace-config rate=4 count=6; BLS calls of an ensemble (bls_trace.log)")
    args = _args(models, "bls_trace.log", "TIMESTAMPS", "4", "--trace-config=count=6",
                 "--trace-config=mode=triton")  # fmt: skip
    with qa.serve(here, *args, log="bls") as up:
        if up:
            c.call("simple")
            c.ok()
            c.has(*_settings("TIMESTAMPS", "4", "6", "0", "bls_trace.log"))
            for _ in range(4):
                _send_bls(qa, here)
    ens = "^ensemble_add_sub_int32_int32_int32"
    c.summary("bls_trace.log", {"COMPUTE_INPUT_END": 2, ens: 1, "^simple": 1})
    text = (here / "bls_trace.log").read_text() if (here / "bls_trace.log").exists() else ""
    c.check(text.count("parent_id") == 2)
    c.done()


def _unknown_models(qa: QA, here: Path, models: Path) -> None:
    c = _Curl(qa, here, "trace settings of a model not loaded, loaded, unloaded, reloaded")
    args = ("--model-control-mode=explicit", f"--model-repository={models}")
    with qa.serve(here, *args, log="nonexistent_model") as up:
        if up:
            c.control("load", "simple")
            c.ok()
            for model, ok in (("does-not-exist", False), ("simple", True)):
                c.call(model)
                c.ok(ok)
                c.call(model, {"log_frequency": "1"})
                c.ok(ok)
            for action, ok in (("unload", False), ("load", True)):
                c.control(action, "simple")
                c.ok()
                c.call("simple")
                c.ok(ok)
                c.call("simple", {"log_frequency": "1"})
                c.ok(ok)
    c.done()


def _unittest(qa: QA, here: Path, models: Path) -> None:
    args = _args(models, "global_unittest.log", "TIMESTAMPS", "1")
    with qa.serve(here, *args, log="unittest") as ready:
        if ready:
            qa.test(SUITE, here, "trace_endpoint_test.py")
        else:
            qa.not_ready(SUITE, 6, "trace_endpoint_test.py")


def _custom(qa: QA, here: Path, models: Path) -> None:
    qa.not_run(SUITE, 4, "custom backend tracing (custom_tracing_triton.log)",
               "the C++ identity backend's custom activities (TRITONSERVER_InferenceTrace"
               "ReportActivity), not reported by shoal's identity backend")  # fmt: skip


_RUNS = {
    "off_to_min": _off_to_min, "model_setting": _model_setting,
    "update_and_clear": _update_and_clear, "count": _count, "unittest": _unittest,
    "bls": _bls, "unknown_models": _unknown_models, "custom": _custom,
}  # fmt: skip


@suite
def l0_trace(qa: QA) -> None:
    """test.sh's sections in its order (its opentelemetry ones, after the trace-file
    ones, in triton_qa_suites_trace_otel.py); ``TRACE_RUNS`` (the runner's own, not
    test.sh's; default all) names some of them (the keys of both RUNS)."""
    import triton_qa_suites_trace_otel as otel  # (it uses this module's helpers)

    here = qa.suite(SUITE)
    models = _models(qa, here)
    otel.write_collector(here)
    runs = {**_RUNS, **otel.RUNS}
    for run in os.environ.get("TRACE_RUNS", " ".join(runs)).split():
        runs[run](qa, here, models)
