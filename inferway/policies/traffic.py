"""Traffic management in the policy: how a service spreads load, notices dead replicas and
protects itself, and how a route limits its rate.

Three levels of load balancing a user can see:

* **priority tiers** (``endpoints[].priority``): tier 0 takes traffic while it is healthy;
  as it loses healthy replicas, traffic spills to tier 1 (then 2...). The spill starts once
  fewer than ``100 / overprovisioning_factor`` of a tier's replicas are healthy (default
  140: a tier with 3 of 4 replicas healthy still takes everything).
* **zones** within a tier (``endpoints[].zone``), weighted by ``load_balancing.zones``
  (``{zone: weight}``), else by the sum of their endpoints' weights.
* **endpoints** within a zone, by ``endpoints[].weight`` and ``load_balancing.policy``.

Health is decided twice: active health checks (``health_check``, on by default for HTTP/1
services: the Open Inference Protocol readiness path) and outlier detection on real traffic
(``outlier_detection``, on by default). A replica ejected for failing real traffic stays
ejected even if it still answers its readiness probe, unless ``uneject_on_health_check``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferway.policies.types import Duration

__all__ = [
    "DEFAULT_HEALTH_PATH",
    "LB_POLICIES",
    "CircuitBreakers",
    "CookieHash",
    "FailurePercentage",
    "HashOn",
    "HealthCheck",
    "LoadAwareSettings",
    "LoadBalancing",
    "OutlierDetection",
    "RateLimit",
    "RetryBudget",
    "RetryHostSelection",
    "SuccessRate",
    "TcpKeepalive",
]

DEFAULT_HEALTH_PATH = "/v2/health/ready"
"""Open Inference Protocol (KServe v2) server readiness: 200 once models are loaded."""

LbPolicy = Literal["round_robin", "least_request", "random", "ring_hash", "maglev", "load_aware"]
LB_POLICIES: tuple[str, ...] = LbPolicy.__args__  # type: ignore[attr-defined]

Percent = Annotated[float, Field(ge=0, le=100)]
Positive = Annotated[int, Field(ge=1)]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


# -- load balancing ------------------------------------------------------------------------------


class CookieHash(_Model):
    """Hash on a cookie. With ``ttl`` set, Envoy creates the cookie on the first response
    when the client has none, so a fresh client becomes sticky without help."""

    name: str = Field(min_length=1)
    ttl: Duration | None = None
    path: str | None = None


class HashOn(_Model):
    """What ring_hash / maglev hash for session affinity: exactly one of a request header,
    a cookie, or the client's IP address."""

    header: str | None = Field(default=None, min_length=1)
    cookie: CookieHash | None = None
    source_ip: Literal[True] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> HashOn:
        given = [k for k in ("header", "cookie", "source_ip") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of header, cookie or source_ip "
                f"(got {', '.join(given) or 'none'})"
            )
        return self


class LoadAwareSettings(_Model):
    """Client-side weighted round robin fed by the backends' ORCA load reports
    (``endpoint-load-metrics``): weight = requests per second / utilization, so a busy
    replica gets less traffic. Defaults are Envoy's."""

    blackout_period: Duration = 10.0
    """A replica must report this long before its weight is used (avoids reacting to a
    replica that just started and reports an empty queue)."""
    weight_expiration_period: Duration = 180.0
    """A weight not refreshed for this long is dropped (the replica goes back to average)."""
    weight_update_period: Duration = Field(default=1.0, ge=0.1)
    """How often weights are recomputed from the latest reports."""
    error_utilization_penalty: float = Field(default=1.0, ge=0)
    """Errors per second count as this much extra utilization, so a fast-failing replica
    does not look idle."""


class LoadBalancing(_Model):
    policy: LbPolicy = "round_robin"
    hash_on: HashOn | None = None
    """ring_hash / maglev only: what identifies a session."""
    choice_count: int = Field(default=2, ge=2, le=100)
    """least_request only: how many random replicas are compared per pick."""
    load_aware: LoadAwareSettings = Field(default_factory=LoadAwareSettings)
    """load_aware only."""
    overprovisioning_factor: int = Field(default=140, ge=100, le=1000)
    """Percent. A tier keeps all traffic while healthy% * factor / 100 >= 100."""
    panic_threshold: Percent = 50.0
    """Below this percent of healthy replicas (in a tier), Envoy gives up on health and
    spreads traffic over all of them; 0 turns panic off (no healthy replica: 503)."""
    zones: dict[Annotated[str, Field(min_length=1)], Positive] | None = None
    """Zone weights within a tier; default: the sum of each zone's endpoint weights."""


