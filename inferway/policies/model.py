"""The policy schema, v1: what a user writes, validated and immutable.

Every model forbids unknown keys, so a typo is an error rather than a silently ignored
setting. Durations accept ``"250ms"``, ``"1.5s"``, ``"2m"`` or a number of seconds.
Backend weights are relative percentages with 0.1% resolution (``99.9`` / ``0.1``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from inferway.policies.access import Access, RedactHeaders
from inferway.policies.autoscale import AutoscaleBlock
from inferway.policies.cost import Cost
from inferway.policies.features import FeatureRouter, Features
from inferway.policies.grpc_targets import GrpcTarget
from inferway.policies.listener_limits import ListenerLimits
from inferway.policies.llm import LlmGateway, OpenAIRoute
from inferway.policies.masking import Mask
from inferway.policies.observability import Observability
from inferway.policies.picker import Picker
from inferway.policies.replicas import Replicas
from inferway.policies.rollouts import Rollout
from inferway.policies.route_traffic import CookieMatch, Fault, Mirror
from inferway.policies.tls import ListenerTls, ServiceTls
from inferway.policies.traffic import (
    CircuitBreakers,
    HashOn,
    HealthCheck,
    LoadBalancing,
    OutlierDetection,
    RateLimit,
    RetryHostSelection,
    TcpKeepalive,
)
from inferway.policies.types import Duration, FilePath, Name, split_host_port

__all__ = [
    "Backend",
    "Duration",
    "Endpoint",
    "HeaderMatch",
    "Listener",
    "PathMatch",
    "Policy",
    "Retries",
    "Route",
    "RouteMatch",
    "Service",
]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


class Listener(_Model):
    """A port Envoy listens on for client traffic."""

    name: Name
    address: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    tls: ListenerTls | None = None
    limits: ListenerLimits = Field(default_factory=ListenerLimits)
    """Slow-client timeouts and the largest request (listener_limits.py); on by default."""

    @field_validator("address")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(
                f"expected an IP address such as 127.0.0.1 or ::, got {value!r}"
            ) from None
        return value


_HOST_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
"""One label of a DNS name (underscores too: SRV-style names and some internal zones)."""


class Endpoint(_Model):
    """One replica of a service. YAML may give just ``"host:port"``."""

    host: str
    port: int = Field(ge=1, le=65535)
    zone: str | None = None
    """Where the replica runs; an Envoy whose node names a zone prefers its own zone's
    replicas and spills to other zones (per-node priorities, docs/fleet.md)."""
    region: str | None = None
    """The zone's region: an Envoy whose own zone has no healthy replica prefers replicas of
    its region over the rest."""
    priority: int = Field(default=0, ge=0, le=15)
    weight: int = Field(default=1, ge=1, le=128)

    @field_validator("host")
    @classmethod
    def _host_name(cls, value: str) -> str:
        """An IP address or a DNS name: Envoy takes anything, then never resolves it."""
        try:
            ipaddress.ip_address(value)
            return value
        except ValueError:
            pass
        labels = value.removesuffix(".").split(".")
        if len(value) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
            raise ValueError(
                "expected an IP address or a DNS name (letters, digits, '-' and '_' between "
                f"dots), got {value!r}"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _from_address(cls, data: object) -> object:
        if isinstance(data, str):
            data = {"address": data}
        if isinstance(data, dict) and "address" in data:
            data = dict(data)
            host, port = split_host_port(data.pop("address"))
            data.setdefault("host", host)
            data.setdefault("port", port)
        return data


class Service(_Model):
    """A named group of upstream replicas (one Envoy cluster)."""

    name: Name
    protocol: Literal["http1", "http2"] = "http1"
    connect_timeout: Duration = 0.5
    """A connect that takes longer fails (and is retried on another replica: ``connect-failure``
    is a default retry condition). 0.5 s is many round trips within a region; a SYN lost to
    a silent zone would otherwise hold a request for the whole timeout."""
    tcp_keepalive: TcpKeepalive = Field(default_factory=TcpKeepalive)
    """Keepalive on upstream connections, on by default (traffic.py)."""
    endpoints: list[Endpoint] = Field(default_factory=list)
    tls: ServiceTls | None = None
    load_balancing: LoadBalancing | None = None  # traffic.py: None = round robin, defaults
    health_check: HealthCheck | None = None  # None = readiness probe for http1, none for http2
    outlier_detection: OutlierDetection | None = None  # None = on, with defaults
    circuit_breakers: CircuitBreakers | None = None  # None = Envoy defaults
    replicas: Replicas | None = None  # replicas.py: processes the gateway runs itself
    autoscale: AutoscaleBlock | None = None
    """autoscale.py: how the autoscaler sizes the service; its scale_target
    (scale_target.py) says what a decision acts on."""
    cost: Cost | None = None  # cost.py: prices and budgets, exported as metrics
    picker: Picker | None = None  # picker.py: an endpoint picker chooses the replica per request


class PathMatch(_Model):
    """Exactly one of prefix, exact or regex (RE2 syntax, as Envoy uses)."""

    prefix: str | None = None
    exact: str | None = None
    regex: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> PathMatch:
        given = [k for k in ("prefix", "exact", "regex") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of prefix, exact or regex (got {', '.join(given) or 'none'})"
            )
        for key in ("prefix", "exact"):
            value = getattr(self, key)
            if value is not None and not value.startswith("/"):
                raise ValueError(f"{key} must start with '/', got {value!r}")
        return self


class HeaderMatch(_Model):
    """Match one request header: exactly one of exact, prefix, regex or present."""

    name: str = Field(min_length=1)
    exact: str | None = None
    prefix: str | None = None
    regex: str | None = None
    present: bool | None = None
    invert: bool = False

    @model_validator(mode="after")
    def _exactly_one(self) -> HeaderMatch:
        given = [k for k in ("exact", "prefix", "regex", "present") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of exact, prefix, regex or present "
                f"(got {', '.join(given) or 'none'})"
            )
        return self


class RouteMatch(_Model):
    path: PathMatch = Field(default_factory=lambda: PathMatch(prefix="/"))
    headers: list[HeaderMatch] = Field(default_factory=list)
    cookies: list[CookieMatch] = Field(default_factory=list)
    """Every listed cookie must match too (route_traffic.py)."""
    features: Features | None = None
    """What the request body must show: rows, size, JSON fields (features.py)."""


MAX_WEIGHT = 429_496_729
"""Envoy receives a weight in tenths of a percent as a uint32."""


class Backend(_Model):
    """A weighted destination of a route. Weights are relative percentages, 0.1 resolution."""

    service: str
    weight: float = Field(default=100.0, le=MAX_WEIGHT)

    @field_validator("weight")
    @classmethod
    def _resolution(cls, value: float) -> float:
        if value < 0:
            raise ValueError(f"weight must not be negative, got {value:g}")
        if abs(value * 10 - round(value * 10)) > 1e-6:
            raise ValueError(f"weight has 0.1 resolution (e.g. 99.9 or 0.1), got {value:g}")
        return value

    @property
    def permille(self) -> int:
        """The weight in tenths of a percent, the integer Envoy receives."""
        return round(self.weight * 10)


RetryOn = Literal[
    "5xx",
    "gateway-error",
    "reset",
    "connect-failure",
    "retriable-status-codes",
    "refused-stream",
]


class Retries(_Model):
    attempts: int = Field(default=1, ge=0, le=10)
    on: list[RetryOn] = Field(default_factory=lambda: list[RetryOn](["connect-failure", "reset"]))
    per_try_timeout: Duration | None = None
    retriable_status_codes: list[Annotated[int, Field(ge=100, le=599)]] = Field(
        default_factory=list
    )
    host_selection: RetryHostSelection = Field(default_factory=RetryHostSelection)
    hedge: bool | None = None
    """When a try passes ``per_try_timeout``, send the next try *without* cancelling the
    first (Envoy's ``hedge_on_per_try_timeout``); the first answer wins. None: hedged when
    the per-try timeout is the default share of the route timeout, not hedged when
    ``per_try_timeout`` is given. A short hedged per-try timeout is how a silent zone costs
    a request less than ~200 ms (docs/fleet.md "Zones and partitions")."""


class Route(_Model):
    """Where matching requests go. Routes are tried in the order written."""

    name: Name
    listeners: list[str] | None = None
    """Listener names this route is served on; default: every listener."""
    match: RouteMatch = Field(default_factory=RouteMatch)
    backends: list[Backend] = Field(min_length=1)
    timeout: Duration = 15.0
    retries: Retries | None = None
    access: Access | None = None
    rate_limit: RateLimit | None = None
    mirror: Mirror | None = None
    """Shadow a percentage of requests to another service (route_traffic.py)."""
    hash: HashOn | None = None
    """Sticky split: the header, cookie or client IP that keeps a user on one backend."""
    fault: Fault | None = None
    """Abort or delay a percentage of requests, to rehearse a rollback."""
    served_by_headers: bool | None = None
    """``x-inferway-pool`` / ``x-inferway-replica`` on this route's answers; None: the
    policy's ``served_by_headers``."""
    openai: OpenAIRoute | None = None
    """An OpenAI-compatible route for one model (llm.py): paths and body model matched."""


class Policy(_Model):
    """The whole desired state of one inferway deployment."""

    version: Literal[1] = 1
    listeners: list[Listener] = Field(min_length=1)
    services: list[Service] = Field(default_factory=list)
    routes: list[Route] = Field(default_factory=list)
    endpoints_file: FilePath | None = None  # services' endpoints from a watched file (endpoints.py)
    redact_headers: RedactHeaders
    observability: Observability | None = None
    grpc_targets: list[GrpcTarget] = Field(default_factory=list)
    """Names proxyless gRPC clients dial as ``xds:///<name>`` (grpc_targets.py)."""
    rollouts: list[Rollout] = Field(default_factory=list)
    """Canary rollouts driven by the rollout controller (rollouts.py, docs/rollouts.md)."""
    served_by_headers: bool = True
    """Every answer names the service (``x-inferway-pool``) and replica
    (``x-inferway-replica``) that served it, so routing can be checked from outside."""
    feature_router: FeatureRouter = Field(default_factory=FeatureRouter)
    llm: LlmGateway = Field(default_factory=LlmGateway)
    """The LLM processor, for ``openai`` routes: token counts, limits, model routing."""
    """Where the feature router listens, for routes with ``match.features``."""
    mask: Mask | None = None
    """Sensitive request data masked in access logs, spans and inferway's logs (masking.py)."""
    allow_disruptive: bool = False
    """A live edit that removes every route or moves every listener is refused unless this
    is true (checks_disruptive.py): a half-saved file often looks exactly like that."""
