"""The frontend's transport-agnostic request and result types.

HTTP and gRPC adapters translate their wire formats into these and call the one
``DataPlane``. Tensor data is always in wire layout: row-major, little-endian, BOOL one
byte per element, BYTES as 4-byte little-endian lengths each followed by the bytes,
BF16 as raw 16-bit patterns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shoal.ipc.errors import Code

if TYPE_CHECKING:
    from shoal.dataplane.tracing import Trace

ParamValue = bool | int | float | str
#: The request parameter that asks for the final flag alone as an empty response (the one
#: "triton_" key a client may set); every response carries ``FINAL_FLAG``.
EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL_FLAG = "triton_final_response"


@dataclass(slots=True)
class InputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: memoryview | None  # None when the tensor lives in client shared memory
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    # where ``data`` lies in this frontend's shared memory (slab region, offset), when it
    # is an earlier answer's output (an ensemble's step): sent as that reference, no copy
    location: tuple[str, int] | None = None


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict[str, ParamValue] = field(default_factory=dict)


@dataclass(slots=True)
class ClientRequest:
    """A request as a client of the data plane gives it: an HTTP or gRPC adapter's decoded
    request, or a Python model's BLS call (``pb_utils.InferenceRequest``). On its way to
    the broker it becomes an ``ipc.messages.InferRequest``."""

    model: str
    version: str  # "" means the latest ready version
    id: str = ""
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    inputs: list[InputTensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty: all outputs
    trace: Trace | None = None  # sampled for tracing (shoal/dataplane/tracing.py)


@dataclass(slots=True)
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: memoryview | None  # None when written to client shared memory
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    location: tuple[str, int] | None = None  # in this frontend's shared memory, if there


def _no_release() -> None:
    return None


@dataclass(slots=True)
class ResponseError:
    """An error a model sent as one of its responses: a decoupled model's may be
    followed by more responses (``final`` says whether it is the last)."""

    message: str
    final: bool
    code: Code = Code.INTERNAL


@dataclass(slots=True)
class InferenceResult:
    """Outputs of one request. ``data`` views may point into server shared memory:
    call ``release()`` once the bytes have been consumed (after which they are invalid)."""

    model_name: str
    model_version: str
    id: str = ""
    outputs: list[OutputTensor] = field(default_factory=list)
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    release: Callable[[], None] = _no_release
