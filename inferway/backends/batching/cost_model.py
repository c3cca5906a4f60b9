"""Online estimates of a model's execution time per batch size and of the arrival rate.

Pure (times are passed in). The cost model keeps an EWMA per observed batch size and a
decayed least-squares fit of ``t(b) = a + c*b`` for sizes never seen, the way BentoML's
optimizer models batch cost; the scheduler asks it whether a bigger batch is worth waiting for.
"""

from __future__ import annotations

import math

__all__ = ["ArrivalRate", "CostModel"]


class CostModel:
    """Execution time (seconds) of one batch as a function of its rows."""

    def __init__(self, *, alpha: float = 0.2, decay: float = 0.98) -> None:
        if not 0 < alpha <= 1 or not 0 < decay <= 1:
            raise ValueError(f"alpha ({alpha}) and decay ({decay}) must lie in (0, 1]")
        self._alpha = alpha
        self._decay = decay
        self._ewma: dict[int, float] = {}
        # decayed sums for weighted least squares: n, sum b, sum b^2, sum t, sum b*t
        self._s0 = self._sb = self._sbb = self._st = self._sbt = 0.0
        self._fit: tuple[float, float] | None = None
        self._fit_stale = False

    @property
    def observations(self) -> int:
        """Number of distinct batch sizes observed so far."""
        return len(self._ewma)

    def observe(self, rows: int, seconds: float) -> None:
        """Record that a batch of ``rows`` took ``seconds`` to execute."""
        if rows < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        old = self._ewma.get(rows)
        self._ewma[rows] = seconds if old is None else old + self._alpha * (seconds - old)
        d = self._decay
        self._s0 = self._s0 * d + 1.0
        self._sb = self._sb * d + rows
        self._sbb = self._sbb * d + rows * rows
        self._st = self._st * d + seconds
        self._sbt = self._sbt * d + rows * seconds
        self._fit_stale = True

    def affine(self) -> tuple[float, float] | None:
        """``(a, c)`` of ``t(b) = a + c*b``, or None before two distinct sizes were seen."""
        if len(self._ewma) < 2:
            return None
        if self._fit_stale or self._fit is None:
            var = self._s0 * self._sbb - self._sb * self._sb
            if var <= 1e-12 * max(1.0, self._s0 * self._sbb):
                return self._fit
            slope = (self._s0 * self._sbt - self._sb * self._st) / var
            slope = max(slope, 0.0)
            intercept = max((self._st - slope * self._sb) / self._s0, 0.0)
            self._fit = (intercept, slope)
            self._fit_stale = False
        return self._fit

    def predict(self, rows: int) -> float | None:
        """Expected seconds for a batch of ``rows``; None while nothing was observed.

        With a single observed size the estimate is pessimistic for bigger batches
        (proportional to rows), so the scheduler never waits on a guess; busy periods, where
        batches grow by themselves, supply the other sizes.
        """
        known = self._ewma.get(rows)
        if known is not None:
            return known
        fit = self.affine()
        if fit is not None:
            return fit[0] + fit[1] * rows
        if not self._ewma:
            return None
        ((size, secs),) = self._ewma.items()
        return secs if rows <= size else secs * rows / size


class ArrivalRate:
    """EWMA of the gaps between arrivals and of rows per arrival."""

    def __init__(self, *, alpha: float = 0.05) -> None:
        self._alpha = alpha
        self._gap: float | None = None
        self._rows = 1.0
        self._last: float | None = None

    @property
    def mean_rows(self) -> float:
        return self._rows

    @property
    def mean_gap(self) -> float | None:
        """Mean seconds between arrivals; None before two arrivals."""
        return self._gap

    def observe(self, rows: int, now: float) -> None:
        last = self._last
        self._last = now
        a = self._alpha
        self._rows += a * (rows - self._rows)
        if last is None:
            return
        gap = now - last if now > last else 0.0
        self._gap = gap if self._gap is None else self._gap + a * (gap - self._gap)

    def expected_wait(self, now: float) -> float:
        """Seconds until the next arrival is expected (inf when unknown).

        Arrivals are treated as memoryless, but a silence longer than the mean gap is taken
        as a sign the rate dropped, so the estimate never falls below the silence so far.
        """
        if self._gap is None or self._last is None:
            return math.inf
        return max(self._gap, now - self._last)
