"""Per model version totals in the shape of Triton's statistics extension.

Triton's tools (``perf_analyzer``, ``tritonclient``'s ``get_inference_statistics``) read
cumulative counts and nanosecond totals and work out averages from the difference between
two readings, so these are plain running sums since the server started, never windows.
Fed from the same two places as the Prometheus metrics: every answered request (success or
failure, end to end) and every batch the executor ran (queue wait per request, compute per
batch). A batch's compute is one duration (concatenate, run, split): it is reported as
``compute_infer``; ``compute_input`` and ``compute_output`` carry the same counts with 0 ns.
Per process: with ``serve --workers N`` each worker answers for the requests it served.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from inferway.backends.batching.records import BatchRecord

__all__ = ["Duration", "InferenceStatistics", "VersionStatistics"]


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


@dataclass(slots=True)
class Duration:
    """How many times something happened and how long it took in total."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += _ns(seconds)

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class VersionStatistics:
    """The running totals of one model version."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute: Duration = field(default_factory=Duration)
    """Per request: each request counted once with its batch's compute time."""
    batches: dict[int, Duration] = field(default_factory=dict)
    """Batch size (rows) -> executions of that size and their compute time."""
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0

    def as_dict(self, name: str, version: str) -> dict[str, Any]:
        """Triton's ``ModelStatistics`` as JSON (the HTTP answer; gRPC parses the same)."""
        compute_count = {"count": self.compute.count, "ns": 0}
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": compute_count,
                "compute_infer": self.compute.as_dict(),
                "compute_output": compute_count,
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": {"count": d.count, "ns": 0},
                    "compute_infer": d.as_dict(),
                    "compute_output": {"count": d.count, "ns": 0},
                }
                for size, d in sorted(self.batches.items())
            ],
            "memory_usage": [],
            "response_stats": {},
        }


class InferenceStatistics:
    """Every model version's totals; cheap enough for the per-request path (no locks: the
    event loop calls it, batch records arrive on the loop too)."""

    def __init__(self) -> None:
        self._versions: dict[tuple[str, str], VersionStatistics] = {}

    def _of(self, model: str, version: str) -> VersionStatistics:
        stats = self._versions.get((model, version))
        if stats is None:
            stats = self._versions[(model, version)] = VersionStatistics()
        return stats

    def observe_request(self, model: str, version: str, ok: bool, seconds: float) -> None:
        """One answered request, end to end."""
        stats = self._of(model, version)
        (stats.success if ok else stats.fail).add(seconds)

    def observe_batch(self, model: str, version: str, record: BatchRecord) -> None:
        """One executed batch; a failed one counts only its requests' queue time."""
        stats = self._of(model, version)
        for wait in record.queue_wait_s:
            stats.queue.add(wait)
        if record.error is not None:
            return
        stats.compute.add(record.compute_s * record.requests, record.requests)
        batch = stats.batches.get(record.size_rows)
        if batch is None:
            batch = stats.batches[record.size_rows] = Duration()
        batch.add(record.compute_s)
        stats.inference_count += record.size_rows
        stats.execution_count += 1
        stats.last_inference_ms = int(time.time() * 1000)

    def get(self, model: str, version: str) -> VersionStatistics:
        """The totals of one version (all zero when it has served nothing yet)."""
        return self._versions.get((model, version)) or VersionStatistics()
