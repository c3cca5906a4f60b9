"""Mixture-of-experts gating, in numpy: which experts each row goes to, and how their outputs
combine. Pure, so the routing is unit tested on its own; the executor runs the experts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["Routing", "combine_experts", "route_top_k"]


@dataclass(frozen=True, slots=True)
class Routing:
    """``chosen`` [rows, k]: the expert indices of each row, best first; ``weights`` [rows, k]:
    their normalised weights (each row sums to 1)."""

    chosen: np.ndarray
    weights: np.ndarray

    def rows_of(self, expert: int) -> np.ndarray:
        """The rows routed to ``expert``, ascending."""
        return np.flatnonzero((self.chosen == expert).any(axis=1))

    def weight_of(self, expert: int, rows: np.ndarray) -> np.ndarray:
        """The weight ``expert`` has in each of ``rows``."""
        weights: np.ndarray = (self.weights[rows] * (self.chosen[rows] == expert)).sum(axis=1)
        return weights


def route_top_k(scores: np.ndarray, k: int, weights: str = "softmax") -> Routing:
    """The ``k`` highest-scoring experts per row of ``scores`` [rows, experts]. ``softmax``
    normalises the chosen scores as logits (Mixtral's gating); ``sum`` divides by their sum
    (scores that already are non-negative weights; all zeros share equally). Ties go to the
    lower index, so routing is deterministic."""
    if scores.ndim != 2:
        raise ValueError(f"router scores must be [rows, experts], got shape {list(scores.shape)}")
    experts = scores.shape[1]
    if not 1 <= k <= experts:
        raise ValueError(f"top_k {k} must lie in 1..{experts} (the router's experts)")
    s = scores.astype(np.float64, copy=False)
    # stable sort of the negated scores: equal scores keep index order
    chosen = np.argsort(-s, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(s, chosen, axis=1)
    if weights == "softmax":
        e = np.exp(top - top.max(axis=1, keepdims=True))
        w = e / e.sum(axis=1, keepdims=True)
    elif weights == "sum":
        if (top < 0).any():
            raise ValueError("weights: sum needs non-negative router scores")
        total = top.sum(axis=1, keepdims=True)
        w = np.where(total > 0, top / np.where(total > 0, total, 1.0), 1.0 / k)
    else:
        raise ValueError(f"unknown weights {weights!r}: softmax or sum")
    return Routing(chosen=chosen.astype(np.int64), weights=w)


def combine_experts(
    routing: Routing, outputs: Mapping[int, tuple[np.ndarray, np.ndarray]], rows: int
) -> np.ndarray:
    """Sum each expert's output rows weighted by its routing weight. ``outputs``: expert ->
    (the rows it ran on, its output for them); experts given no rows are absent."""
    if not outputs:
        raise ValueError("no expert ran: the routing chose none")
    sample = next(iter(outputs.values()))[1]
    combined = np.zeros((rows, *sample.shape[1:]), dtype=sample.dtype)
    for expert, (expert_rows, out) in outputs.items():
        w = routing.weight_of(expert, expert_rows).astype(sample.dtype)
        combined[expert_rows] += w.reshape(-1, *([1] * (out.ndim - 1))) * out
    return combined
