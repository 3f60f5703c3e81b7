"""Large BYTES tensors through every process (frontend, broker, a Python model's worker)
and back unchanged, over gRPC's typed ``bytes_contents``, gRPC raw contents and HTTP's
binary extension.

Triton's L0_grpc GrpcTest sends 10 Mi one-byte elements (50 MiB serialized) to a Python
string-identity model; shoal used to spend its time taking each element apart in Python
and the frontend gave up on its broker. The tensors here are smaller (2 Mi elements),
so the test stays short, but far beyond what a per-element walk would answer in time.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.serverctl import ShoalServer, served

#: Triton's qa/python_models/string_identity, as its L0_grpc test.sh serves it (dims -1).
STRING_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", in_0.as_numpy())
            responses.append(pb_utils.InferenceResponse([out_tensor_0]))
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
COUNT = 2 * 1024 * 1024
LIMITS = [("grpc.max_send_message_length", 1 << 28), ("grpc.max_receive_message_length", 1 << 28)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo: Path = tmp_path_factory.mktemp("bytes-repo")
    (repo / "string_identity" / "1").mkdir(parents=True)
    (repo / "string_identity" / "1" / "model.py").write_text(textwrap.dedent(STRING_IDENTITY))
    (repo / "string_identity" / "config.pbtxt").write_text(CONFIG)
    with served(repo) as srv:
        yield srv


def _mixed(count: int) -> np.ndarray:
    """Runs of equal lengths broken by others, with NULs inside and at the ends."""
    pattern = [b"A", b"", b"\x00", b"ab\x00", b"xyz" * 7, b"\x00\x01\x02\x03"]
    items = np.empty(count, dtype=object)
    items[:] = [pattern[(i // 1000 + i % 3) % len(pattern)] for i in range(count)]
    return items


def test_many_bytes_contents_elements_come_back_unchanged(server: ShoalServer) -> None:
    """The L0_grpc GrpcTest request, at a fifth of its size."""
    request = service_pb2.ModelInferRequest(model_name="string_identity")
    tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[COUNT])
    tensor.contents.bytes_contents.extend([b"A"] * COUNT)
    request.outputs.add(name="OUTPUT0")
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=LIMITS)
    with channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert list(reply.outputs[0].shape) == [COUNT]
    assert reply.raw_output_contents[0] == b"\x01\x00\x00\x00A" * COUNT
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert client.is_server_live() and client.is_model_ready("string_identity")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_mixed_elements_come_back_unchanged(server: ShoalServer, protocol: str) -> None:
    data = _mixed(COUNT // 2)  # (tritonclient packs and unpacks these one by one)
    url, mod = server.client(protocol)
    client = (
        grpcclient.InferenceServerClient(url, channel_args=LIMITS)
        if protocol == "grpc"
        else httpclient.InferenceServerClient(url, network_timeout=60)
    )
    tensor = mod.InferInput("INPUT0", [data.size], "BYTES")
    tensor.set_data_from_numpy(data)
    result = client.infer(
        "string_identity", [tensor], outputs=[mod.InferRequestedOutput("OUTPUT0")]
    )
    got = result.as_numpy("OUTPUT0")
    assert got.shape == data.shape
    assert got.tolist() == data.tolist()
