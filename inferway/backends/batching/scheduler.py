"""The batching decision, as a pure state machine: requests in, batches out, time passed in.

The executor owns the clock, threads and futures; this module only decides which queued
requests run together and when. Rules, in order:

- a request whose deadline passed is dropped (``expire``) and never dispatched;
- only requests with equal ``shape_key`` share a batch, in arrival order (FIFO per group);
  across groups the one with the oldest head goes first, so no group starves;
- a batch holds at most ``max_batch_size`` rows and ``max_batch_bytes`` bytes;
- ``off`` dispatches each request alone; ``fixed`` waits up to ``max_queue_delay_s`` for a
  full batch, or dispatches a preferred size as soon as one can be formed; ``adaptive`` waits
  only while the learned cost model says a bigger batch both improves throughput and still
  meets ``latency_slo_s`` (never longer than ``max_queue_delay_s``), and otherwise dispatches
  at once, so a lone request pays no batching latency;
- ``adaptive`` while the event loop is the bottleneck (``loop_busy`` at least ``LOOP_BUSY``,
  set by the executor; ``fill_when_busy``): an idle instance costs nothing then, but every
  batch costs the loop a dispatch and a settle (and a CPU model's compute takes cores from
  the loop), so with two or more requests queued it waits for more rows as long as requests
  keep arriving and the same latency limits hold;
- ``adaptive`` with closed-loop clients (``wait_for_returns``): when fewer rows are queued than
  clients of answered batches are still out (``ReturnWatch``), the batch is held until those
  clients are expected back, within the same latency limits. One client never waits: its own
  request is the one queued, and nobody else is owed.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from .config import BatchingConfig
from .cost_model import ArrivalRate, CostModel
from .errors import InvalidRequestError, QueueFullError
from .loop_load import LOOP_BUSY
from .records import IDLE, Dispatch, Idle, Pending, RequestState, WaitUntil
from .returns import ReturnWatch

__all__ = ["Scheduler"]

RequestT = TypeVar("RequestT", bound=Pending)
"""The request record a caller queues: ``Pending`` or a subclass carrying its own fields."""

_QUEUED = RequestState.QUEUED
_COMPUTE_SAFETY = 1.25  # predicted compute time is inflated by this before an SLO check
_GAIN = 1.02  # waiting must improve throughput by at least this factor
_MIN_WAIT = 1e-4  # never ask to be woken sooner than this: avoids spinning on bursts
_SILENCE = 2.0  # filling stops once no request came for this many mean gaps
_MIN_OWED = 4  # wait_for_returns: fewer clients out than this are not worth holding a batch for


class Scheduler(Generic[RequestT]):
    """Per-model batching queue. Not thread-safe: drive it from one task."""

    def __init__(
        self,
        config: BatchingConfig,
        cost_model: CostModel | None = None,
        *,
        instances: int | None = None,
        arrivals: ArrivalRate | None = None,
        name: str = "",
    ) -> None:
        self.config = config
        self.cost_model = cost_model if cost_model is not None else CostModel()
        self.arrivals = arrivals if arrivals is not None else ArrivalRate()
        self.instances = instances if instances is not None else config.instances
        self.name = name
        self._max_rows = config.max_batch_size
        self._max_bytes = config.max_batch_bytes
        self._preferred = frozenset(config.preferred_batch_sizes)
        self._groups: dict[Hashable, deque[RequestT]] = {}
        self._by_id: dict[Hashable, RequestT] = {}
        self._deadlines: list[tuple[float, int, RequestT]] = []
        self._expired: list[RequestT] = []
        self._seq = 0
        self._queued_rows = 0
        self.loop_busy = 0.0
        """The event loop's busy share (``LoopLoad``), kept current by the executor."""
        self.filled = 0
        """Waits chosen because the loop was busy (the ``fill_when_busy`` rule)."""
        self.returns = ReturnWatch()
        """Answered clients not back yet, and their return gap (``wait_for_returns``)."""
        self._hold = config.mode == "adaptive" and config.wait_for_returns
        self.held = 0
        """Waits chosen for answered clients to come back (the ``wait_for_returns`` rule)."""

    # -- queue ---------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Requests waiting (not dispatched, expired or cancelled)."""
        return len(self._by_id)

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def __len__(self) -> int:
        return len(self._by_id)

    def submit(self, req: RequestT, now: float) -> None:
        """Queue ``req``; raises QueueFullError (with a retry-after) or InvalidRequestError."""
        if req.rows < 1:
            raise InvalidRequestError(f"request {req.id!r}: rows must be >= 1, got {req.rows}")
        if req.rows > self._max_rows:
            raise InvalidRequestError(
                f"request {req.id!r}: {req.rows} rows exceed max_batch_size {self._max_rows}"
            )
        if self._max_bytes is not None and req.nbytes > self._max_bytes:
            raise InvalidRequestError(
                f"request {req.id!r}: {req.nbytes} bytes exceed max_batch_bytes {self._max_bytes}"
            )
        if req.id in self._by_id:
            raise InvalidRequestError(f"request id {req.id!r} is already queued")
        if len(self._by_id) >= self.config.max_queue_size:
            raise QueueFullError(
                self.retry_after(now), queue_size=len(self._by_id), model=self.name
            )
        self._seq += 1
        req.seq = self._seq
        req.state = _QUEUED
        self._by_id[req.id] = req
        self._queued_rows += req.rows
        group = self._groups.get(req.shape_key)
        if group is None:
            self._groups[req.shape_key] = group = deque()
        group.append(req)
        if req.deadline is not None:
            heapq.heappush(self._deadlines, (req.deadline, req.seq, req))
        self.arrivals.observe(req.rows, now)
        if self._hold:
            self.returns.arrived(now)

    def cancel(self, req_id: Hashable) -> RequestT | None:
        """Withdraw a queued request; returns it, or None if it is no longer queued."""
        req = self._by_id.pop(req_id, None)
        if req is None:
            return None
        req.state = RequestState.CANCELLED
        self._queued_rows -= req.rows
        return req

    def clear(self) -> list[RequestT]:
        """Withdraw every queued request (as cancelled), oldest first; used on shutdown."""
        out = sorted(self._by_id.values(), key=lambda r: r.seq)
        for req in out:
            req.state = RequestState.CANCELLED
        self._by_id.clear()
        self._groups.clear()
        self._deadlines.clear()
        self._queued_rows = 0
        return out

    def expire(self, now: float) -> list[RequestT]:
        """Remove and return every queued request whose deadline is at or before ``now``."""
        heap = self._deadlines
        out = self._expired
        while heap and heap[0][0] <= now:
            req = heapq.heappop(heap)[2]
            if req.state is _QUEUED:
                req.state = RequestState.EXPIRED
                del self._by_id[req.id]
                self._queued_rows -= req.rows
                out.append(req)
        if len(heap) > 2 * len(self._by_id) + 64:
            self._deadlines = [e for e in heap if e[2].state is _QUEUED]
            heapq.heapify(self._deadlines)
        if not out:
            return []
        self._expired = []
        return out

    def retry_after(self, now: float) -> float:
        """Seconds until the queue should have room again (a client's Retry-After)."""
        del now  # the estimate depends on backlog and learned speed, not on wall time
        cfg = self.config
        per_batch = self.cost_model.predict(cfg.max_batch_size)
        if per_batch is None:
            per_batch = cfg.latency_slo_s
        batches = math.ceil(max(self._queued_rows, 1) / cfg.max_batch_size / self.instances)
        # the queue need not drain fully: a tenth frees enough room to make retrying worthwhile
        return min(max(per_batch * max(batches / 10, 1.0), 0.001), 60.0)

    def on_dispatch_done(
        self, batch_rows: int, seconds: float, now: float, *, requests: int | None = None
    ) -> None:
        """Feed the cost model with one finished batch, answered at ``now``: its ``requests``
        (default: one a row) clients may come back (``wait_for_returns``)."""
        self.cost_model.observe(batch_rows, seconds)
        if self._hold:
            self.returns.answered(batch_rows if requests is None else requests, now)

    # -- decisions -----------------------------------------------------------------------

    def _oldest_group(self) -> deque[RequestT] | None:
        best: deque[RequestT] | None = None
        best_seq = 0
        empty: list[Hashable] = []
        for key, group in self._groups.items():
            while group and group[0].state is not _QUEUED:
                group.popleft()
            if not group:
                empty.append(key)
                continue
            seq = group[0].seq
            if best is None or seq < best_seq:
                best, best_seq = group, seq
        for key in empty:
            del self._groups[key]
        return best

    def next_deadline(self) -> float | None:
        """The earliest deadline of a request still queued (None: no queued one has one)."""
        heap = self._deadlines
        while heap and heap[0][2].state is not _QUEUED:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _park(self, at: float | None) -> WaitUntil | Idle:
        deadline = self.next_deadline()
        if deadline is not None and (at is None or deadline < at):
            at = deadline
        return IDLE if at is None else WaitUntil(at)

    def next_action(
        self, now: float, idle_instances: int, *, flush: bool = False
    ) -> Dispatch[RequestT] | WaitUntil | Idle:
        """What to do at ``now`` with ``idle_instances`` instances free.

        Requests already past their deadline are set aside for the next ``expire`` call.
        ``flush`` (shutdown drain) dispatches whatever can be batched without waiting.
        """
        if self._deadlines and self._deadlines[0][0] <= now:
            self._expired = self.expire(now)
        if not self._by_id:
            return IDLE
        if idle_instances <= 0:
            return self._park(None)
        group = self._oldest_group()
        if group is None:  # pragma: no cover - _by_id non-empty implies a live head
            return IDLE
        mode = self.config.mode
        if mode == "off":
            return self._take(group, 1, group[0].rows, group[0].nbytes)

        # Candidate: the longest FIFO prefix of live requests within the limits.
        max_rows, max_bytes = self._max_rows, self._max_bytes
        rows = nbytes = count = 0
        blocked = False
        pref_count = pref_rows = pref_bytes = 0
        earliest = math.inf
        preferred = self._preferred
        for req in group:
            if req.state is not _QUEUED:
                continue
            if rows + req.rows > max_rows or (
                max_bytes is not None and nbytes + req.nbytes > max_bytes
            ):
                blocked = True
                break
            rows += req.rows
            nbytes += req.nbytes
            count += 1
            if req.deadline is not None and req.deadline < earliest:
                earliest = req.deadline
            if rows in preferred:
                pref_count, pref_rows, pref_bytes = count, rows, nbytes
            if rows == max_rows:
                break
        full = blocked or rows >= max_rows
        if pref_count and not full:
            return self._take(group, pref_count, pref_rows, pref_bytes)
        head = group[0]
        cap_at = head.arrival + self.config.max_queue_delay_s
        if full or flush or now >= cap_at:
            return self._take(group, count, rows, nbytes)
        if mode == "fixed":
            return self._park(cap_at)
        wake = self._adaptive_wait(now, head.arrival, rows, earliest, count)
        if self._hold:
            held = self._hold_for_returns(now, head.arrival, rows, earliest)
            if held is not None and (wake is None or held > wake):
                wake = held
        if wake is None:
            return self._take(group, count, rows, nbytes)
        return self._park(min(wake, cap_at))

    def _adaptive_wait(
        self, now: float, head_arrival: float, rows: int, earliest: float, count: int
    ) -> float | None:
        """When to look again if waiting for more rows pays off; None to dispatch now."""
        cost = self.cost_model
        t_now = cost.predict(rows)
        if t_now is None or t_now <= 0:
            return None  # nothing learned yet: run, and learn
        arrivals = self.arrivals
        gap = arrivals.expected_wait(now)
        if not math.isfinite(gap):
            return None
        gap = max(gap, _MIN_WAIT)
        more = min(rows + max(1, round(arrivals.mean_rows)), self._max_rows)
        t_more = cost.predict(more)
        if t_more is None:
            return None
        # A lone request never waits: with one client (or each client's one request queued)
        # nothing else may be on its way, however busy the loop is.
        filling = count >= 2 and self.loop_busy >= LOOP_BUSY and self.config.fill_when_busy
        if filling:
            # The loop limits: waiting leaves the instance idle but costs no throughput, so
            # wait while requests keep coming (the latency limits below still hold).
            mean_gap = arrivals.mean_gap
            if mean_gap is None or gap > _SILENCE * max(mean_gap, _MIN_WAIT):
                return None
        elif more * t_now <= _GAIN * rows * (gap + t_more):
            # Throughput: rows per second of instance time, dispatching now vs after one
            # arrival. At low arrival rates the wait costs more than the bigger batch saves.
            return None
        # Latency: the oldest request (and every deadline) must still make it after waiting.
        finish = now + gap + _COMPUTE_SAFETY * t_more
        if finish > head_arrival + self.config.latency_slo_s or finish > earliest:
            return None
        latest = min(head_arrival + self.config.latency_slo_s, earliest)
        latest -= _COMPUTE_SAFETY * t_more
        if filling:
            self.filled += 1
        return min(now + gap, latest)

    def _hold_for_returns(
        self, now: float, head_arrival: float, rows: int, earliest: float
    ) -> float | None:
        """Until when to hold the batch for answered clients on their way back; None: don't.

        Held only while more clients are out than rows are queued (the batch would at least
        double), until the latest answer's clients are expected back, and never past what the
        adaptive rule allows: the oldest request and every deadline must still make it with
        the bigger batch's compute time (inflated), and ``max_queue_delay_s`` (the caller's
        cap) still holds.
        """
        returns = self.returns
        owed = returns.owed(now)
        if owed <= rows or owed < _MIN_OWED:
            return None
        back = returns.expected_back(now)
        if back is None or back <= now + _MIN_WAIT:
            return None
        t_more = self.cost_model.predict(min(rows + owed, self._max_rows))
        if t_more is None:
            return None  # nothing learned yet: run, and learn
        latest = min(head_arrival + self.config.latency_slo_s, earliest)
        latest -= _COMPUTE_SAFETY * t_more
        wake = min(back, latest)
        if wake <= now + _MIN_WAIT:
            return None
        self.held += 1
        return wake

    def _take(
        self, group: deque[RequestT], count: int, rows: int, nbytes: int
    ) -> Dispatch[RequestT]:
        taken: list[RequestT] = []
        by_id = self._by_id
        dispatched = RequestState.DISPATCHED
        while len(taken) < count:
            req = group.popleft()
            if req.state is not _QUEUED:
                continue
            req.state = dispatched
            del by_id[req.id]
            taken.append(req)
        self._queued_rows -= rows
        return Dispatch(tuple(taken), rows, nbytes)
