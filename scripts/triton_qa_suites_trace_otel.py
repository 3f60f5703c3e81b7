"""L0_trace's opentelemetry sections (scripts/triton_qa_suites_trace.py runs them
after the trace-file ones): opentelemetry_unittest.py, rate 0 and trace counts with
client contexts, the batch span processor's settings, the context a Python model sees,
and the stress loops.

test.sh downloads the OpenTelemetry Collector; this runner writes a stand-in at run time
(``OTELCOL``) that the tests and these sections start as ``./otelcol``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from triton_qa import PYTHON, QA
from triton_qa_suites_trace import SUITE, _Curl, _send_bls

# The OpenTelemetry Collector as test.sh configures it (trace-config.yaml): an OTLP/HTTP
# receiver on :10000, the batch processor (a batch goes out at 10 spans, or when its
# timer fires: every 10 s from the start or from the last full batch),
# and the file exporter, which starts collected_traces.json afresh and writes each batch
# to it as one line of OTLP JSON (ids in hex, as the Collector writes them).
OTELCOL = """
import base64
import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

BATCH_SPANS, BATCH_S, PATH = 10, 10.0, "./collected_traces.json"
lock = threading.Lock()
batch, spans, first = [], 0, time.monotonic()


def hexed(node):
    if isinstance(node, dict):
        return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId")
                    else hexed(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [hexed(x) for x in node]
    return node


def flush():
    global batch, spans, first
    if batch:
        with open(PATH, "a") as f:
            f.write(json.dumps({"resourceSpans": batch}, separators=(",", ":")) + "\\n")
    batch, spans, first = [], 0, time.monotonic()


def timer():
    # as the Collector's batch processor: a timer that fires every BATCH_S (restarted
    # when a full batch goes out), sending what it holds
    while True:
        time.sleep(0.1)
        with lock:
            if time.monotonic() - first >= BATCH_S:
                flush()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        global spans
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = otlp.ExportTraceServiceRequest.FromString(body)
        doc = hexed(json_format.MessageToDict(request))
        for rs in doc.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    span.setdefault("parentSpanId", "")  # (the Collector writes it empty)
        with lock:
            batch.extend(doc.get("resourceSpans", []))
            spans += sum(len(ss.get("spans", [])) for rs in doc.get("resourceSpans", [])
                         for ss in rs.get("scopeSpans", []))
            if spans >= BATCH_SPANS:
                flush()
        answer = otlp.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


open(PATH, "w").close()  # (the exporter starts its file afresh, as the Collector's)
threading.Thread(target=timer, daemon=True).start()
ThreadingHTTPServer(("0.0.0.0", 10000), Handler).serve_forever()
"""


_OTEL_TESTS = (
    "test_http_trace_simple_model", "test_http_trace_simple_model_context_propagation",
    "test_grpc_trace_simple_model", "test_grpc_trace_all_input_required_model_cancel",
    "test_grpc_trace_model_cancel_in_queue", "test_non_decoupled",
    "test_grpc_trace_simple_model_context_propagation", "test_streaming_grpc_trace_simple_model",
    "test_streaming_grpc_trace_simple_model_context_propagation", "test_http_trace_bls_model",
    "test_http_trace_bls_model_context_propagation", "test_http_trace_ensemble_model",
    "test_http_trace_ensemble_model_context_propagation", "test_http_trace_triggered",
    "test_trace_context_exposed_to_pbe",
)  # fmt: skip


def _opentelemetry(qa: QA, here: Path, models: Path) -> None:
    """opentelemetry_unittest.py against the Collector stand-in (OTELCOL), which each test
    starts as ``./otelcol --config ./trace-config.yaml``; test.sh's flags, less
    ``--allow-sagemaker`` (shoal serves no SageMaker endpoint)."""
    (here / "collected_traces.json").touch()
    (models / "trace_context" / "1").mkdir(parents=True, exist_ok=True)
    (models / "trace_context" / "1" / "model.py").write_text(
        (here / "trace_context.py").read_text()
    )  # fmt: skip
    loads = ("simple", "ensemble_add_sub_int32_int32_int32", "repeat_int32",
             "custom_identity_int32", "input_all_required", "dynamic_batch", "bls_simple",
             "trace_context")  # fmt: skip
    args = ("--model-control-mode=explicit", *(f"--load-model={m}" for m in loads),
            "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
            "--trace-config=count=-1", "--trace-config=mode=opentelemetry",
            "--trace-config=opentelemetry,resource=test.key=test.value",
            "--trace-config=opentelemetry,resource=service.name=test_triton",
            "--trace-config=opentelemetry,url=localhost:10000/v1/traces",
            f"--model-repository={models}")  # fmt: skip
    with qa.serve(here, *args, log="otel_otelcol_exporter") as ready:
        for name in _OTEL_TESTS:
            if ready:
                qa.test(SUITE, here, "opentelemetry_unittest.py", f"OpenTelemetryTest.{name}",
                        note="")  # fmt: skip
            else:
                qa.not_ready(SUITE, 1, name)
    qa.not_run(SUITE, 2, "test_sagemaker_*", "shoal serves no SageMaker endpoint")
    qa.not_run(SUITE, 2, "test_custom_backend_tracing*",
               "the C++ identity backend's custom activities")  # fmt: skip


@contextlib.contextmanager
def _collector(here: Path) -> Iterator[Path]:
    """test.sh's ``$OTEL_COLLECTOR --config ./trace-config.yaml &`` (the stand-in), killed
    at the end; its collected_traces.json."""
    proc = subprocess.Popen(["./otelcol", "--config", "./trace-config.yaml"], cwd=here,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(1)  # (it listens)
        yield here / "collected_traces.json"
    finally:
        proc.kill()
        proc.wait()


def _otel_args(models: Path, rate: str, *more: str) -> tuple[str, ...]:
    return ("--trace-config=level=TIMESTAMPS", f"--trace-config=rate={rate}", *more,
            "--trace-config=mode=opentelemetry",
            "--trace-config=opentelemetry,url=localhost:10000/v1/traces",
            f"--model-repository={models}")  # fmt: skip


def _otel_settings(c: _Curl, rate: str, count: str) -> None:
    c.call("bls_simple")
    c.ok()
    c.has('"trace_level":["TIMESTAMPS"]', f'"trace_rate":"{rate}"', f'"trace_count":"{count}"',
          '"trace_mode":"opentelemetry"', '"url":"localhost:10000/v1/traces"',
          '"bsp_max_export_batch_size":"512"', '"bsp_schedule_delay":"5000"',
          '"bsp_max_queue_size":"2048"')  # fmt: skip
    c.check('"trace_file":' not in c.body and '"log_frequency":' not in c.body)


def _lines(path: Path, text: str) -> int:
    """grep -c: the lines holding ``text``."""
    return sum(text in line for line in path.read_text().splitlines()) if path.exists() else 0


def _otel_rate_zero(qa: QA, here: Path, models: Path) -> None:
    c = _Curl(qa, here, "opentelemetry at rate=0: only requests with a context are traced")
    with (
        _collector(here) as collected,
        qa.serve(here, *_otel_args(models, "0", "--trace-config=count=-1"), log="otel_WAR") as up,
    ):
        if up:
            _otel_settings(c, "0", "-1")
            for _ in range(10):
                _send_bls(qa, here)
            c.check(not collected.exists() or collected.stat().st_size == 0, "traced")
            _send_bls(qa, here, context=True)
            time.sleep(20)
            c.check(collected.exists() and collected.stat().st_size > 0, "nothing collected")
    c.done()


def _otel_count(qa: QA, here: Path, models: Path) -> None:
    c = _Curl(qa, here, "opentelemetry rate=5 count=1: then only requests with a context")
    with qa.serve(here, *_otel_args(models, "5", "--trace-config=count=1"),
                  log="otel_count") as up, _collector(here) as collected:  # fmt: skip
        if up:
            _otel_settings(c, "5", "1")
            for _ in range(20):
                _send_bls(qa, here)
            time.sleep(20)
            roots = _lines(collected, '"parentSpanId":""')
            c.check(_lines(collected, '"name":"InferRequest"') == 1 and roots == 1, "1 trace")
            for _ in range(10):
                _send_bls(qa, here, context=True)
                _send_bls(qa, here)
                time.sleep(10)
            time.sleep(5)
            kept = _lines(collected, '"parentSpanId":"b7ad6b7169242424"')
            roots = _lines(collected, '"parentSpanId":""')
            c.check(roots == 1 and kept == 10, f"{roots} roots, {kept} in the client's trace")
    c.done()


def _otel_bsp(qa: QA, here: Path, models: Path) -> None:
    """The batch span processor's settings reach it: a queue of 1 drops spans (and says
    so in the log), no delay exports in several batches, batches of 1 span one by one."""
    c = _Curl(qa, here, "opentelemetry bsp_max_queue_size, bsp_schedule_delay, "
              "bsp_max_export_batch_size")  # fmt: skip
    cases = (("bsp_max_queue_size=1", 20), ("bsp_schedule_delay=0", 10),
             ("bsp_max_export_batch_size=1", 10))  # fmt: skip
    for setting, wait in cases:
        args = _otel_args(models, "1", "--trace-config=count=-1",
                          f"--trace-config=opentelemetry,{setting}", "--log-verbose=1")  # fmt: skip
        log = "otel_" + setting.split("=")[0]
        with qa.server(here, *args, log=log) as srv, _collector(here) as collected:
            if not srv.up:
                c.check(False, f"{setting}: server not ready")
                continue
            _send_bls(qa, here)
            time.sleep(wait)
            text = collected.read_text() if collected.exists() else ""
            if setting.startswith("bsp_max_queue_size"):
                warned = "BatchSpanProcessor queue is full - dropping span." in srv.log.read_text()
                c.check(warned, "no warning of spans dropped")
            elif setting.startswith("bsp_schedule_delay"):
                c.check(text.count("scopeSpans") > 1, f"{text.count('scopeSpans')} batches")
            else:
                c.check(text.count("scopeSpans") == 6, f"{text.count('scopeSpans')} batches")
    c.done()


def _pbe_context_none(qa: QA, here: Path, models: Path) -> None:
    c = _Curl(qa, here, "a Python model sees no trace context: triton mode; opentelemetry off")
    body = json.dumps({"inputs": [{"name": "expect_none", "datatype": "BOOL", "shape": [1],
                                   "data": [True]}]}).encode()  # fmt: skip
    for level, mode in (("TIMESTAMPS", "triton"), ("OFF", "opentelemetry")):
        args = (f"--trace-config=level={level}", "--trace-config=rate=1",
                "--trace-config=count=-1", f"--trace-config=mode={mode}",
                f"--model-repository={models}", "--log-verbose=1")  # fmt: skip
        with qa.serve(here, *args, log=f"trace_context_{mode}") as up:
            code = 0
            if up:
                req = urllib.request.Request(
                    "http://localhost:8000/v2/models/trace_context/infer", data=body
                )
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        code = r.status
                except urllib.error.HTTPError as e:
                    code = e.code
            c.check(code == 200, f"{mode}: {code}")
    c.done()


def _stress(qa: QA, here: Path, models: Path) -> None:
    """test.sh's stress loops: trace_stress_grpc_client.py over and over for
    ``TRACE_STRESS_S`` seconds (test.sh's 120), each mode; the server must live on."""
    c = _Curl(qa, here, "120 s of stress_grpc_client.py, triton and opentelemetry modes")
    seconds = float(os.environ.get("TRACE_STRESS_S", "120"))
    base = ("--model-control-mode=explicit", f"--model-repository={models}",
            "--load-model=identity_fp32", "--trace-config=rate=1",
            "--trace-config=level=TIMESTAMPS")  # fmt: skip
    modes = (("--trace-config=mode=triton", "--trace-config=triton,file=./trace"),
             ("--trace-config=mode=opentelemetry",
              "--trace-config=opentelemetry,resource=test.key=test.value",
              "--trace-config=opentelemetry,resource=service.name=test_triton",
              "--trace-config=opentelemetry,url=localhost:10000/v1/traces"))  # fmt: skip
    for i, mode in enumerate(modes):
        with _collector(here), qa.server(here, *base, *mode, log=f"stress{i}") as srv:
            if srv.up:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    subprocess.run([str(PYTHON), "trace_stress_grpc_client.py"], cwd=here,
                                   env=qa.env, capture_output=True, timeout=120)  # fmt: skip
                    time.sleep(0.1)
            c.check(srv.up and srv.proc.poll() is None, f"mode {i}: the server died")
    c.done()


def write_collector(here: Path) -> None:
    """The Collector's stand-in, as ``./otelcol`` in the suite's folder."""
    collector = here / "otelcol"
    collector.write_text(f"#!{PYTHON}\n{OTELCOL}")
    collector.chmod(0o755)


RUNS: dict[str, Callable[[QA, Path, Path], None]] = {
    "opentelemetry": _opentelemetry, "otel_rate_zero": _otel_rate_zero,
    "otel_count": _otel_count, "otel_bsp": _otel_bsp, "pbe_context_none": _pbe_context_none,
    "stress": _stress,
}  # fmt: skip
