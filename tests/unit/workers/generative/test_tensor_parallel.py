"""A tensor-parallel group's link: gloo on CPU instances, gloo for the steps and NCCL for
the model's CUDA collectives on GPU instances; each follower started seeing its own GPU."""

from __future__ import annotations

import pytest

from shoal.workers.generative.tensor_parallel import TensorParallelGroup, backend


class _Model:
    pass


def test_the_backend_follows_the_device() -> None:
    assert backend("cpu") == "gloo"
    assert backend("cuda") == "cpu:gloo,cuda:nccl"


def test_each_follower_sees_its_own_gpu() -> None:
    group = TensorParallelGroup(3, _Model, {}, "cuda", ["5", "6", "7"])
    envs = [group._env(r) or {} for r in (1, 2)]
    assert [env.get("CUDA_VISIBLE_DEVICES") for env in envs] == ["6", "7"]
    assert TensorParallelGroup(2, _Model, {}, "cpu")._env(1) is None  # (inherits the worker's)
    with pytest.raises(ValueError, match="2 GPUs for a tensor-parallel group of 3"):
        TensorParallelGroup(3, _Model, {}, "cuda", ["5", "6"])
