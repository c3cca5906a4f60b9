"""Old version against new on the same inputs: how far the outputs moved, and how fast each
runs. Pure numerics over two runners; the gate's verdict is made by the caller.

Deviation per output: ``normalized`` is the largest absolute difference divided by the
largest absolute reference value over all cases (an error on the output's own scale: 0.5%
means no element moved more than 0.5% of the output's range); ``max_rel`` is the largest
element-wise relative difference, with the denominator floored at 0.1% of that scale so an
output near zero does not read as infinitely wrong. Non-finite values must match exactly
(NaN for NaN, the same infinity). A rank-2 float output with at least two columns is taken
for a classifier's scores, and the share of rows whose arg-max agrees is reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from inferway.backends.runners.base import Runner
from inferway.tools.optimize.inputs import ValidationCase

__all__ = ["Comparison", "OutputDeviation", "Speed", "compare_runners", "measure_speed"]


@dataclass
class OutputDeviation:
    name: str
    max_abs: float = 0.0
    scale: float = 0.0
    max_rel: float = 0.0
    nonfinite_mismatches: int = 0
    top1_rows: int = 0
    top1_agree: int = 0
    is_classifier: bool = False
    max_abs_by_category: dict[str, float] = field(default_factory=dict)

    def deviation_by_category(self) -> dict[str, float]:
        """Each input category's largest error on the output's (whole-run) scale: which
        kind of input broke the version."""
        scale = self.scale or 1.0
        return {k: v / scale for k, v in sorted(self.max_abs_by_category.items())}

    @property
    def normalized(self) -> float:
        """max |new - old| / max |old|, as a fraction."""
        if self.scale == 0:
            return 0.0 if self.max_abs == 0 else float("inf")
        return self.max_abs / self.scale

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_agree / self.top1_rows if self.is_classifier and self.top1_rows else None


@dataclass
class Comparison:
    cases: int = 0
    rows: int = 0
    categories: dict[str, int] = field(default_factory=dict)
    """Rows per input category."""
    outputs: list[OutputDeviation] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """Cases the new version failed on while the old one answered."""
    skipped: int = 0
    """Cases the old version itself refused (outside what the model accepts)."""


def _update(
    dev: OutputDeviation, category: str, ref: np.ndarray, new: np.ndarray
) -> list[np.ndarray]:
    """Fold one batch into ``dev``; returns the finite parts for the relative pass."""
    if ref.shape != new.shape:
        dev.nonfinite_mismatches += int(ref.size)
        return []
    if ref.dtype.kind not in "fiu" or new.dtype.kind not in "fiu":
        dev.nonfinite_mismatches += int(np.count_nonzero(ref != new))
        return []
    a, b = ref.astype(np.float64), new.astype(np.float64)
    finite = np.isfinite(a)
    same_nonfinite = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
    dev.nonfinite_mismatches += int(np.count_nonzero(~finite & ~same_nonfinite))
    dev.nonfinite_mismatches += int(np.count_nonzero(finite & ~np.isfinite(b)))
    both = finite & np.isfinite(b)
    if both.any():
        worst = float(np.abs(a[both] - b[both]).max())
        dev.max_abs = max(dev.max_abs, worst)
        known = dev.max_abs_by_category.get(category, 0.0)
        dev.max_abs_by_category[category] = max(known, worst)
        dev.scale = max(dev.scale, float(np.abs(a[both]).max()))
    if dev.is_classifier and a.ndim == 2:
        rows = np.all(np.isfinite(a), axis=1) & np.all(np.isfinite(b), axis=1)
        dev.top1_rows += int(rows.sum())
        dev.top1_agree += int((np.argmax(a[rows], 1) == np.argmax(b[rows], 1)).sum())
    return [a[both], b[both]]


def compare_runners(
    old: Runner,
    new: Runner,
    cases: Sequence[ValidationCase],
    progress: Callable[[int, int], None] | None = None,
) -> Comparison:
    """Run every case through both runners and measure how the outputs differ."""
    result = Comparison()
    names = [o.name for o in old.outputs]
    devs = {}
    for spec in old.outputs:
        classifier = spec.datatype.startswith("FP") and len(spec.shape) == 2 and spec.shape[1] > 1
        devs[spec.name] = OutputDeviation(spec.name, is_classifier=classifier)
    pairs: dict[str, list[list[np.ndarray]]] = {n: [] for n in names}
    for i, case in enumerate(cases):
        if progress is not None:
            progress(i, len(cases))
        try:
            ref = old.run(case.feed)
        except Exception:
            result.skipped += 1
            continue
        try:
            out = new.run(case.feed)
        except Exception as e:
            result.failures.append(f"{case.category} ({case.rows} rows): {e}")
            continue
        result.cases += 1
        result.rows += case.rows
        result.categories[case.category] = result.categories.get(case.category, 0) + case.rows
        for name in names:
            if name not in out:
                result.failures.append(f"{case.category}: the new version has no output {name!r}")
                continue
            part = _update(devs[name], case.category, ref[name], out[name])
            if part:
                pairs[name].append(part)
    if progress is not None:
        progress(len(cases), len(cases))
    for name, dev in devs.items():
        floor = max(dev.scale * 1e-3, np.finfo(np.float64).tiny)
        for a, b in pairs[name]:
            if a.size:
                dev.max_rel = max(
                    dev.max_rel, float((np.abs(a - b) / np.maximum(np.abs(a), floor)).max())
                )
    result.outputs = [devs[n] for n in names]
    return result


@dataclass(frozen=True)
class Speed:
    latency_ms_p50: float
    """One row per run, median of ``runs``."""
    throughput_rows_s: float
    """Rows per second at the largest batch."""
    batch: int


def measure_speed(
    runner: Runner, one_row: dict[str, np.ndarray], full: dict[str, np.ndarray], runs: int
) -> Speed:
    """Latency of one row and throughput of a full batch, after one warm-up run of each.
    Measured old and new alike in one process, so the ratio means more than either number."""
    runner.run(one_row)
    runner.run(full)
    laps = []
    for _ in range(runs):
        start = time.perf_counter()
        runner.run(one_row)
        laps.append(time.perf_counter() - start)
    rows = next(iter(full.values())).shape[0]
    start = time.perf_counter()
    for _ in range(runs):
        runner.run(full)
    elapsed = time.perf_counter() - start
    return Speed(
        latency_ms_p50=statistics.median(laps) * 1000,
        throughput_rows_s=rows * runs / elapsed if elapsed > 0 else float("inf"),
        batch=rows,
    )