class TcpKeepalive(_Model):
    """TCP keepalive on Envoy's connections to the replicas. A pooled connection to a zone
    that went silent (link down: no RST, no FIN) otherwise looks alive until a request on it
    times out; with keepalive the kernel closes an idle one after ``idle + interval x
    probes`` seconds (default 5 + 1 x 3 = 8 s), so it is not picked again. Costs one tiny
    packet per idle connection per ``interval``."""

    enabled: bool = True
    idle: Duration = Field(default=5.0, ge=1)
    """Seconds a connection is idle before the first probe (whole seconds on the wire)."""
    interval: Duration = Field(default=1.0, ge=1)
    probes: int = Field(default=3, ge=1, le=100)


# -- health --------------------------------------------------------------------------------------


class HealthCheck(_Model):
    """Active health checking. Default for HTTP/1 services: GET /v2/health/ready every 2 s;
    HTTP/2 (gRPC) services have none unless configured (inferway's gRPC backend has no
    grpc.health.v1 service; give ``type: grpc`` for servers that do)."""

    enabled: bool = True
    type: Literal["http", "grpc"] = "http"
    path: str = DEFAULT_HEALTH_PATH
    grpc_service: str = ""
    """gRPC health service name; empty asks about the whole server."""
    interval: Duration = Field(default=2.0, gt=0)
    timeout: Duration | None = Field(default=None, gt=0)
    """Default: 1 s, or the interval when that is shorter."""
    unhealthy_threshold: int = Field(default=2, ge=1)
    healthy_threshold: int = Field(default=1, ge=1)
    no_traffic_interval: Duration | None = Field(default=None, gt=0)
    """Interval while the service has had no traffic yet; default: ``interval``. (Envoy's
    own default is 60 s, and it keeps that pace until the next probe after traffic starts,
    so a fresh gateway would miss a dead replica for up to a minute.)"""
    unhealthy_interval: Duration | None = Field(default=None, gt=0)
    """Interval for replicas currently unhealthy; default: ``interval``."""

    @property
    def idle_interval(self) -> float:
        return self.no_traffic_interval if self.no_traffic_interval is not None else self.interval

    @property
    def probe_timeout(self) -> float:
        return self.timeout if self.timeout is not None else min(1.0, self.interval)

    @model_validator(mode="after")
    def _path(self) -> HealthCheck:
        if self.type == "http" and not self.path.startswith("/"):
            raise ValueError(f"path must start with '/', got {self.path!r}")
        return self


class SuccessRate(_Model):
    """Eject replicas whose success rate is ``stdev_factor / 1000`` standard deviations
    below the mean of all replicas (needs ``minimum_hosts`` replicas with ``request_volume``
    requests in an interval)."""

    minimum_hosts: int = Field(default=5, ge=1)
    request_volume: int = Field(default=100, ge=1)
    stdev_factor: int = Field(default=1900, ge=1)


class FailurePercentage(_Model):
    """Eject replicas whose failure percentage in an interval is at least ``threshold``."""

    threshold: Percent = 85.0
    minimum_hosts: int = Field(default=5, ge=1)
    request_volume: int = Field(default=50, ge=1)


class OutlierDetection(_Model):
    """Passive health: replicas failing real traffic are ejected for ``base_ejection_time``
    (times the number of past ejections). On by default for every service."""

    enabled: bool = True
    consecutive_5xx: int | None = Field(default=5, ge=1)
    """Any 5xx, and connection failures/resets/timeouts; null turns it off."""
    consecutive_gateway_errors: int | None = Field(default=3, ge=1)
    """502/503/504 and connection failures/resets/timeouts; null turns it off."""
    success_rate: SuccessRate | None = None
    failure_percentage: FailurePercentage | None = None
    interval: Duration = Field(default=1.0, gt=0)
    """How often ejections are reviewed (success rate, failure percentage, un-ejection)."""
    base_ejection_time: Duration = Field(default=10.0, gt=0)
    max_ejection_time: Duration = Field(default=300.0, gt=0)
    max_ejection_percent: Percent = 50.0
    uneject_on_health_check: bool = False
    """Envoy defaults this to true: a replica that passes its readiness probe but fails
    real traffic is un-ejected at once. Off here so such a replica stays out."""


