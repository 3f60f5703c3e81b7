"""50 MiB of BYTES through shoal and back, against a memcpy of the same bytes.

Triton's L0_grpc GrpcTest sends 10 Mi one-byte elements (50 MiB serialized, 4-byte length
prefixes included) to a Python string-identity model through gRPC ``bytes_contents``.
This times that request, the same tensor through gRPC ``raw_input_contents`` and through
HTTP's binary extension, and the same 50 MiB as 50 Ki elements of 1 KiB each, each round
trip against one memcpy of the serialized bytes (a warm destination) in the same run.
The client sends pre-serialized bodies (tritonclient's own BYTES codec walks elements in
Python; it would be the one being measured). A record, not a test.

    python bench/run_bytes.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from servers import shoal_server
from tritonclient.grpc import service_pb2, service_pb2_grpc

from shoal.ipc import bytes_tensors

MODEL = "string_identity"
MODEL_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
"""
CONFIG = """
name: "string_identity"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""
LIMITS = [("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)]


def _repo(tmp: Path) -> Path:
    (tmp / MODEL / "1").mkdir(parents=True)
    (tmp / MODEL / "1" / "model.py").write_text(MODEL_PY)
    (tmp / MODEL / "config.pbtxt").write_text(CONFIG)
    return tmp


def _timed(fn: Callable[[], bytes], want: bytes, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t0)
        if got != want:
            raise AssertionError("the tensor did not come back unchanged")
    return statistics.median(times)


def _memcpy(wire: bytes, repeat: int) -> float:
    src = np.frombuffer(wire, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # warm the destination's pages
    times = []
    for _ in range(max(repeat, 5)):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return min(times)


def _grpc_typed(stub: object, items: list[bytes]) -> Callable[[], bytes]:
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    t = req.inputs.add(name="INPUT0", datatype="BYTES", shape=[len(items)])
    t.contents.bytes_contents.extend(items)
    req.outputs.add(name="OUTPUT0")
    return lambda: stub.ModelInfer(req, timeout=600).raw_output_contents[0]  # type: ignore[attr-defined]


def _grpc_raw(stub: object, count: int, wire: bytes) -> Callable[[], bytes]:
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    req.inputs.add(name="INPUT0", datatype="BYTES", shape=[count])
    req.raw_input_contents.append(wire)
    req.outputs.add(name="OUTPUT0")
    return lambda: stub.ModelInfer(req, timeout=600).raw_output_contents[0]  # type: ignore[attr-defined]


def _http(url: str, count: int, wire: bytes) -> Callable[[], bytes]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [count],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(wire)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = head + wire
    headers = {"Inference-Header-Content-Length": str(len(head))}

    def call() -> bytes:
        conn = http.client.HTTPConnection(url, timeout=600)
        try:
            conn.request("POST", f"/v2/models/{MODEL}/infer", body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        json_len = int(resp.getheader("Inference-Header-Content-Length") or 0)
        return raw[json_len:]

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    shapes = {"10 Mi x 1 B": [b"A"] * (10 << 20), "50 Ki x 1 KiB": [b"x" * 1020] * (50 << 10)}
    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-bytes-"))
    server = shoal_server(_repo(tmp / "repo"), tmp / "server.log").start(120)
    rows = []
    try:
        channel = grpc.insecure_channel(server.url("grpc"), options=LIMITS)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for label, items in shapes.items():
            wire = bytes_tensors.pack(items).tobytes()
            base = _memcpy(wire, args.repeat)
            for path, call in (
                ("gRPC bytes_contents", _grpc_typed(stub, items)),
                ("gRPC raw_input_contents", _grpc_raw(stub, len(items), wire)),
                ("HTTP binary", _http(server.url("http"), len(items), wire)),
            ):
                took = _timed(call, wire, args.repeat)
                rows.append((label, path, len(wire) / (1 << 20), took, base))
                print(f"{label:14} {path:24} {took * 1000:9.1f} ms", flush=True)
        channel.close()
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n| elements | path | MiB | round trip | memcpy | ratio |\n|---|---|---|---|---|---|")
    for label, path, mib, took, base in rows:
        print(
            f"| {label} | {path} | {mib:.1f} | {took * 1000:.0f} ms | {base * 1000:.1f} ms "
            f"| {took / base:.0f}x |"
        )


if __name__ == "__main__":
    main()
