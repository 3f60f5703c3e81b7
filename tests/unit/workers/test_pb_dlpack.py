"""pb_utils.Tensor's DLPack (shoal/workers/pb_dlpack.py) on the host: round trips with
torch and numpy sharing memory, capsules and ``__dlpack__`` objects, and Triton's refusals.
The GPU side is tests/gpu/test_python_gpu.py's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils import dlpack as torch_dlpack

from shoal.workers import pb_utils as pb


def test_from_a_torch_tensor_or_its_capsule_shares_its_memory() -> None:
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    direct = pb.Tensor.from_dlpack("A", t)
    through_capsule = pb.Tensor.from_dlpack("B", torch_dlpack.to_dlpack(t))
    t[0, 0] = 100.0
    assert direct.as_numpy()[0, 0] == through_capsule.as_numpy()[0, 0] == 100.0
    assert direct.is_cpu() and direct.shape() == [2, 3]
    assert direct.triton_dtype() == 11  # TYPE_FP32


def test_to_dlpack_gives_torch_the_tensors_memory() -> None:
    tensor = pb.Tensor("IN", np.arange(4, dtype=np.int64))
    view = torch_dlpack.from_dlpack(tensor.to_dlpack())
    view[1] = -7
    assert tensor.as_numpy().tolist() == [0, -7, 2, 3]
    assert torch.from_dlpack(tensor).tolist() == [0, -7, 2, 3]  # (its __dlpack__)
    again = torch_dlpack.from_dlpack(tensor.to_dlpack())  # a new capsule each time
    assert again.dtype == torch.int64


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int32, np.float16, np.float64])
def test_numpy_round_trips(dtype: type) -> None:
    source = np.ones((2, 2), dtype=dtype)
    tensor = pb.Tensor.from_dlpack("X", source)
    assert tensor.as_numpy().dtype == np.dtype(dtype)
    back = np.from_dlpack(tensor)
    assert np.shares_memory(back, source)


def test_refusals_are_tritons() -> None:
    t = torch.zeros(2, 3)
    with pytest.raises(pb.TritonModelException, match="DLPack tensor is not contiguous"):
        pb.Tensor.from_dlpack("T", t.T)
    with pytest.raises(pb.TritonModelException, match="Tensor must be a DLPack capsule"):
        pb.Tensor.from_dlpack("T", [1, 2])
    with pytest.raises(pb.TritonModelException, match="Tensor name cannot be an empty string"):
        pb.Tensor.from_dlpack("", t)
    with pytest.raises(pb.TritonModelException, match="support for string tensors"):
        pb.Tensor("S", np.array([b"text"], dtype=object)).to_dlpack()
    capsule = torch_dlpack.to_dlpack(t)
    pb.Tensor.from_dlpack("T", capsule)
    with pytest.raises(pb.TritonModelException, match="no DLPack tensor"):
        pb.Tensor.from_dlpack("T", capsule)  # (consumed by the first)


def test_a_tensor_on_another_kind_of_device_is_refused() -> None:
    class Elsewhere:
        def __dlpack__(self, stream: object = None) -> None:
            raise AssertionError("not asked")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (4, 0)  # kDLOpenCL

    with pytest.raises(pb.TritonModelException, match="DLDevice type 4 is not support"):
        pb.Tensor.from_dlpack("X", Elsewhere())


def test_bf16_goes_through_dlpack_only() -> None:
    """As Triton: a BF16 tensor refuses as_numpy and round-trips through DLPack."""
    t = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    for source in (t, torch_dlpack.to_dlpack(t)):
        tensor = pb.Tensor.from_dlpack("B", source)
        assert tensor.triton_dtype() == 14 and tensor.shape() == [3]
        with pytest.raises(pb.TritonModelException, match="Tensor dtype is BF16"):
            tensor.as_numpy()
        back = torch_dlpack.from_dlpack(tensor.to_dlpack())
        assert back.dtype == torch.bfloat16 and back.tolist() == [1.5, -2.0, 3.25]
    # the worker's: a BF16 input's bits as uint16
    bits = t.view(torch.int16).numpy().view(np.uint16).copy()
    given = pb.Tensor._of("IN", bits, None, True)
    assert torch.from_dlpack(given).tolist() == [1.5, -2.0, 3.25]
