"""DLPack for ``pb_utils.Tensor`` (``from_dlpack``, ``to_dlpack``, ``__dlpack__``): what a
DLPack capsule or a ``__dlpack__`` object holds, and its import with no copy.

Host memory (kDLCPU, kDLCUDAHost) becomes a numpy array over the same bytes
(``np.from_dlpack``); device memory (kDLCUDA) a cupy array over the same device memory
(``cupy.from_dlpack``; cupy is imported only then). A capsule is read here (its
``DLManagedTensor``, through ctypes) for its device, since numpy and cupy take objects
with ``__dlpack__`` rather than capsules. As Triton's Python backend: only C-contiguous
tensors are taken, and the errors are its words.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3
_KDL_UINT, _KDL_BFLOAT = 1, 4
BF16_TO_NUMPY = (
    "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() "
    "instead."
)
NOT_CONTIGUOUS = (
    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in "
    "C-Order are supported."
)
NOT_SUPPORTED = (
    "Provided tensor is not supported. Tensor must be a DLPack capsule or have `__dlpack__` "
    "and `__dlpack_device__` attributes"
)


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype_code", ctypes.c_uint8),
        ("dtype_bits", ctypes.c_uint8),
        ("dtype_lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Versioned(ctypes.Structure):  # DLManagedTensorVersioned's head (DLPack 1.0)
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
    ]


_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype, _get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def is_capsule(obj: Any) -> bool:
    return type(obj).__name__ == "PyCapsule"


def _tensor(capsule: Any) -> _DLTensor:
    """The DLTensor of an unconsumed DLPack capsule; ValueError otherwise."""
    name = _get_name(capsule)
    if name not in (b"dltensor", b"dltensor_versioned"):
        raise ValueError(f"a capsule named {name!r} is no DLPack tensor (a used one?)")
    address = _get_pointer(capsule, name)
    if name == b"dltensor_versioned":
        address += ctypes.sizeof(_Versioned)
    return _DLTensor.from_address(address)


def capsule_device(capsule: Any) -> tuple[int, int]:
    """(device type, device id) of an unconsumed DLPack capsule; ValueError otherwise."""
    tensor = _tensor(capsule)
    return int(tensor.device.device_type), int(tensor.device.device_id)


def _retag(capsule: Any, code: int, to: int) -> bool:
    """Relabel a 16-bit tensor's type code in its capsule (BF16 <-> its bits as uint16:
    numpy and cupy have no bfloat16, and the bytes are the same); whether it was one."""
    tensor = _tensor(capsule)
    if (tensor.dtype_code, tensor.dtype_bits) != (code, 16):
        return False
    tensor.dtype_code = to
    return True


class _Capsule:
    """A capsule as the ``__dlpack__`` object numpy and cupy take (once: a capsule is
    consumed by its first import)."""

    def __init__(self, capsule: Any, device: tuple[int, int]) -> None:
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *_: Any, **__: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def imported(tensor: Any) -> tuple[np.ndarray | None, Any, bool]:
    """A capsule or ``__dlpack__`` object as (numpy array, None) on the host or (None, cupy
    array) on a GPU, sharing its memory, and whether it is BF16 (then the arrays hold its
    bits as uint16); ValueError (Triton's words) if it cannot be."""
    bf16 = False
    if not is_capsule(tensor) and not (
        hasattr(tensor, "__dlpack__") and hasattr(tensor, "__dlpack_device__")
    ):
        raise ValueError(NOT_SUPPORTED)
    if not is_capsule(tensor) and _is_bf16(tensor):
        tensor = tensor.__dlpack__()  # (relabelled below: neither numpy nor cupy reads BF16)
    if is_capsule(tensor):
        bf16 = _retag(tensor, _KDL_BFLOAT, _KDL_UINT)
        device = capsule_device(tensor)
        source: Any = _Capsule(tensor, device)
    else:
        device = tuple(int(v) for v in tensor.__dlpack_device__())  # type: ignore[assignment]
        source = tensor
    if device[0] in (KDL_CPU, KDL_CUDA_HOST):
        host = np.from_dlpack(source)
        if not host.flags.c_contiguous:
            raise ValueError(NOT_CONTIGUOUS)
        return host, None, bf16
    if device[0] == KDL_CUDA:
        import cupy  # (a GPU tensor's model has it: shoal's GPU paths need it)

        on_device = cupy.from_dlpack(source)
        if not on_device.flags.c_contiguous:
            raise ValueError(NOT_CONTIGUOUS)
        return None, on_device, bf16
    raise ValueError(f"DLDevice type {device[0]} is not support by Python backend.")


def _is_bf16(tensor: Any) -> bool:
    return "bfloat16" in str(getattr(tensor, "dtype", ""))


def exported(host: np.ndarray | None, on_device: Any, bf16: bool = False) -> Any:
    """A new DLPack capsule of a tensor's memory (each call its own); a BF16 tensor's
    labelled BF16."""
    if on_device is not None:
        capsule = on_device.__dlpack__()
    else:
        assert host is not None
        if host.dtype.kind in "OSU":
            raise ValueError("DLPack does not have support for string tensors.")
        if not host.flags.writeable:  # (numpy exports writable arrays only)
            host = host.copy()
        capsule = host.__dlpack__()
    if bf16:
        _retag(capsule, _KDL_UINT, _KDL_BFLOAT)
    return capsule
