"""Triton's GPU metrics: utilization, memory, power and energy of each GPU the server
sees, labelled ``gpu_uuid``, sampled every ``--metrics-interval-ms``.

Triton reads them through DCGM; shoal reads the same figures through NVML (NVIDIA's
``nvidia-ml-py``, a ctypes binding of the driver's libnvidia-ml): no CUDA context and no
daemon. The GPUs are those CUDA shows the server, read as shoal.configs.devices reads
CUDA_VISIBLE_DEVICES: indices are NVML's (PCI bus order, which is CUDA's order when
CUDA_DEVICE_ORDER=PCI_BUS_ID, and on hosts of one GPU model), and GPU- UUIDs are looked up.
MIG instances are left out. A figure the GPU does not report (power on some boards,
energy before Volta) is left out of the page rather than shown as 0.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shoal.configs.devices import visible_ids

log = logging.getLogger("shoal.frontend")

# (family, HELP, TYPE, field of GpuReading): Triton's names, texts and order.
FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge", "utilization"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge", "memory_total"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge", "memory_used"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "gauge", "power_usage"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge", "power_limit"),
    (
        "nv_energy_consumption",
        "GPU energy consumption in joules since the Triton Server started",
        "counter",
        "energy",
    ),
)


@dataclass
class GpuReading:
    """One GPU's figures at the last sample; None where the GPU does not report one."""

    uuid: str
    utilization: float | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    power_usage: float | None = None  # W
    power_limit: float | None = None  # W
    energy: float | None = None  # J since this sampler opened


def _handles(nvml: Any, visible: str | None) -> list[Any]:
    """The NVML handles of the GPUs CUDA shows this process, in CUDA's order."""
    count = nvml.nvmlDeviceGetCount()
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    out = []
    for entry in visible_ids(visible):
        # As CUDA reads the variable, a device the host lacks hides those after it too.
        if entry.isdigit():
            if int(entry) >= count:
                break
            out.append(nvml.nvmlDeviceGetHandleByIndex(int(entry)))
        elif entry.startswith("GPU-"):
            try:
                out.append(nvml.nvmlDeviceGetHandleByUUID(entry))
            except nvml.NVMLError:
                log.warning("GPU metrics: CUDA_VISIBLE_DEVICES names %s, which NVML lacks", entry)
                break
        else:  # MIG- instances: not measured
            break
    return out


class GpuSampler:
    """NVML, opened once per process; ``sample`` reads every GPU's figures (blocking
    calls into the driver, a few milliseconds: run it off the event loop)."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self.gpus = [GpuReading(uuid=_text(nvml.nvmlDeviceGetUUID(h))) for h in handles]
        self._energy_start = [
            self._read(nvml.nvmlDeviceGetTotalEnergyConsumption, h) for h in handles
        ]

    @classmethod
    def open(cls, nvml: Any = None) -> GpuSampler | None:
        """A sampler of the GPUs this process sees; None where there are none, or no NVML
        (no driver, nvidia-ml-py missing), said once in the log."""
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")  # nvidia-ml-py
            except ImportError:
                log.info("GPU metrics off: nvidia-ml-py (pynvml) is not installed")
                return None
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            log.debug("GPU metrics off: NVML cannot start (%s)", exc)
            return None
        try:
            handles = _handles(nvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if not handles:
                nvml.nvmlShutdown()
                return None
            sampler = cls(nvml, handles)
        except nvml.NVMLError as exc:
            log.warning("GPU metrics off: NVML could not list the GPUs (%s)", exc)
            nvml.nvmlShutdown()
            return None
        sampler.sample()
        log.info("GPU metrics for %s", ", ".join(g.uuid for g in sampler.gpus))
        return sampler

    def _read(self, call: Callable[[Any], Any], handle: Any) -> Any:
        try:
            return call(handle)
        except self._nvml.NVMLError:  # NotSupported, NoPermission, GpuIsLost, ...
            return None

    def sample(self) -> None:
        nvml = self._nvml
        for gpu, h, start in zip(self.gpus, self._handles, self._energy_start, strict=True):
            rates = self._read(nvml.nvmlDeviceGetUtilizationRates, h)
            gpu.utilization = None if rates is None else rates.gpu / 100
            memory = self._read(nvml.nvmlDeviceGetMemoryInfo, h)
            gpu.memory_total = None if memory is None else int(memory.total)
            gpu.memory_used = None if memory is None else int(memory.used)
            power = self._read(nvml.nvmlDeviceGetPowerUsage, h)  # mW
            gpu.power_usage = None if power is None else power / 1000
            limit = self._read(nvml.nvmlDeviceGetPowerManagementLimit, h)  # mW
            gpu.power_limit = None if limit is None else limit / 1000
            energy = self._read(nvml.nvmlDeviceGetTotalEnergyConsumption, h)  # mJ since boot
            gpu.energy = None if energy is None or start is None else (energy - start) / 1000

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:  # shutting down: nothing left to do about it
            log.debug("NVML shutdown: %s", exc)


def _text(value: str | bytes) -> str:
    """nvidia-ml-py returns str; older pynvml releases returned bytes."""
    return value.decode() if isinstance(value, bytes) else value
