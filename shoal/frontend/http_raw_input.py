"""The raw binary inference request: a body that is one tensor and no JSON header.

Triton accepts ``Inference-Header-Content-Length: 0`` only for a model with exactly one
input and at most one variable-size dimension (BYTES: shape [1]); the request is batch 1
and every output goes back binary. Pure, safe to call from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.dataplane.types import InputTensor
from shoal.ipc.datatypes import datatype
from shoal.ipc.errors import ServingError, invalid_arg, named


@dataclass(frozen=True, slots=True)
class RawInputMeta:
    """What a raw binary request needs to know about the model."""

    name: str  # the model's input
    datatype: str  # v2 name
    dims: tuple[int, ...] | list[int]  # config dims, without the batch dimension
    max_batch_size: int
    input_count: int  # inputs in the model configuration


def raw_input_tensor(buf: memoryview, model: str, meta: RawInputMeta) -> InputTensor:
    """The input a raw body stands for, its shape deduced as Triton does.

    The data is ``buf`` itself, except BYTES, which gets its 4-byte length prefix (a copy).
    """
    if meta.input_count != 1:
        raise _refused(
            "Raw request must only have 1 input (found 1) to be deduced but got "
            f"{meta.input_count} inputs in '{model}' model configuration"
        )
    shape = [1] if meta.max_batch_size > 0 else []
    dynamic = -1
    fixed = 1
    for d in meta.dims:
        if d == -1:
            if dynamic != -1:
                raise _refused(
                    f"The shape of the raw input '{meta.name}' can not be deduced because "
                    "there are more than one variable-sized dimension"
                )
            dynamic = len(shape)
        else:
            fixed *= d
        shape.append(d)
    data = buf
    if meta.datatype == "BYTES":
        if dynamic != -1 or fixed != 1:
            raise _refused(
                f"For BYTE datatype raw input '{meta.name}', the model must have input shape [1]"
            )
        data = memoryview(len(buf).to_bytes(4, "little") + bytes(buf))
    elif dynamic != -1:
        dt = datatype(meta.datatype)
        itemsize = dt.itemsize if dt is not None else 1
        # A size that does not divide evenly is left for the byte-size check downstream.
        shape[dynamic] = len(buf) // max(fixed * itemsize, 1)
    return InputTensor(name=meta.name, datatype=meta.datatype, shape=shape, data=data)


def _refused(message: str) -> ServingError:
    """Triton refuses a raw request as a request: its (unknown) id comes first."""
    return invalid_arg(named(message, ""))
