"""``picker: {process: envoy, pick: score}``: the scoring picker run in Envoy's Lua filter.

Why: asking a picker process is what costs a scored pick its time (the hop: about 0.6 ms at
p50 and 2 ms at p99 held in Envoy at 500 req/s on two shared cores, bench/picker_transport.py).
The pick itself is a few dozen microseconds of arithmetic, so it runs where the request
already is. ``picker_score.lua`` makes the pick ``gateway/picker/core/picker.py`` makes: the
same scorers, weights, saturation limits, shedding (429), fallbacks and in-flight counting
between scrapes; its answer is the same ``x-gateway-destination-endpoint`` header, read by the
same ``override_host`` policy as an asked picker's (the service's own balancing is the
fallback, as with ``fail: open``).

What differs from the picker process, and why it is acceptable:

- **Per worker.** Each Envoy worker thread has its own Lua state, so its own prefix index,
  in-flight counts and sessions. A prompt no open replica holds in a worker's index goes to
  its home (the first replica in the prompt's own hash order with a depth at most
  ``load_bound`` times the least loaded's, plus one), so workers and Envoys that see the pool
  alike put it in one place; equal totals are broken by the same order. Between scrapes each
  worker counts only its own requests, so one worker is the configuration to run in front of
  an LLM pool (``inferway run --envoy-concurrency 1``; status warns otherwise). The scraped
  queue is the whole server's, every worker's and every Envoy's traffic together.
- **The prompt's blocks** are hashed over the request body as sent (32 bits, chained: a block
  matches only with everything before it) from its ``messages`` or ``prompt`` on, not
  over the parsed text: the same prompt sent the same way matches; the LoRA scorer reads the
  body's ``model``.
- **Scraped load reaches Envoy with the routes.** The gateway scrapes the replicas
  (gateway/picker/in_envoy.py) and, when a replica's queue, KV-cache use (to 0.05) or adapters
  change, pushes them as the route's metadata under the filter's name (``v`` changes whenever
  anything does; the filter rereads the rest only then): one route update per scrape at most.
- **A request is in flight** from its pick to its answer: a stream's (server-sent events) last
  byte, any other answer's headers (an LLM server sends them once it has generated). One that
  ends without an answer (the client gone) is counted until ``IN_FLIGHT_EXPIRY_S``, and a
  scrape corrects the queue meanwhile.
- **Explained** in the request's dynamic metadata (``inferway.picker``: ``winner``, and
  ``reason``: the winner's weighted scores, depth and prefix blocks matched, the runner-up,
  how many were saturated), which the trace span carries as ``inferway.picker.winner`` /
  ``.reason`` and an access log can write (``%DYNAMIC_METADATA(inferway.picker:reason)%``).

The index is bounded: ``BLOCKS_PER_ENDPOINT`` blocks per replica per worker, least recently
sent first out (the picker process's LRU order), about 280 bytes a block in Lua. The prompt is
hashed four bytes a step. Only the best ``fallbacks + 1`` candidates are kept per pick.
"""

from __future__ import annotations

import json
import zlib
from importlib import resources

from google.protobuf import struct_pb2

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.extensions.filters.http.lua.v3 import lua_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.resolve.ir.picker import PickerIR
from inferway.xds.translate._protos import pack

__all__ = [
    "BLOCKS_PER_ENDPOINT",
    "BLOCK_BYTES",
    "IN_FLIGHT_EXPIRY_S",
    "MAX_BLOCKS",
    "NAMESPACE",
    "TICKETS",
    "build_score_filter",
    "load_metadata",
    "score_script",
]

NAMESPACE = "inferway.picker"
"""The dynamic metadata namespace each pick is written to (``winner``, ``reason``; the trace
tags and an access log read them)."""
TICKETS = "inferway.picker.ticket"
"""The pick's ticket (``t``), for the response to end it: a namespace of its own, so reading
it back converts one number, not the reason."""
BLOCK_BYTES = 256
MAX_BLOCKS = 128
"""The prompt's first 32 KiB count for prefix affinity (the picker process's bound too)."""
BLOCKS_PER_ENDPOINT = 4096
MAX_SESSIONS = 65536
IN_FLIGHT_EXPIRY_S = 600
SCAN_BYTES = 65536
"""How far into the body ``messages`` / ``prompt`` is looked for."""
KV_STEP = 0.05
"""KV-cache use is pushed to Envoy to this step: a decoding server's use moves every scrape,
and a change below it would not change a pick."""


def _lua(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(float(value)) if isinstance(value, float) else str(value)
    return json.dumps(str(value))  # a Lua string literal for ASCII text


def score_script(picker: PickerIR) -> str:
    """The Lua filter's code: ``picker``'s settings, then picker_score.lua."""
    queue, kv, prefix, lora, session = picker.weights
    settings = {
        "W_QUEUE": queue,
        "W_KV": kv,
        "W_PREFIX": prefix,
        "W_LORA": lora,
        "W_SESSION": session,
        "QUEUE_LIMIT": picker.queue_limit,
        "KV_CACHE_LIMIT": picker.kv_cache_limit,
        "FALLBACKS": picker.fallbacks,
        "SHED": picker.shed,
        "SESSION_HEADER": picker.session_header.lower() if session > 0 else "",
        "NAMESPACE": NAMESPACE,
        "TICKETS": TICKETS,
        "BLOCK_BYTES": BLOCK_BYTES,
        "MAX_BLOCKS": MAX_BLOCKS,
        "BLOCKS_PER_ENDPOINT": BLOCKS_PER_ENDPOINT,
        "MAX_SESSIONS": MAX_SESSIONS,
        "IN_FLIGHT_EXPIRY_S": IN_FLIGHT_EXPIRY_S,
        "SCAN_BYTES": SCAN_BYTES,
        "HOME_LOAD_BOUND": picker.load_bound,
    }
    head = "".join(f"local {name} = {_lua(value)}\n" for name, value in settings.items())
    body = resources.files("inferway.xds.translate").joinpath("picker_score.lua").read_text()
    return head + body


def build_score_filter(name: str, picker: PickerIR) -> hcm_pb2.HttpFilter:
    source = base_pb2.DataSource(inline_string=score_script(picker))
    return hcm_pb2.HttpFilter(name=name, typed_config=pack(lua_pb2.Lua(default_source_code=source)))


def load_metadata(picker: PickerIR) -> struct_pb2.Struct:
    """The route metadata the Lua picker reads (under its filter's name): the replicas
    (``e``), their queue (``d``), KV-cache use (``k``, to ``KV_STEP``), adapters running and
    waiting (``r``, ``w``, comma-separated) and adapter slots (``m``); -1: not known. ``v``
    changes whenever any of it does."""
    replicas = picker.replicas
    content: dict[str, list[str] | list[float]] = {
        "e": [r.address for r in replicas],
        "d": [-1.0 if r.depth is None else float(r.depth) for r in replicas],
        "k": [
            -1.0 if r.kv_cache is None else round(round(r.kv_cache / KV_STEP) * KV_STEP, 2)
            for r in replicas
        ],
        "r": [",".join(r.loras_running) for r in replicas],
        "w": [",".join(r.loras_waiting) for r in replicas],
        "m": [-1.0 if r.max_lora is None else float(r.max_lora) for r in replicas],
    }
    version = zlib.crc32(json.dumps(content, sort_keys=True).encode())
    metadata = struct_pb2.Struct()
    metadata.update({"v": float(version), **content})
    return metadata
