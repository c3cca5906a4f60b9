"""A service's endpoint picker: which of its replicas each LLM request goes to, chosen per
request by a picker that scores them (docs/picker.md).

.. code-block:: yaml

    services:
      - name: llm
        endpoints: [10.0.0.5:8000, 10.0.0.6:8000]
        picker:
          scorers: {queue: 2, kv_cache: 2, prefix: 3}   # weights; lora, session too (0 = off)
          fail: open            # picker down or slow: open = Envoy's balancing; closed = 503/504
          # transport: ext_proc # ask over GAIE's ext_proc stream (default http: less CPU)
          # external: epp.internal:9002   # a Gateway API Inference Extension picker instead
          # process: envoy      # no picker to ask: Envoy hashes the prompt's prefix itself
          # pick: score         # ... or scores each request itself, in its Lua filter

inferway's own picker serves gRPC on ``listen`` and plain HTTP on ``http_listen`` (``listen``'s
port + 1 unless given), in the gateway's process, or with ``process: sidecar`` in a picker
process the gateway supervises. It scrapes each replica's ``metrics_path`` every
``scrape_interval`` and counts requests in flight itself. Envoy asks it before sending a
request upstream and sends the request to the endpoint it names (Envoy's ``override_host``
load-balancing policy, on the same cluster: EDS, health checks and outlier detection stay as
they are). The default is ``fail: open``: a picker that fails loses the cache affinity, never
the request.

How Envoy asks (``transport``): ``http`` by default for inferway's own picker, Envoy's
``ext_authz`` HTTP service (one HTTP/1.1 request per pick on ``http_listen``, its end reported
by Envoy's gRPC access log to ``listen``), about a fifth of the picker's CPU per request of the
ext_proc stream and a fifth to a quarter of its added p99 latency (docs/picker.md);
``ext_proc``, the Gateway API Inference Extension's protocol (a gRPC stream per request), the
one an ``external`` picker is always asked over. Either way ``listen`` answers GAIE's ext_proc
protocol, so other GAIE gateways can ask the same picker.

``process: envoy`` asks nobody: Envoy's Lua filter hashes the first ``prefix_bytes`` of the
request's ``messages`` (or ``prompt``) and Envoy's Maglev consistent hashing with bounded load
sends it to the replica that hash maps to, unless that replica already has more than
``load_bound`` times the average of Envoy's requests in flight (then the next one on the
table). Requests sharing a prompt prefix meet on one replica, from every Envoy alike (the table
depends only on the replicas); no hop, so nothing added on the request's path but the hash. It
has no KV-cache, LoRA or session scorer, and no per-pick scores to show.

``process: envoy`` with ``pick: score`` runs the scoring picker itself in Envoy's Lua filter:
the same scorers and weights, the same saturation and shedding, the same ``x-gateway-
destination-endpoint`` answer to the same ``override_host`` policy, and no hop. Each Envoy
worker thread keeps its own prefix index and in-flight counts; the gateway scrapes the
replicas and pushes their queue, KV-cache use and LoRA adapters with the routes when they
change. Each pick's winner and reason go in the request's dynamic metadata (``inferway.picker``)
and on its trace span.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferway.policies.types import Duration, split_host_port

__all__ = [
    "DEFAULT_PICKER_HTTP_LISTEN",
    "DEFAULT_PICKER_LISTEN",
    "Picker",
    "PickerScorers",
    "default_http_listen",
]

DEFAULT_PICKER_LISTEN = "127.0.0.1:18094"
DEFAULT_PICKER_HTTP_LISTEN = "127.0.0.1:18095"


def _next_port(listen: str) -> str:
    """The default ``http_listen`` for a picker on ``listen``: the same host, the next port
    (``127.0.0.1:18094`` -> ``127.0.0.1:18095``); port 0 (the OS picks) stays 0."""
    host, port = split_host_port(listen)
    if port == 0:
        return f"[{host}]:0" if ":" in host else f"{host}:0"
    if port >= 65535:
        raise ValueError(
            f"picker: listen {listen} has no next port for http_listen: give http_listen"
        )
    return f"[{host}]:{port + 1}" if ":" in host else f"{host}:{port + 1}"


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
    "prefix_bytes", "load_bound", "pick",
)  # fmt: skip
_IN_ENVOY = (
    "process", "pick", "prefix_bytes", "load_bound", "queue_limit", "kv_cache_limit",
    "metrics_path", "scrape_interval",
)  # fmt: skip
"""What ``process: envoy`` (``pick: hash``) takes: there is no picker to listen, score, time
out or fail; the gateway still scrapes the replicas and has Envoy leave out saturated ones."""
_IN_ENVOY_SCORED = (
    "process", "pick", "scorers", "queue_limit", "kv_cache_limit", "shed", "fallbacks",
    "metrics_path", "scrape_interval", "session_header", "load_bound",
)  # fmt: skip
"""What ``process: envoy`` with ``pick: score`` takes: the scoring picker's own settings, run
in Envoy's Lua filter; nothing to listen, ask, time out or fail (a Lua error falls back to the
service's own balancing, as ``fail: open`` does)."""


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
    """A replica with this many requests waiting or running is saturated: skipped (with
    ``process: envoy``, by its scraped metrics: left out of Envoy's table for a while)."""
    kv_cache_limit: float = Field(default=0.95, gt=0, le=1)
    shed: bool = False
    """Every replica saturated: 429 (shed) instead of the least loaded one."""
    fallbacks: int = Field(default=2, ge=0, le=8)
    metrics_path: str | None = "/metrics"
    """Prometheus metrics of each replica (vLLM, SGLang, llama.cpp names); null: in-flight
    counts only (servers without metrics)."""
    scrape_interval: Duration = Field(default=1.0, gt=0, le=60)
    session_header: str = Field(default="x-session-id", min_length=1)
    process: Literal["gateway", "sidecar", "envoy"] = "gateway"
    """Where inferway's own picker runs: in the gateway's process, in a picker process the
    gateway starts, feeds the resolved endpoints and restarts when it dies (docs/picker.md,
    bench/picker_overhead.py measures both), or in Envoy itself (prefix hashing with bounded
    load, no hop: bench/picker_transport.py)."""
    prefix_bytes: int = Field(default=1024, ge=64, le=65536)
    """``process: envoy``: how much of the prompt (its ``messages`` JSON as sent) the hash
    covers: requests alike in this much meet on one replica. About 250 tokens by default:
    shorter than a typical shared system prompt, longer than most one-off questions."""
    load_bound: float = Field(default=1.1, ge=1.0, le=10.0)
    """``process: envoy``: a replica with more than this times the average of Envoy's
    requests in flight is passed over for the next one on the hash table (Envoy's
    ``hash_balance_factor``, in percent, is this times 100). 1.1 by bench/picker_sim.py: on 64
    servers it kept a shared prefix's requests together (p90 TTFT 7-9x under round robin) and
    unique prompts as even as least request; 1.0 spilled shared prefixes (2x), 1.25 let unique
    prompts queue a little more than least request. With ``pick: score``: a prompt no open
    replica holds (new to an Envoy worker, or its holders saturated) goes to its home, the
    first replica in the prompt's own hash order whose depth is at most this times the least
    loaded's plus one (so workers and Envoys that see the pool alike cache it once)."""
    pick: Literal["hash", "score"] = "hash"
    """``process: envoy``: how Envoy picks. ``hash``: the prompt prefix's hash, Maglev with
    bounded load (every Envoy alike, no state). ``score``: the scoring picker's scorers (queue,
    KV cache, prefix, LoRA, session) run per request in Envoy's Lua filter, each Envoy worker
    with its own prefix index and in-flight counts, the replicas' scraped metrics pushed to it
    with the routes (xds/translate/picker_score.py)."""
    transport: Literal["ext_proc", "http"] = "http"
    """How Envoy asks the picker: ``http`` (the default for inferway's own: Envoy's ext_authz
    HTTP service on ``http_listen``, the request's end reported over Envoy's gRPC access log to
    ``listen``; about a fifth of ext_proc's CPU per pick, docs/picker.md) or ``ext_proc``
    (GAIE's protocol, a gRPC stream per request: the default, and the only way, for an
    ``external`` picker; also what carries Envoy's subset hint)."""
    http_listen: str = DEFAULT_PICKER_HTTP_LISTEN
    """Where inferway's own picker serves ``transport: http`` (plain HTTP/1.1: keep it on
    loopback); ``listen`` still serves gRPC (health, the access log that ends each pick, GAIE's
    ext_proc). Default: ``listen``'s host and next port."""

    @model_validator(mode="before")
    @classmethod
    def _defaults_from_others(cls, data: object) -> object:
        """``transport`` defaults to ext_proc for an ``external`` picker (http for inferway's
        own) and ``http_listen`` to the port after ``listen``'s."""
        if not isinstance(data, dict):
            return data
        filled = dict(data)
        if "transport" not in filled and filled.get("external") is not None:
            filled["transport"] = "ext_proc"
        listen = filled.get("listen")
        if "http_listen" not in filled and isinstance(listen, str):
            try:
                split_host_port(listen)
            except ValueError:
                return filled  # listen's own validator says what is wrong with it
            filled["http_listen"] = _next_port(listen)  # raises at port 65535
        return filled

    @field_validator("external", "listen", "http_listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)  # raises naming what is wrong
        return value

    def _changed(self, names: tuple[str, ...]) -> list[str]:
        """Those of ``names`` set to other than their default (a dump writes every field):
        ``transport`` and ``http_listen`` count against the defaults they take from
        ``external`` and ``listen``."""
        fields = type(self).model_fields
        defaults = {n: fields[n].get_default(call_default_factory=True) for n in names}
        if "transport" in defaults and self.external is not None:
            defaults["transport"] = "ext_proc"
        if "http_listen" in defaults:
            defaults["http_listen"] = default_http_listen(self.listen)
        return [n for n in names if getattr(self, n) != defaults[n]]

    @model_validator(mode="after")
    def _in_envoy_alone(self) -> Picker:
        asked = ("external", "fail", "timeout", *_OWN_ONLY)
        scored = self.pick == "score"
        allowed = _IN_ENVOY_SCORED if scored else _IN_ENVOY
        others = self._changed(tuple(n for n in asked if n not in allowed))
        if self.process == "envoy" and others:
            what = (
                "scores each request in its Lua filter): give only scorers, queue_limit, "
                "kv_cache_limit, shed, fallbacks, session_header, load_bound, metrics_path "
                "and scrape_interval"
                if scored
                else "prefix hash, bounded load, saturated replicas left out): give only "
                "prefix_bytes, load_bound, queue_limit, kv_cache_limit, metrics_path and "
                "scrape_interval"
            )
            raise ValueError(
                f"picker: {', '.join(others)} {'is' if len(others) == 1 else 'are'} for a "
                f"picker Envoy asks; with process: envoy, pick: {self.pick} Envoy picks "
                f"itself ({what}"
            )
        if self.process != "envoy" and scored:
            raise ValueError(
                f"picker: pick: score is how Envoy picks with process: envoy; this picker's "
                f"process is {self.process} (it always scores)"
            )
        mine = self._changed(("prefix_bytes", "load_bound"))
        if self.process != "envoy" and mine:
            raise ValueError(
                f"picker: {', '.join(mine)} only apply with process: envoy (Envoy's prefix "
                f"hash); this picker's process is {self.process}"
            )
        return self

    @model_validator(mode="after")
    def _external_alone(self) -> Picker:
        if self.external is not None and self.transport != "ext_proc":
            raise ValueError(
                f"picker: transport {self.transport} is for inferway's own picker; external: "
                f"{self.external} is asked over GAIE's ext_proc protocol (drop transport)"
            )
        if self.external is not None:
            own = self._changed(_OWN_ONLY)
            if own:
                raise ValueError(
                    f"picker: {', '.join(own)} configure inferway's own picker; with "
                    f"external: {self.external} give only external, fail and timeout"
                )
        lane = split_host_port(self.http_listen)
        if self.transport == "http" and lane[1] != 0 and lane == split_host_port(self.listen):
            raise ValueError(
                f"picker: http_listen {self.http_listen} is listen's address: transport http "
                "serves HTTP there and gRPC on listen, give them different ports"
            )
        if self.metrics_path is not None and not self.metrics_path.startswith("/"):
            raise ValueError(f"metrics_path must start with '/', got {self.metrics_path!r}")
        return self


def default_http_listen(listen: str) -> str | None:
    """The ``http_listen`` a picker on ``listen`` gets when it names none (None: ``listen``
    has no next port)."""
    try:
        return _next_port(listen)
    except ValueError:
        return None
