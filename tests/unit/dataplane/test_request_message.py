"""A client's request as the broker's message, and an answer's outputs read back
(shoal/dataplane/request_message.py): no broker, a real slab pool for the slots."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from shoal.dataplane.model_handle import ModelHandle
from shoal.dataplane.request_message import (
    outputs,
    parse_version,
    request_message,
    sequence_id,
    uint_param,
)
from shoal.dataplane.types import ClientRequest, InputTensor, RequestedOutput
from shoal.ipc import messages as m
from shoal.ipc import shm
from shoal.ipc.errors import Code, ServingError

_CONFIG = """name: "m" backend: "%s" max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "BIG" data_type: TYPE_FP32 dims: [ 8192 ] },
         { name: "SMALL" data_type: TYPE_FP32 dims: [ 4 ] } ]"""


def _model(backend: str = "onnxruntime") -> ModelHandle:
    config = text_format.Parse(_CONFIG % backend, mc.ModelConfig())
    return ModelHandle("m", 1, [1], config.SerializeToString())


@pytest.fixture
def pool() -> Iterator[shm.SlabPool]:
    p = shm.SlabPool("test-msg", 1 << 20)
    yield p
    p.close()


def _request(n: int, **params: bool | int | str) -> ClientRequest:
    data = memoryview(np.arange(n, dtype=np.float32).tobytes())
    x = InputTensor("X", "FP32", [1, n], data)
    return ClientRequest("m", "", "r-1", dict(params), [x], [])


def _build(
    req: ClientRequest, pool: shm.SlabPool, model: ModelHandle | None = None, shm_ok: bool = False
) -> tuple[m.InferRequest, list[shm.Slot]]:
    slots: list[shm.Slot] = []
    ids = itertools.count(41)
    msg = request_message(req, model or _model(), 1, slots, pool.alloc, lambda: next(ids), shm_ok)
    return msg, slots


def test_small_inputs_ride_inline_and_large_ones_and_outputs_take_slots(
    pool: shm.SlabPool,
) -> None:
    msg, slots = _build(_request(4), pool)
    (x,) = msg.inputs
    assert msg.req_id == 41 and x.data is not None and x.nbytes == 16 and x.shape == [1, 4]
    assert [(o.name, o.nbytes) for o in msg.outputs] == [("BIG", 8192 * 4), ("SMALL", 0)]
    assert len(slots) == 1  # the large output's
    msg, slots = _build(_request(8192), pool)
    assert msg.inputs[0].data is None and msg.inputs[0].region == slots[0].region
    assert bytes(slots[0].view[:8]) == np.arange(2, dtype=np.float32).tobytes()
    for s in slots:
        pool.free(s)


def test_the_parameters_triton_reads_become_fields_and_a_python_model_gets_the_rest(
    pool: shm.SlabPool,
) -> None:
    req = _request(4, priority=-1, sequence_id=7, sequence_start=True, mine="x", triton_y=1)
    msg, _ = _build(req, pool, _model("python"))
    assert (msg.priority, msg.sequence_id, msg.sequence_start, msg.sequence_end) == (
        2**64 - 1, 7, True, False
    )  # fmt: skip
    assert msg.request_id == "r-1" and msg.parameters == {"mine": "x"}
    msg, _ = _build(req, pool)
    assert msg.parameters == {} and msg.request_id == ""


def test_client_shared_memory_is_refused_unless_allowed(pool: shm.SlabPool) -> None:
    req = _request(4)
    req.outputs = [
        RequestedOutput("SMALL", {"shared_memory_region": "r", "shared_memory_byte_size": 16})
    ]
    with pytest.raises(ServingError) as err:
        _build(req, pool)
    assert err.value.code == Code.UNSUPPORTED
    msg, _ = _build(req, pool, shm_ok=True)
    (out,) = msg.outputs
    assert (out.region, out.nbytes) == (m.CLIENT_SHM + "r", 16)


@pytest.mark.parametrize(
    ("version", "expected"),
    [("", -1), ("3", 3), ("-1", None), ("²", None), ("1" * 20, None), ("abc", None)],
)
def test_a_version_string_is_an_int64_or_triton_s_refusal(
    version: str, expected: int | None
) -> None:
    if expected is not None:
        assert parse_version(version) == expected
        return
    with pytest.raises(ServingError) as err:
        parse_version(version)
    assert err.value.code == Code.INVALID_ARG and "version should be an integral value" in str(
        err.value.message
    )


def test_numeric_parameters_are_kept_as_triton_keeps_them() -> None:
    req = ClientRequest("m", "", parameters={"timeout": -2, "sequence_id": "s-1"})
    assert uint_param(req, "timeout") == 2**64 - 2 and uint_param(req, "priority") == 0
    assert sequence_id(req) == "s-1"
    with pytest.raises(ServingError):
        uint_param(ClientRequest("m", "", parameters={"priority": True}), "priority")


def test_an_answer_s_outputs_are_views_of_its_slots_or_inline_bytes(pool: shm.SlabPool) -> None:
    slot = pool.alloc(64)
    slot.view[:4] = b"\x01\x02\x03\x04"
    resp = m.InferResponse(
        1,
        [
            m.TensorRef("A", "UINT8", [4], 4, slot.region, slot.offset),
            m.TensorRef("B", "UINT8", [2], 2, data=b"\x05\x06"),
            m.TensorRef("C", "UINT8", [2], 2, m.CLIENT_REGION + "3", 0),
        ],
    )
    a, b, c = outputs(resp, [slot])
    assert a.data is not None and bytes(a.data) == b"\x01\x02\x03\x04"
    assert a.location == (slot.region, slot.offset)
    assert b.data is not None and bytes(b.data) == b"\x05\x06" and c.data is None
    with pytest.raises(ServingError) as err:
        outputs(resp, [])
    assert err.value.message == "output 'A' came back misplaced"
    pool.free(slot)
