"""Interpreter settings for a process whose main job is serving models.

The event loop thread decodes requests while worker threads run the model; a worker returning
from ONNX Runtime must take the GIL back before it can hand its batch over. With CPython's
default 5 ms switch interval a busy loop keeps it waiting for up to that long after every
batch, which for a small model is ten times the compute itself. 0.5 ms measured best on the
2-core benchmark machine (tiny model +20% throughput, heavy model +9%; docs/benchmarks-history.md).

Once the models are loaded and the listeners open, the heap holds a few hundred thousand
objects that live as long as the process (modules, the models' sessions, metrics, pydantic
models). CPython's cyclic collector walks all of them in every full collection, which the
growth of per-connection state under load triggers: 70-odd ms pauses in the middle of serving,
measured under 1,000 locust users (docs/benchmarks-history.md). ``freeze_startup_heap`` moves
them out of the collector's sight (``gc.freeze``, as pre-fork servers do); what is created
later is collected as usual.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["SERVING_SWITCH_INTERVAL_S", "freeze_startup_heap", "tune_for_serving"]

SERVING_SWITCH_INTERVAL_S = 0.0005


def tune_for_serving(switch_interval_s: float = SERVING_SWITCH_INTERVAL_S) -> float:
    """Set the GIL switch interval for serving; returns the previous value. Process-wide, so
    only the process's owner (``inferway serve``, a benchmark server) calls it."""
    if not 0 < switch_interval_s <= 1:
        raise ValueError(f"switch interval must lie in (0, 1] seconds, got {switch_interval_s}")
    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval_s)
    return previous


def freeze_startup_heap() -> int:
    """Collect once, then exclude every object alive now from later collections; returns how
    many were frozen. Call when start-up is done (models loaded, listeners open)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
