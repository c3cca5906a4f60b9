"""Closed-loop clients coming back: how many answered clients are still out, and when they return.

Most callers of a served model are closed loops: a client sends a request, waits for its
answer, and sends the next one. When a batch of ``n`` is answered, those ``n`` clients tend to
come back within a return gap (the client's own work, a reconnect, its thread waking under
its GIL) that the server can observe. Without that knowledge the first request back finds an
idle instance alone and runs as a batch of one, and so does the next: under one-at-a-time
arrivals most batches are one row, and every row pays a batch's fixed cost. The scheduler
asks this watch how many clients are owed and when the last answered batch's clients should
be back, and holds the next batch until then (``Scheduler``: bounded by the latency limits).

Pure bookkeeping on a caller's clock. A request is not tagged with its client, so an arrival
is matched to the latest answer still owed (last in, first out). Not the oldest: clients that
left (a load that dropped from many clients to one, an open-loop stream's senders) would then
never be forgotten, since each new arrival would pay off an old debt and leave its own answer
owed, and the gap learned from those old answers would grow, and the horizon with it. Matched
to the latest, an answered client not back after ``HORIZON_GAPS`` return gaps stops being
owed, so a stale count cannot hold batches for long; and every hold is bounded anyway.
"""

from __future__ import annotations

from collections import deque

__all__ = ["HORIZON_GAPS", "ReturnWatch"]

HORIZON_GAPS = 4.0
"""An answered client not back after this many (high) return gaps is no longer expected."""
_MIN_HORIZON_S = 0.001
_MAX_HORIZON_S = 1.0
_SPREAD = 2.0
"""The expected return is the mean gap plus this many mean deviations: most clients are back."""


class ReturnWatch:
    """Answered clients not yet back (``owed``) and the gap from answer to return (EWMA)."""

    def __init__(self, *, alpha: float = 0.05) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha ({alpha}) must lie in (0, 1]")
        self._alpha = alpha
        self._answers: deque[list[float]] = deque()  # [answered at, clients still out]
        self._owed = 0
        self._gap: float | None = None
        self._dev = 0.0

    @property
    def gap(self) -> float | None:
        """Mean seconds from an answer to its client's next request; None before one return."""
        return self._gap

    def high_gap(self) -> float | None:
        """A return gap most clients stay within (mean plus spread); None before one return."""
        if self._gap is None:
            return None
        return self._gap + _SPREAD * self._dev

    def answered(self, clients: int, now: float) -> None:
        """``clients`` requests were answered at ``now``: their clients are expected back."""
        if clients < 1:
            return
        answers = self._answers
        if answers and answers[-1][0] == now:
            answers[-1][1] += clients
        else:
            answers.append([now, float(clients)])
        self._owed += clients

    def arrived(self, now: float) -> None:
        """A request arrived at ``now``: one owed client came back (the latest answer's)."""
        self._forget(now)
        answers = self._answers
        if not answers:
            return
        latest = answers[-1]
        gap = now - latest[0] if now > latest[0] else 0.0
        latest[1] -= 1
        if latest[1] <= 0:
            answers.pop()
        self._owed -= 1
        mean = self._gap
        if mean is None:
            self._gap = gap
            return
        a = self._alpha
        self._dev += a * (abs(gap - mean) - self._dev)
        self._gap = mean + a * (gap - mean)

    def owed(self, now: float) -> int:
        """Answered clients expected back and not back yet."""
        self._forget(now)
        return self._owed

    def expected_back(self, now: float) -> float | None:
        """When the clients of the latest answer still owed should be back (None: nobody is
        owed, or no return was seen yet to learn the gap from)."""
        self._forget(now)
        high = self.high_gap()
        if high is None or not self._answers:
            return None
        return self._answers[-1][0] + high

    def _forget(self, now: float) -> None:
        """Stop expecting clients answered longer ago than the horizon."""
        answers = self._answers
        if not answers:
            return
        high = self.high_gap()
        horizon = _MAX_HORIZON_S if high is None else HORIZON_GAPS * high
        horizon = min(max(horizon, _MIN_HORIZON_S), _MAX_HORIZON_S)
        cutoff = now - horizon
        while answers and answers[0][0] < cutoff:
            self._owed -= int(answers.popleft()[1])
        if not answers:
            self._owed = 0
