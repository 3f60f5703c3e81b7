"""Which requests the data plane mirrors to a model's shadow version (shadow.py), and
what the copy is: the infer it is handed records the copies instead of sending them."""

from __future__ import annotations

import asyncio

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from shoal.dataplane.model_handle import ModelHandle
from shoal.dataplane.shadow import ShadowMirror
from shoal.dataplane.types import ClientRequest, InferenceResult, InputTensor

CONFIG = """name: "m" platform: "onnxruntime_onnx" max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
parameters [ { key: "shoal_shadow" value { string_value: "2:50" } } ]"""


def handle(text: str = CONFIG) -> ModelHandle:
    return ModelHandle(
        "m", 1, [1, 2], text_format.Parse(text, mc.ModelConfig()).SerializeToString()
    )


def request(buf: bytearray | None, version: str = "", **params: int | bool) -> ClientRequest:
    data = memoryview(buf) if buf is not None else None
    return ClientRequest("m", version, "r", dict(params), [InputTensor("X", "FP32", [1, 2], data)])


def test_half_of_the_unversioned_requests_are_copied_to_the_shadow_version() -> None:
    sent: list[ClientRequest] = []
    released: list[bool] = []

    async def infer(req: ClientRequest) -> InferenceResult:
        sent.append(req)
        return InferenceResult("m", req.version, release=lambda: released.append(True))

    async def scenario() -> None:
        mirror = ShadowMirror(infer)
        buf = bytearray(8)
        for _ in range(4):
            mirror.offer(request(buf), handle())
        mirror.offer(request(buf, version="1"), handle())  # it names a version
        mirror.offer(request(None), handle())  # in client shared memory
        mirror.offer(request(buf, sequence_id=7), handle())  # a sequence's
        mirror.offer(request(buf), handle(CONFIG.split("parameters")[0]))  # no shadow
        buf[:] = b"\x01" * 8  # the client's buffer changes after the offers
        await mirror.settled()
        assert mirror.sent == 2

    asyncio.run(scenario())
    assert [r.version for r in sent] == ["2", "2"]
    assert all(bytes(r.inputs[0].data or b"") == bytes(8) for r in sent)  # copied at once
    assert released == [True, True]  # the answers are dropped, their slots freed
