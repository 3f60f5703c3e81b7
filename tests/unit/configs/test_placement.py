"""Instance placement on cores and GPUs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from shoal.configs.model_config import fill_defaults
from shoal.configs.placement import InstancePlan, passive_instances, plan_instances
from shoal.configs.spec_reader import read_spec


def _config(name: str, *groups: tuple[int, int, list[int]]) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=name)
    for i, (kind, count, gpus) in enumerate(groups):
        cfg.instance_group.add(name=f"{name}_{i}", kind=kind, count=count, gpus=gpus)
    return cfg


CPU, GPU = mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_GPU


def _plan(
    models: list[tuple[str, list[int], mc.ModelConfig]], cpus: list[int]
) -> list[InstancePlan]:
    return plan_instances([(n, v, read_spec(c)) for n, v, c in models], cpus=cpus)


def test_cpu_instances_get_their_own_cores() -> None:
    plans = _plan([("a", [1], _config("a", (CPU, 2, [])))], cpus=[0, 1, 2, 3])
    assert [p.cores for p in plans] == [(0, 1), (2, 3)]
    assert [p.name for p in plans] == ["a_0_0", "a_0_1"]
    assert [p.index for p in plans] == [0, 1]


def test_default_group_instance_name_is_model_underscore_k() -> None:
    # Triton names the group it adds after the model; its instances are "<group>_<k>".
    config = fill_defaults(mc.ModelConfig(platform="onnxruntime_onnx"), "a")
    plans = _plan([("a", [1], config)], cpus=[0, 1])
    assert [p.name for p in plans] == ["a_0"]


def test_more_instances_than_cores_share_round_robin() -> None:
    plans = _plan(
        [("a", [1, 2], _config("a", (CPU, 2, []))), ("b", [1], _config("b", (CPU, 1, [])))],
        cpus=[0, 1],
    )
    assert [p.cores for p in plans] == [(0,), (1,), (0,), (1,), (0,)]


def test_gpu_groups_place_count_instances_on_each_listed_gpu() -> None:
    plans = _plan([("g", [1], _config("g", (GPU, 2, [0, 1]), (CPU, 1, [])))], cpus=[0, 1])
    assert [(p.gpu, p.cores) for p in plans] == [(0, ()), (0, ()), (1, ()), (1, ()), (None, (0, 1))]


def test_a_gpu_instance_sees_the_server_gpu_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Server GPU ids index the CUDA_VISIBLE_DEVICES the server started with."""
    from shoal.configs.devices import visible_device

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_device(1) == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert [visible_device(0), visible_device(1)] == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5a1c")
    assert visible_device(0) == "GPU-5a1c"
    with pytest.raises(ValueError, match="not one of"):
        visible_device(1)


def test_a_tensor_parallel_group_takes_the_gpus_after_its_instances(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 is the instance's GPU, ranks 1.. the server's next ones (wrapping), each
    seen alone; a group larger than the server's GPUs is refused."""
    from shoal.configs import devices

    for name in (devices.INSTANCE_GPU_ENV, devices.SERVER_VISIBLE_ENV):
        monkeypatch.setenv(name, "")  # (restored after the test, as the next one)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    devices.narrow_to(2)  # (what a GPU instance's worker does first)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    assert devices.group_devices(2, present=8) == ["6", "4"]
    assert devices.group_devices(3, present=8) == ["6", "4", "5"]
    with pytest.raises(ValueError, match=r"tensor_parallel_size 4 needs 4 GPUs.*has 3"):
        devices.group_devices(4, present=8)
    unset = {devices.INSTANCE_GPU_ENV: "1"}  # the server's CUDA_VISIBLE_DEVICES unset
    assert devices.group_devices(2, unset, present=2) == ["1", "0"]
    with pytest.raises(ValueError, match="the server has 0"):
        devices.group_devices(2, {}, present=0)


def test_passive_instances_are_numbered_as_plan_instances_numbers_them() -> None:
    cfg = _config("p", (GPU, 1, [0, 1]), (CPU, 2, []), (CPU, 1, []))
    cfg.instance_group[1].passive = True
    plans = _plan([("p", [1], cfg)], cpus=[0, 1])
    assert [p.index for p in plans if p.gpu is None][:2] == [2, 3]
    assert passive_instances(read_spec(cfg)) == frozenset({2, 3})
    assert passive_instances(read_spec(_config("q", (CPU, 2, [])))) == frozenset()


def test_every_core_goes_to_an_instance_when_they_do_not_divide_evenly() -> None:
    """5 instances on 8 cores: blocks of 2, 2, 2, 1, 1 (7 of 16 cores would stay idle
    for 9 instances if each got 16 // 9)."""
    models = [(f"m{i}", [1], _config(f"m{i}", (CPU, 1, []))) for i in range(5)]
    plans = _plan(models, cpus=list(range(8)))
    assert [p.cores for p in plans] == [(0, 1), (2, 3), (4, 5), (6,), (7,)]
    many = [(f"m{i}", [1], _config(f"m{i}", (CPU, 1, []))) for i in range(9)]
    cores = [c for p in _plan(many, cpus=list(range(16))) for c in p.cores]
    assert sorted(cores) == list(range(16))  # each core once


def test_passive_instances_take_no_core_from_the_ones_that_serve() -> None:
    cfg = _config("p", (CPU, 1, []), (CPU, 3, []))
    cfg.instance_group[1].passive = True
    plans = _plan([("p", [1], cfg)], cpus=[0, 1, 2, 3])
    assert [p.cores for p in plans] == [(0, 1, 2, 3)] * 4  # the active one owns them all


def test_gpus_are_counted_as_cuda_counts_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The driver's /proc folder, else the /dev/nvidia<N> files (a sandbox that emulates
    only those); CUDA_VISIBLE_DEVICES read up to its first entry CUDA cannot read."""
    from shoal.configs import devices

    proc, dev = tmp_path / "gpus", tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    monkeypatch.setattr(devices, "_NVIDIA_PROC", proc)  # missing: /dev counts
    monkeypatch.setattr(devices, "_DEV", dev)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert devices.gpu_count() == 2
    proc.mkdir()
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (proc / bus).mkdir()
    assert devices.gpu_count() == 3  # the driver's own list comes first
    for visible, count in (("0,-1,1", 1), ("2, 0", 2), ("-1", 0), ("", 0), ("GPU-5a1c,1", 2)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert devices.gpu_count() == count, visible
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,-1,1")
    assert devices.visible_device(0) == "3"
    with pytest.raises(ValueError, match="not one of"):
        devices.visible_device(1)
    monkeypatch.setattr(devices, "_DEV", tmp_path / "nowhere")
    proc.rename(tmp_path / "gone")
    assert devices.gpu_count() == 0
