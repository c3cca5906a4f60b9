"""Model servers' own load metrics, read from their Prometheus text, under the names the
Gateway API Inference Extension's model-server protocol lists (vLLM, SGLang) and llama.cpp's
``llamacpp:*``: the queue, the running batch, KV-cache use and the LoRA adapters loaded; and,
for status, the server's own prefix-cache hit rate where it says it (vLLM v1's
``prefix_cache_hits``/``prefix_cache_queries`` counters, vLLM v0's and SGLang's gauges).

One server speaks one dialect; the first family found decides which. Missing metrics stay
``None`` (unknown), never zero: a scorer treats unknown as neutral, not as idle.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ServerMetrics", "parse_metrics"]

_QUEUE = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
_KV_CACHE = (
    "vllm:kv_cache_usage_perc",  # vLLM v1
    "vllm:gpu_cache_usage_perc",  # vLLM v0, GAIE's table
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
)
_LORA = "vllm:lora_requests_info"
_PREFIX_HITS, _PREFIX_QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
_PREFIX_HIT_RATE = ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate")


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """One scrape of one server. ``kv_cache`` is a fraction (0..1)."""

    waiting: float | None = None
    running: float | None = None
    kv_cache: float | None = None
    loras_running: frozenset[str] = frozenset()
    loras_waiting: frozenset[str] = frozenset()
    max_lora: int | None = None
    dialect: str = "none"
    prefix_hit_rate: float | None = None
    """The server's own prefix-cache hits over lookups (0..1) since it started, where it says
    it; shown in status, never scored."""


def _adapters(value: str | None) -> frozenset[str]:
    return frozenset(a.strip() for a in (value or "").split(",") if a.strip())


def parse_metrics(text: str) -> ServerMetrics:
    """The load metrics in ``text`` (a ``/metrics`` answer); raises ``ValueError`` naming the
    line when the text is not Prometheus' exposition format."""
    found: dict[str, float] = {}
    lora_stamp = -1.0
    lora: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in (_PREFIX_HITS, _PREFIX_QUERIES):
                found[name] = found.get(name, 0.0) + float(sample.value)
            elif name in _PREFIX_HIT_RATE:
                found.setdefault(name, float(sample.value))
            elif name in _QUEUE or name in _RUNNING or name in _KV_CACHE:
                found[name] = found.get(name, 0.0) + float(sample.value)
            elif name == _LORA and float(sample.value) > lora_stamp:
                lora_stamp, lora = float(sample.value), dict(sample.labels)  # the latest wins
    dialect = next(
        (n.split(":", 1)[0] for n in (*_QUEUE, *_RUNNING, *_KV_CACHE) if n in found), "none"
    )

    def first(names: tuple[str, ...]) -> float | None:
        return next((found[n] for n in names if n in found), None)

    queries = found.get(_PREFIX_QUERIES)
    if queries:
        hit_rate: float | None = found.get(_PREFIX_HITS, 0.0) / queries
    else:
        hit_rate = first(_PREFIX_HIT_RATE)
    max_lora = lora.get("max_lora", "")
    return ServerMetrics(
        waiting=first(_QUEUE),
        running=first(_RUNNING),
        kv_cache=first(_KV_CACHE),
        loras_running=_adapters(lora.get("running_lora_adapters")),
        loras_waiting=_adapters(lora.get("waiting_lora_adapters")),
        max_lora=int(max_lora) if max_lora.strip().isdigit() else None,
        dialect=dialect,
        prefix_hit_rate=hit_rate,
    )
