"""Where a model's batches run: on the event loop's thread or on worker threads.

A worker thread per instance lets the event loop go on reading and answering while a batch
computes: the right thing wherever the batch and the loop can run at the same time (a GPU
model, a CPU model with cores to spare, several instances). In a process allowed one CPU, a
CPU model's batch and the loop share that core anyway; a worker thread then only adds two
hand-offs per batch (the GIL and a wake-up each way), and it starts a batch while requests
that have already arrived are still unread. Run on the loop instead, a batch is formed once
the loop has read every ready socket (the executor defers its decision to the end of the
loop's pass), and runs to completion before the next pass: fuller batches, fewer switches.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..runners.base import Runner
from .config import BatchingConfig

__all__ = ["CPU_PROVIDER", "allowed_cpus", "batches_on_loop", "placement_reason"]

CPU_PROVIDER = "CPUExecutionProvider"
"""The ``provider`` of a runner that computes on the host's CPU."""


def allowed_cpus() -> int:
    """CPUs this process may run on (its affinity mask; the CPU count where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def batches_on_loop(config: BatchingConfig, runners: Sequence[Runner], cpus: int) -> bool:
    """Whether batches run on the event loop's thread (see the module's docstring)."""
    if config.compute_on != "auto":
        return config.compute_on == "loop"
    return len(runners) == 1 and cpus == 1 and _on_cpu(runners)


def _on_cpu(runners: Sequence[Runner]) -> bool:
    return all(getattr(r, "provider", None) == CPU_PROVIDER for r in runners)


def placement_reason(config: BatchingConfig, runners: Sequence[Runner], cpus: int) -> str:
    """One line on where batches run and why, for the log."""
    on_loop = batches_on_loop(config, runners, cpus)
    where = "on the event loop" if on_loop else "on worker threads"
    if config.compute_on != "auto":
        return f"batches run {where} (compute_on: {config.compute_on})"
    if on_loop:
        return f"batches run {where} (compute_on: auto; one CPU instance, 1 CPU allowed)"
    if len(runners) > 1:
        why = f"{len(runners)} instances"
    elif not _on_cpu(runners):
        why = f"provider {getattr(runners[0], 'provider', 'unknown')}"
    else:
        why = f"{cpus} CPUs allowed"
    return f"batches run {where} (compute_on: auto; {why})"
