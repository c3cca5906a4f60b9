"""The activation test: are the pools' observed shares of the traffic the shares the policy
gives them? Pearson's chi-square (scipy.stats.chisquare) on the counts, with the usual
validity rule that every expected count is at least 5; fewer requests than that give no
verdict rather than a false one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["MIN_EXPECTED", "ChiSquare", "chi_square"]

MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class ChiSquare:
    observed: dict[str, int]
    expected: dict[str, float]
    statistic: float | None
    p_value: float | None
    dof: int
    alpha: float
    note: str = ""
    """Why no test was run (one pool only, too few requests), else ""."""

    @property
    def ok(self) -> bool | None:
        """True: consistent with the policy at ``alpha``; False: not; None: not tested."""
        return None if self.p_value is None else self.p_value >= self.alpha


def chi_square(
    observed: Mapping[str, int], expected: Mapping[str, float], *, alpha: float
) -> ChiSquare:
    """``expected``: counts per pool adding up to the observed total (pools of share 0 left
    out: a request there is a routing error, counted as such, not a frequency)."""
    cells = sorted(k for k, v in expected.items() if v > 0)
    obs = {k: int(observed.get(k, 0)) for k in cells}
    exp = {k: float(expected[k]) for k in cells}
    dof = max(0, len(cells) - 1)
    if len(cells) < 2:
        return ChiSquare(obs, exp, None, None, dof, alpha, "one pool: nothing to compare")
    smallest = min(exp.values())
    if smallest < MIN_EXPECTED:
        note = f"too few requests: an expected count is {smallest:.1f} (< {MIN_EXPECTED:g})"
        return ChiSquare(obs, exp, None, None, dof, alpha, note)
    from scipy.stats import chisquare

    result = chisquare([obs[k] for k in cells], [exp[k] for k in cells])
    return ChiSquare(obs, exp, float(result.statistic), float(result.pvalue), dof, alpha)