class RetryBudget(_Model):
    """Retries allowed at once as a percent of active requests (at least
    ``min_concurrency``), instead of a fixed count: retries scale with load without
    becoming a retry storm.

    The floor is sized for a whole priority tier dying at once: every request then spends two
    tries there, each retry waiting out Envoy's backoff (25 ms base, exponential), so about
    ``rate x 0.05`` retries are in flight; a floor of 10 overflowed (503, no retry) at
    200 req/s as soon as the CPU was busy. 100 covers that to about 2,000 req/s."""

    percent: Percent = 20.0
    min_concurrency: int = Field(default=100, ge=1)


class CircuitBreakers(_Model):
    """Per-service limits Envoy enforces before queueing; overflow fails fast with 503
    (and counts in ``upstream_rq_pending_overflow`` / ``upstream_cx_overflow``).
    Unset limits keep Envoy's defaults (1024 connections, pending and requests), except
    retries: Envoy allows only 3 concurrent retries per service, which overflow (503, no
    retry) as soon as a replica dies under load, so unless ``max_retries`` or
    ``retry_budget`` is given a service gets the default retry budget (20% of active
    requests, at least 100)."""

    max_connections: Positive | None = None
    max_pending_requests: Positive | None = None
    max_requests: Positive | None = None
    max_retries: Positive | None = None
    retry_budget: RetryBudget | None = None
    """Envoy keeps the retry budget with the service's circuit breakers; it replaces
    ``max_retries``."""

    @model_validator(mode="after")
    def _one_retry_limit(self) -> CircuitBreakers:
        if self.max_retries is not None and self.retry_budget is not None:
            raise ValueError(
                "give max_retries or retry_budget, not both: Envoy ignores max_retries "
                "when a retry budget is set"
            )
        return self


# -- routes --------------------------------------------------------------------------------------


class RetryHostSelection(_Model):
    """Which replica a retry goes to."""

    avoid_previous: bool = True
    """Do not retry on a replica that already failed this request."""
    max_attempts: int = Field(default=5, ge=1, le=100)
    """How many picks Envoy makes to find a replica that is not excluded."""
    next_priority_after: int | None = Field(default=1, ge=1, le=10)
    """After this many tries of one request in one priority tier, its retries go to the
    next tier (Envoy's previous_priorities retry priority, ``update_frequency``). Without it
    a request keeps retrying in a tier whose replicas all died until health checks notice.
    Default 1: a retry always tries another tier, which for a zoned fleet is another zone
    (each Envoy's own zone is its tier 0), so the one default retry never lands in a zone
    that just went silent. ``null`` keeps retries on the normal priority load."""


class RateLimit(_Model):
    """A token bucket per route. Either ``requests_per_second`` or ``tokens`` added every
    ``fill_interval``; ``burst`` is the bucket size (default: one refill). Excess requests get
    429 with a JSON body naming the route. ``scope: envoy`` (the default): the rate holds for
    each Envoy on its own (N Envoys admit N times it); ``scope: fleet``: for the sum over every
    Envoy of the control plane, each Envoy holding a share that follows its offered load
    (docs/fleet.md)."""

    requests_per_second: Positive | None = None
    tokens: Positive | None = None
    fill_interval: Duration | None = Field(default=None, ge=0.05)
    burst: Positive | None = None
    scope: Literal["envoy", "fleet"] = "envoy"

    @model_validator(mode="after")
    def _one_rate(self) -> RateLimit:
        if self.requests_per_second is not None:
            if self.tokens is not None or self.fill_interval is not None:
                raise ValueError("give requests_per_second, or tokens with fill_interval, not both")
        elif self.tokens is None or self.fill_interval is None:
            raise ValueError(
                "give requests_per_second (e.g. 100), or tokens with fill_interval "
                "(e.g. tokens: 5, fill_interval: 100ms)"
            )
        if self.burst is not None and self.burst < self.tokens_per_fill:
            raise ValueError(
                f"burst {self.burst} is smaller than one refill ({self.tokens_per_fill} "
                "tokens), so the configured rate could never be reached; raise burst"
            )
        return self

    @property
    def tokens_per_fill(self) -> int:
        return self.requests_per_second or self.tokens or 0

    @property
    def refill_seconds(self) -> float:
        return 1.0 if self.requests_per_second is not None else float(self.fill_interval or 0)

    @property
    def bucket_size(self) -> int:
        return self.burst or self.tokens_per_fill
