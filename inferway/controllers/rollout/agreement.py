"""Output agreement for mirrored requests: does the canary answer what stable answers, for
the same input, within a numeric tolerance? Pure: digests in, MirrorCounts out.

Both versions' backends record a digest of each answer by ``x-request-id``
(``backends/telemetry/output_digest.py``); Envoy's mirror keeps the id on the canary's
copy. :class:`AgreementMatcher` pairs digests of the same id as they arrive from the two
tables, in any order: a pair is compared once, when its second half arrives. A digest whose
partner never comes (the canary's own weighted traffic, a mirror Envoy dropped) waits in a
bounded pending set and is evicted oldest first, never counted.

Two answers agree when they have the same outputs (by name) with the same shapes and
datatypes, and every summarized number matches within ``atol + rtol * |stable|``
(``numpy.isclose``'s rule); the sum and sum of squares are compared with the tolerance
scaled by the tensor's size, since errors add up. Text outputs must hash the same.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from inferway.controllers.rollout.evidence import MirrorCounts

__all__ = [
    "AgreementMatcher",
    "Disagreement",
    "OutputDigest",
    "TensorDigest",
    "Tolerance",
    "compare_outputs",
]


class TensorDigest(Protocol):
    """One output tensor as a backend summarized it (``backends/telemetry/output_digest.py``
    records it; the controller only reads it, so it names the fields it needs, not the type)."""

    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def head(self) -> tuple[float, ...]: ...
    @property
    def total(self) -> float: ...
    @property
    def sum_squares(self) -> float: ...
    @property
    def minimum(self) -> float: ...
    @property
    def maximum(self) -> float: ...
    @property
    def text_hash(self) -> str | None: ...


class OutputDigest(Protocol):
    """Every output of one answer, by the request id Envoy's mirror keeps."""

    @property
    def request_id(self) -> str: ...
    @property
    def outputs(self) -> tuple[TensorDigest, ...]: ...


@dataclass(frozen=True, slots=True)
class Tolerance:
    """``numpy.isclose``'s rule: |canary - stable| <= atol + rtol * |stable|."""

    atol: float = 1e-5
    rtol: float = 1e-3

    def __post_init__(self) -> None:
        if not (self.atol >= 0 and self.rtol >= 0):
            raise ValueError(f"tolerances must be >= 0, got atol={self.atol}, rtol={self.rtol}")

    def close(self, stable: float, canary: float, scale: float = 1.0) -> bool:
        if math.isnan(stable) or math.isnan(canary):
            return math.isnan(stable) and math.isnan(canary)
        return abs(canary - stable) <= scale * self.atol + self.rtol * abs(stable)


@dataclass(frozen=True, slots=True)
class Disagreement:
    """Why one pair differed, for the verdict's explanation."""

    request_id: str
    reason: str


def _compare_tensor(stable: TensorDigest, canary: TensorDigest, tol: Tolerance) -> str | None:
    name = stable.name
    if (stable.datatype, stable.shape) != (canary.datatype, canary.shape):
        return (
            f"output {name}: {canary.datatype}{list(canary.shape)} instead of "
            f"{stable.datatype}{list(stable.shape)}"
        )
    if stable.text_hash is not None or canary.text_hash is not None:
        return None if stable.text_hash == canary.text_hash else f"output {name}: text differs"
    if len(stable.head) != len(canary.head):
        return f"output {name}: {len(canary.head)} leading values instead of {len(stable.head)}"
    for i, (a, b) in enumerate(zip(stable.head, canary.head, strict=True)):
        if not tol.close(a, b):
            return f"output {name}[{i}]: {b:g} instead of {a:g}"
    size = max(1, math.prod(stable.shape))
    for what, a, b, scale in (
        ("min", stable.minimum, canary.minimum, 1.0),
        ("max", stable.maximum, canary.maximum, 1.0),
        ("sum", stable.total, canary.total, float(size)),
        ("sum of squares", stable.sum_squares, canary.sum_squares, float(size)),
    ):
        if not tol.close(a, b, scale):
            return f"output {name} {what}: {b:g} instead of {a:g}"
    return None


def compare_outputs(
    stable: OutputDigest, canary: OutputDigest, tol: Tolerance | None = None
) -> Disagreement | None:
    """None when the canary's answer agrees with stable's; else the first difference."""
    tol = tol or Tolerance()
    mine = {t.name: t for t in canary.outputs}
    theirs = {t.name: t for t in stable.outputs}
    if set(mine) != set(theirs):
        return Disagreement(
            stable.request_id,
            f"outputs {sorted(mine)} instead of {sorted(theirs)}",
        )
    for name, tensor in theirs.items():
        reason = _compare_tensor(tensor, mine[name], tol)
        if reason is not None:
            return Disagreement(stable.request_id, reason)
    return None


@dataclass(slots=True)
class AgreementMatcher:
    """Pairs stable and canary digests by request id across polls. ``take()`` returns the
    counts since the last take (a WindowSample's ``mirror``) and the disagreements seen."""

    tolerance: Tolerance = field(default_factory=Tolerance)
    capacity: int = 20_000
    """Unpaired digests kept per side; the oldest go first."""
    max_examples: int = 5
    unpaired_evicted: int = 0
    _stable: OrderedDict[str, OutputDigest] = field(default_factory=OrderedDict)
    _canary: OrderedDict[str, OutputDigest] = field(default_factory=OrderedDict)
    _counts: MirrorCounts = field(default_factory=MirrorCounts)
    _examples: list[Disagreement] = field(default_factory=list)

    def add_stable(self, digests: Iterable[OutputDigest]) -> None:
        for digest in digests:
            self._add(digest, self._stable, self._canary, stable_side=True)

    def add_canary(self, digests: Iterable[OutputDigest]) -> None:
        for digest in digests:
            self._add(digest, self._canary, self._stable, stable_side=False)

    def take(self) -> tuple[MirrorCounts, list[Disagreement]]:
        counts, examples = self._counts, self._examples
        self._counts, self._examples = MirrorCounts(), []
        return counts, examples

    @property
    def pending(self) -> int:
        return len(self._stable) + len(self._canary)

    def _add(
        self,
        digest: OutputDigest,
        mine: OrderedDict[str, OutputDigest],
        other: OrderedDict[str, OutputDigest],
        *,
        stable_side: bool,
    ) -> None:
        partner = other.pop(digest.request_id, None)
        if partner is None:
            mine.pop(digest.request_id, None)
            mine[digest.request_id] = digest
            while len(mine) > self.capacity:
                mine.popitem(last=False)
                self.unpaired_evicted += 1
            return
        stable, canary = (digest, partner) if stable_side else (partner, digest)
        verdict = compare_outputs(stable, canary, self.tolerance)
        self._counts.compared += 1
        if verdict is not None:
            self._counts.disagreed += 1
            if len(self._examples) < self.max_examples:
                self._examples.append(verdict)
