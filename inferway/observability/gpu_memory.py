"""GPU memory gauges for a backend's /metrics, read through NVML when a GPU is visible.

NVML (the ``pynvml`` module of the ``nvidia-ml-py`` package) is optional: without it, or
without a visible NVIDIA GPU, the collector yields nothing, so a CPU-only backend exports no
GPU series at all (an alert on them then never fires) rather than a misleading zero.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["GpuMemory", "GpuMemoryCollector", "read_gpu_memory"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuMemory:
    index: int
    used_bytes: int
    total_bytes: int


def _load_nvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no GPU: NVMLError_LibraryNotFound, ...
        _log.debug("NVML unavailable, no GPU memory metrics: %s", exc)
        return None
    return pynvml


def read_gpu_memory(nvml: Any) -> list[GpuMemory]:
    """Memory of every GPU NVML sees; an empty list when none is."""
    gpus = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        info = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(index))
        gpus.append(GpuMemory(index, int(info.used), int(info.total)))
    return gpus


class GpuMemoryCollector(Collector):
    """``inferway_backend_gpu_memory_used_bytes`` / ``_total_bytes`` per GPU, read on scrape.

    ``read`` defaults to NVML (loaded once, lazily); pass one to test the exposition."""

    def __init__(self, read: Callable[[], Sequence[GpuMemory]] | None = None) -> None:
        self._read = read
        self._nvml: Any | None = None
        self._nvml_tried = False

    def _gpus(self) -> Sequence[GpuMemory]:
        if self._read is not None:
            return self._read()
        if not self._nvml_tried:
            self._nvml_tried = True
            self._nvml = _load_nvml()
        if self._nvml is None:
            return ()
        try:
            return read_gpu_memory(self._nvml)
        except Exception as exc:  # a GPU falling off the bus must not break /metrics
            _log.warning("reading GPU memory through NVML failed: %s", exc)
            return ()

    def collect(self) -> Iterator[Metric]:
        gpus = self._gpus()
        if not gpus:
            return
        used = GaugeMetricFamily(
            "inferway_backend_gpu_memory_used_bytes",
            "GPU memory in use (all processes), as NVML reports it.",
            labels=["gpu"],
        )
        total = GaugeMetricFamily(
            "inferway_backend_gpu_memory_total_bytes",
            "GPU memory installed, as NVML reports it.",
            labels=["gpu"],
        )
        for gpu in gpus:
            used.add_metric([str(gpu.index)], float(gpu.used_bytes))
            total.add_metric([str(gpu.index)], float(gpu.total_bytes))
        yield used
        yield total

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected lazily; nothing to check at registration
