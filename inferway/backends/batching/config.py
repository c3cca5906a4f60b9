"""Batching settings of one model (``config.yaml`` -> ``batching:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["BatchingConfig"]


class BatchingConfig(BaseModel):
    """How requests of one model are grouped into batches.

    ``off``: every request runs alone. ``fixed``: wait up to ``max_queue_delay_s`` for
    ``max_batch_size`` rows. ``adaptive``: learn the model's cost per batch size online and wait
    only while waiting still meets ``latency_slo_s``; dispatch at once when an instance is idle
    and waiting would not help.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["off", "fixed", "adaptive"] = "adaptive"
    max_batch_size: int = Field(default=32, ge=1, le=4096)
    max_queue_delay_s: float = Field(default=0.005, ge=0, le=10)
    preferred_batch_sizes: tuple[int, ...] = ()
    latency_slo_s: float = Field(default=0.05, gt=0, le=60)
    max_queue_size: int = Field(default=1024, ge=1)
    max_batch_bytes: int | None = Field(default=None, ge=1)
    instances: int = Field(default=1, ge=1, le=64)
    fill_when_busy: bool = True
    """``adaptive``: while the server's event loop is the bottleneck (busy at least
    ``loop_load.LOOP_BUSY`` of the time), wait for fuller batches within the latency limits."""
    compute_thread: Literal["auto", "worker", "loop"] = "auto"
    """Which thread computes a batch. ``worker``: the instance's own worker thread, while the
    event loop goes on reading and answering. ``loop``: the event loop's thread (no hand-over,
    but nothing is read or answered while the batch runs). ``auto``: the loop's thread for a
    batch predicted to take under ``placement.INLINE_BELOW_S`` (the hand-over would cost as much),
    and, while the process may use one CPU at most (its affinity or cgroup quota:
    ``cpu_allowance``), where a worker thread could only take turns with the loop, for a CPU
    model's batch predicted to take 5-50 ms (``placement.ONE_CPU_INLINE_S``), or to end before
    the next request to any model on the loop; the worker otherwise."""
    wait_for_returns: bool = True
    """``adaptive``: when more clients of answered batches are still on their way back than
    rows are queued, hold the batch until they are expected back (``returns.ReturnWatch``),
    within the latency limits; never with a single client."""

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: object) -> object:
        """YAML 1.1 reads an unquoted ``off`` (or ``no``, ``false``) as the boolean false: that
        can only mean "off". ``on``/``yes``/``true`` name no mode, so say to quote one."""
        if value is False:
            return "off"
        if value is True:
            raise ValueError(
                "YAML read an unquoted on/yes/true as a boolean; give a mode: off, fixed or "
                'adaptive (quote it, e.g. mode: "adaptive")'
            )
        return value

    @model_validator(mode="after")
    def _preferred_within_max(self) -> BatchingConfig:
        too_big = [s for s in self.preferred_batch_sizes if s < 1 or s > self.max_batch_size]
        if too_big:
            raise ValueError(
                f"preferred_batch_sizes {too_big} must lie in 1..max_batch_size "
                f"({self.max_batch_size})"
            )
        return self
