"""Triton's GPU metrics through NVML, without a GPU: NVML itself (the driver's library,
not shoal's) is replaced by a stand-in holding fixed figures. The real thing runs in
tests/gpu/test_gpu_paths.py on a GPU host."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shoal.configs.flags.frontend import MetricsConfig
from shoal.frontend.gpu_metrics import GpuSampler
from shoal.frontend.metrics import render
from shoal.ipc import messages as m


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    uuid: str
    util: int = 0  # percent
    total: int = 80 << 30
    used: int = 1 << 30
    power_mw: int | None = 70_000
    limit_mw: int | None = 700_000
    energy_mj: int | None = 5_000_000


@dataclass
class FakeNvml:
    """NVML's calls that GpuSampler makes, over a list of GPUs in PCI order."""

    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: bool = False
    open: bool = False
    NVMLError: type[Exception] = NVMLError

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError("Driver Not Loaded")
        self.open = True

    def nvmlShutdown(self) -> None:
        self.open = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise NVMLError("Not Found")

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        return SimpleNamespace(gpu=h.util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)

    def _supported(self, value: int | None) -> int:
        if value is None:
            raise NVMLError("Not Supported")
        return value

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._supported(h.power_mw)

    def nvmlDeviceGetPowerManagementLimit(self, h: FakeGpu) -> int:
        return self._supported(h.limit_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        return self._supported(h.energy_mj)


def _three() -> FakeNvml:
    return FakeNvml([FakeGpu("GPU-aaa"), FakeGpu("GPU-bbb"), FakeGpu("GPU-ccc")])


@pytest.mark.parametrize(
    ("visible", "uuids"),
    [
        (None, ["GPU-aaa", "GPU-bbb", "GPU-ccc"]),
        ("2,0", ["GPU-ccc", "GPU-aaa"]),  # CUDA's order is the variable's
        ("GPU-bbb", ["GPU-bbb"]),
        ("1,-1,2", ["GPU-bbb"]),  # CUDA stops at the first entry it cannot read
        # A device the host lacks hides those after it, as in CUDA (and said in the log).
        ("0,7,1", ["GPU-aaa"]),
        ("2,GPU-zzz,1", ["GPU-ccc"]),
        ("MIG-abc", []),
    ],
)
def test_the_gpus_are_those_cuda_visible_devices_shows(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, uuids: list[str]
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = _three()
    sampler = GpuSampler.open(nvml)
    if not uuids:
        assert sampler is None and not nvml.open  # nothing to show: NVML closed again
        return
    assert sampler is not None
    assert [g.uuid for g in sampler.gpus] == uuids


def test_no_driver_or_no_gpu_means_no_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert GpuSampler.open(FakeNvml(init_error=True)) is None
    empty = FakeNvml()
    assert GpuSampler.open(empty) is None
    assert not empty.open


def test_figures_in_tritons_units_and_energy_since_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = FakeGpu("GPU-aaa", util=57, total=141 << 30, used=3 << 30, power_mw=123_456)
    nvml = FakeNvml([gpu])
    sampler = GpuSampler.open(nvml)
    assert sampler is not None
    (reading,) = sampler.gpus
    assert reading.utilization == pytest.approx(0.57)
    assert (reading.memory_total, reading.memory_used) == (141 << 30, 3 << 30)
    assert reading.power_usage == pytest.approx(123.456)
    assert reading.power_limit == pytest.approx(700.0)
    assert reading.energy == 0.0  # joules since the sampler opened
    gpu.energy_mj = 5_000_000 + 2_500  # 2.5 J later
    gpu.used = 5 << 30
    gpu.util = 100
    assert reading.memory_used == 3 << 30  # figures change only when sampled
    sampler.sample()
    assert reading.energy == pytest.approx(2.5)
    assert reading.memory_used == 5 << 30
    assert reading.utilization == 1.0
    sampler.close()
    assert not nvml.open


def test_the_page_has_tritons_gpu_families_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNvml(
        [
            FakeGpu("GPU-aaa", util=25, power_mw=80_000),
            # A board that reports neither power nor energy: those series are left out.
            FakeGpu("GPU-bbb", util=50, power_mw=None, limit_mw=None, energy_mj=None),
        ]
    )
    sampler = GpuSampler.open(nvml)
    assert sampler is not None
    text = render([], MetricsConfig(), None, gpus=sampler)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    gpu_families = [n for n in fams if n.startswith(("nv_gpu", "nv_energy"))]
    assert gpu_families == [
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
    ]
    assert fams["nv_energy_consumption"].type == "counter"
    assert "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)\n" in text

    def values(name: str) -> dict[str, float]:
        return {s.labels["gpu_uuid"]: s.value for s in fams[name].samples}

    assert values("nv_gpu_utilization") == {"GPU-aaa": 0.25, "GPU-bbb": 0.5}
    assert values("nv_gpu_memory_total_bytes") == {"GPU-aaa": 80 << 30, "GPU-bbb": 80 << 30}
    assert values("nv_gpu_power_usage") == {"GPU-aaa": 80.0}
    assert values("nv_gpu_power_limit") == {"GPU-aaa": 700.0}
    assert values("nv_energy_consumption") == {"GPU-aaa": 0.0}


def test_without_gpus_the_page_has_no_gpu_families() -> None:
    text = render([], MetricsConfig(), None)
    assert "nv_gpu" not in text and "nv_energy" not in text


def test_a_model_on_one_gpu_carries_its_gpu_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sampler = GpuSampler.open(_three())
    assert sampler is not None

    def version(name: str, gpu: int) -> m.VersionMetrics:
        return m.VersionMetrics(m.ModelStats(name, "1"), {}, 0, {"team": "a"}, gpu=gpu)

    rows = [version("on_gpu1", 1), version("on_cpu", -1), version("beyond", 7)]
    fams = {
        f.name: f
        for f in text_string_to_metric_families(render(rows, MetricsConfig(), None, gpus=sampler))
    }
    labels = {s.labels["model"]: s.labels for s in fams["nv_inference_count"].samples}
    assert labels["on_gpu1"] == {
        "model": "on_gpu1",
        "version": "1",
        "_team": "a",
        "gpu_uuid": "GPU-bbb",
    }
    assert "gpu_uuid" not in labels["on_cpu"]
    assert "gpu_uuid" not in labels["beyond"]  # a GPU the metrics do not see
    failures = [
        s.labels
        for s in fams["nv_inference_request_failure"].samples
        if s.labels["model"] == "on_gpu1"
    ]
    assert failures and all(s["gpu_uuid"] == "GPU-bbb" for s in failures)
    # Without GPU metrics (--allow-gpu-metrics=false, no NVML) Triton has no gpu_uuid either.
    plain = render(rows, MetricsConfig(), None)
    assert "gpu_uuid" not in plain
