"""Triton's CPU metrics (from /proc) and GPU metrics (through nvidia-ml-py, where a GPU is present),
polled every ``--metrics-interval-ms`` on the model owner's event loop."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric

log = logging.getLogger("triton_serve._engine.metrics")

_CPU = (("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "utilization"),
        ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "memory_total"),
        ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "memory_used"))
# (family, help, type, field of a GPU sample)
_GPU = (("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge", "utilization"),
        ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge", "memory_total"),
        ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge", "memory_used"),
        ("nv_gpu_power_usage", "GPU power usage in watts", "gauge", "power_usage"),
        ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge", "power_limit"),
        ("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", "counter",
         "energy"))


def read_cpu_times(path: Path = Path("/proc/stat")) -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, counted as Triton counts them."""
    fields = [int(v) for v in path.read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def read_memory(path: Path = Path("/proc/meminfo")) -> tuple[int, int]:
    """(total, used) bytes of RAM; used is total less available, as Triton reports it."""
    info = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            info[name] = int(parts[0]) * 1024
    total = info["MemTotal"]
    return total, total - info["MemAvailable"]


class GpuReader:
    """NVML through nvidia-ml-py (import pynvml); ``open()`` returns None without a GPU or the package."""

    def __init__(self, nvml: Any, handles: list[tuple[str, Any]]) -> None:
        self.nvml = nvml
        self.handles = handles
        self.start_energy: dict[str, float] = {}

    @classmethod
    def open(cls) -> GpuReader | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            handles = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                handles.append((uuid.decode() if isinstance(uuid, bytes) else uuid, handle))
        except Exception as error:  # no driver, no device: no GPU metrics, as in Triton's CPU builds
            log.info("GPU metrics are off: %s", error)
            return None
        if not handles:
            return None
        return cls(pynvml, handles)

    def read(self) -> dict[str, dict[str, float]]:
        """Per GPU UUID: each field of _GPU (absent where the device does not report it)."""
        nvml = self.nvml
        samples: dict[str, dict[str, float]] = {}
        for uuid, handle in self.handles:
            sample: dict[str, float] = {}
            with contextlib.suppress(Exception):
                sample["utilization"] = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
            with contextlib.suppress(Exception):
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                sample["memory_total"], sample["memory_used"] = float(memory.total), float(memory.used)
            with contextlib.suppress(Exception):
                sample["power_usage"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000
            with contextlib.suppress(Exception):
                sample["power_limit"] = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000
            with contextlib.suppress(Exception):
                joules = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000
                sample["energy"] = joules - self.start_energy.setdefault(uuid, joules)
            samples[uuid] = sample
        return samples

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


class SystemSampler:
    """Polls CPU and GPU figures every ``interval_s`` (Triton: ``--metrics-interval-ms``); a scrape
    reports the latest poll. A family appears once its first poll has a value."""

    def __init__(self, cpu: bool, gpu: bool, interval_s: float) -> None:
        self.cpu = cpu
        self.gpu = GpuReader.open() if gpu else None
        self.interval_s = interval_s
        self.cpu_values: dict[str, float] = {}
        self.gpu_values: dict[str, dict[str, float]] = {}
        self._last_cpu: tuple[int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.cpu or self.gpu is not None:
            self.poll()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.gpu is not None:
            self.gpu.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.poll()
            except Exception:  # a metrics poll must never stop the server
                log.exception("polling CPU/GPU metrics failed")

    def poll(self) -> None:
        if self.cpu:
            with contextlib.suppress(OSError, KeyError, ValueError):
                total, used = read_memory()
                self.cpu_values["memory_total"], self.cpu_values["memory_used"] = total, used
            with contextlib.suppress(OSError, ValueError):
                busy, all_time = read_cpu_times()
                if self._last_cpu is not None and all_time > self._last_cpu[1]:
                    self.cpu_values["utilization"] = (busy - self._last_cpu[0]) / (all_time - self._last_cpu[1])
                self._last_cpu = (busy, all_time)
        if self.gpu is not None:
            self.gpu_values = self.gpu.read()

    def collect(self) -> Iterator[Metric]:
        if self.gpu is not None:
            for name, help_text, kind, key in _GPU:
                metric = Metric(name, help_text, kind)
                for uuid, sample in self.gpu_values.items():
                    if key in sample:
                        metric.add_sample(name, {"gpu_uuid": uuid}, sample[key])
                yield metric
        if self.cpu:
            for name, help_text, key in _CPU:
                metric = Metric(name, help_text, "gauge")
                if key in self.cpu_values:
                    metric.add_sample(name, {}, self.cpu_values[key])
                yield metric
