"""A gRPC request with many BYTES elements is decoded on a worker thread, off the event
loop (frontend/grpc_stream.decode_request); others on the loop, as before."""

from __future__ import annotations

import asyncio
import threading

import pytest
from tritonclient.grpc import service_pb2 as pb

from shoal.frontend import grpc_codec
from shoal.frontend.grpc_stream import DECODE_ON_THREAD_ELEMENTS, decode_request


def _request(elements: int) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m")
    t = req.inputs.add(name="INPUT0", datatype="BYTES", shape=[elements])
    t.contents.bytes_contents.extend([b"x"] * elements)
    return req


@pytest.mark.parametrize(
    ("elements", "on_loop"),
    [(1, True), (DECODE_ON_THREAD_ELEMENTS, True), (DECODE_ON_THREAD_ELEMENTS + 1, False)],
)
def test_many_bytes_elements_are_decoded_off_the_loop(
    monkeypatch: pytest.MonkeyPatch, elements: int, on_loop: bool
) -> None:
    seen: list[int] = []
    decode = grpc_codec.decode_infer_request

    def spy(request: pb.ModelInferRequest) -> object:
        seen.append(threading.get_ident())
        return decode(request)

    monkeypatch.setattr(grpc_codec, "decode_infer_request", spy)
    decoded = asyncio.run(decode_request(_request(elements)))
    assert (seen == [threading.get_ident()]) == on_loop
    (tensor,) = decoded.inputs
    assert tensor.shape == [elements]


def test_a_decoding_error_comes_back_from_the_thread() -> None:
    req = _request(DECODE_ON_THREAD_ELEMENTS + 1)
    req.inputs[0].contents.int_contents.append(1)  # two typed fields: Triton refuses
    with pytest.raises(Exception, match="unexpected explicit tensor data"):
        asyncio.run(decode_request(req))
