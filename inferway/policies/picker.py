"""A service's endpoint picker: which of its replicas each LLM request goes to, chosen per
request by a picker that scores them (docs/picker.md).

.. code-block:: yaml

    services:
      - name: llm
        endpoints: [10.0.0.5:8000, 10.0.0.6:8000]
        picker:
          scorers: {queue: 2, kv_cache: 2, prefix: 3}   # weights; lora, session too (0 = off)
          fail: open            # picker down or slow: open = Envoy's balancing; closed = 503/504
          # transport: http     # ask over ext_authz's HTTP service (less CPU, docs/picker.md)
          # external: epp.internal:9002   # a Gateway API Inference Extension picker instead

inferway's own picker listens on ``listen`` (in the gateway's process, or with ``process:
sidecar`` in a picker process the gateway supervises), scrapes each
replica's ``metrics_path`` every ``scrape_interval`` and counts requests in flight itself.
Envoy asks it (an external processor) before sending a request upstream and sends the request
to the endpoint it names (Envoy's ``override_host`` load-balancing policy, on the same cluster:
EDS, health checks and outlier detection stay as they are). The default is ``fail: open``: a
picker that fails loses the cache affinity, never the request.

``transport: http`` asks inferway's own picker over Envoy's ``ext_authz`` HTTP service instead
(one HTTP/1.1 request per pick on ``http_listen``, its end reported by Envoy's gRPC access log):
about a fifth of the picker's CPU per request of the ext_proc stream (docs/picker.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferway.policies.types import Duration, split_host_port

__all__ = ["DEFAULT_PICKER_HTTP_LISTEN", "DEFAULT_PICKER_LISTEN", "Picker", "PickerScorers"]

DEFAULT_PICKER_LISTEN = "127.0.0.1:18094"
DEFAULT_PICKER_HTTP_LISTEN = "127.0.0.1:18095"


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


class PickerScorers(_Model):
    """Weights of the scorers (0 turns one off); at least one must count."""

    queue: float = Field(default=2.0, ge=0, le=100)
    kv_cache: float = Field(default=2.0, ge=0, le=100)
    prefix: float = Field(default=3.0, ge=0, le=100)
    lora: float = Field(default=1.0, ge=0, le=100)
    session: float = Field(default=0.0, ge=0, le=100)

    @model_validator(mode="after")
    def _one_counts(self) -> PickerScorers:
        if not any((self.queue, self.kv_cache, self.prefix, self.lora, self.session)):
            raise ValueError("every scorer weight is 0: give at least one a weight above 0")
        return self


_OWN_ONLY = (
    "scorers", "listen", "queue_limit", "kv_cache_limit", "shed", "fallbacks",
    "metrics_path", "scrape_interval", "session_header", "process", "transport", "http_listen",
)  # fmt: skip


class Picker(_Model):
    scorers: PickerScorers = Field(default_factory=PickerScorers)
    external: str | None = None
    """``HOST:PORT`` of a GAIE Endpoint Picker to ask instead of inferway's own."""
    fail: Literal["open", "closed"] = "open"
    timeout: Duration = Field(default=0.5, gt=0, le=30)
    """How long Envoy waits for the picker's answer before ``fail`` applies."""
    listen: str = DEFAULT_PICKER_LISTEN
    """Where inferway's own picker serves (gRPC, plaintext: keep it on loopback)."""
    queue_limit: float = Field(default=8, gt=0)
    """A replica with this many requests waiting or running is saturated: skipped."""
    kv_cache_limit: float = Field(default=0.95, gt=0, le=1)
    shed: bool = False
    """Every replica saturated: 429 (shed) instead of the least loaded one."""
    fallbacks: int = Field(default=2, ge=0, le=8)
    metrics_path: str | None = "/metrics"
    """Prometheus metrics of each replica (vLLM, SGLang, llama.cpp names); null: in-flight
    counts only (servers without metrics)."""
    scrape_interval: Duration = Field(default=1.0, gt=0, le=60)
    session_header: str = Field(default="x-session-id", min_length=1)
    process: Literal["gateway", "sidecar"] = "gateway"
    """Where inferway's own picker runs: in the gateway's process, or in a picker process the
    gateway starts, feeds the resolved endpoints and restarts when it dies (docs/picker.md,
    bench/picker_overhead.py measures both)."""
    transport: Literal["ext_proc", "http"] = "ext_proc"
    """How Envoy asks inferway's own picker: ``ext_proc`` (GAIE's protocol, a gRPC stream per
    request) or ``http`` (Envoy's ext_authz HTTP service on ``http_listen``, the request's end
    reported over Envoy's gRPC access log to ``listen``): less CPU per pick (docs/picker.md)."""
    http_listen: str = DEFAULT_PICKER_HTTP_LISTEN
    """Where inferway's own picker serves ``transport: http`` (plain HTTP/1.1: keep it on
    loopback); ``listen`` still serves gRPC (health, the access log that ends each pick)."""

    @field_validator("external", "listen", "http_listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)  # raises naming what is wrong
        return value

    @model_validator(mode="after")
    def _external_alone(self) -> Picker:
        if self.external is not None and self.transport != "ext_proc":
            raise ValueError(
                f"picker: transport {self.transport} is for inferway's own picker; external: "
                f"{self.external} is asked over GAIE's ext_proc protocol (drop transport)"
            )
        if self.external is not None:
            fields = type(self).model_fields
            own = [
                n
                for n in _OWN_ONLY
                if getattr(self, n) != fields[n].get_default(call_default_factory=True)
            ]
            if own:
                raise ValueError(
                    f"picker: {', '.join(own)} configure inferway's own picker; with "
                    f"external: {self.external} give only external, fail and timeout"
                )
        if self.transport == "http" and split_host_port(self.http_listen) == split_host_port(
            self.listen
        ):
            raise ValueError(
                f"picker: http_listen {self.http_listen} is listen's address: transport http "
                "serves HTTP there and gRPC on listen, give them different ports"
            )
        if self.metrics_path is not None and not self.metrics_path.startswith("/"):
            raise ValueError(f"metrics_path must start with '/', got {self.metrics_path!r}")
        return self
