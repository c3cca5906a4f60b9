"""How asynchronous jobs are kept and worked, configured once from ``inferway serve``'s options.
Standard library only: the CLI builds these before anything heavy is imported."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_JOBS", "DEFAULT_TTL_S", "JobSettings"]

DEFAULT_MAX_JOBS = 1000
DEFAULT_TTL_S = 3600.0


@dataclass(frozen=True, slots=True)
class JobSettings:
    """``max_jobs``: jobs held at once, queued, running and finished-within-the-TTL together
    (one more is refused with 429); ``ttl_s``: how long a finished job and its result are
    kept; ``concurrency``: jobs one backend works at once; ``timeout_s``: a job's deadline when
    its request names none (None: the serving default); ``redis_url``: keep jobs in Redis
    Streams instead of this process; ``claim_idle_s``: how long a Redis entry may sit
    unacknowledged, its worker silent, before another worker takes it over; ``max_attempts``:
    starts of one job (workers dying under it) before it is failed; callbacks are tried
    ``1 + callback_retries`` times, ``callback_timeout_s`` each, the waits doubling from
    ``callback_backoff_s``; ``cancel_poll_s``: how often a running job checks whether it was
    cancelled."""

    max_jobs: int = DEFAULT_MAX_JOBS
    ttl_s: float = DEFAULT_TTL_S
    concurrency: int = 4
    timeout_s: float | None = 3600.0
    redis_url: str | None = None
    redis_prefix: str = "inferway:jobs"
    claim_idle_s: float = 30.0
    max_attempts: int = 3
    callback_timeout_s: float = 5.0
    callback_retries: int = 3
    callback_backoff_s: float = 0.5
    cancel_poll_s: float = 0.2

    def __post_init__(self) -> None:
        for name in ("max_jobs", "concurrency", "max_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.callback_retries < 0:
            raise ValueError(f"callback_retries must be >= 0, got {self.callback_retries!r}")
        for name in ("ttl_s", "claim_idle_s", "callback_timeout_s", "cancel_poll_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.callback_backoff_s < 0:
            raise ValueError(f"callback_backoff_s must be >= 0, got {self.callback_backoff_s!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds or None, got {self.timeout_s!r}")
        if self.redis_url is not None and not self.redis_url.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ValueError(
                "redis_url must start redis://, rediss:// or unix://, got "
                f"{self.redis_url.partition(':')[0]!r}:... (the rest unprinted: it may hold "
                "a password)"
            )
