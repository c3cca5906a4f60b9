"""A request Envoy's Lua filter admitted itself (xds/translate/llm_local_admit.py) and told the
processor of, without waiting: the stream the processor registers for it, from the headers
of that notice (what ``admit`` would have worked out from the body)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from urllib.parse import unquote

from inferway.gateway.llm.admission_http import forwarded_headers
from inferway.gateway.llm.client_key import client_key
from inferway.gateway.llm.exchange import LlmSettings, LlmStream
from inferway.gateway.llm.request import LlmRequest, operation_of
from inferway.xds.translate.llm_stream import (
    FORWARDED_STARTED,
)

__all__ = ["LOCAL_ID_PREFIX", "admitted_at", "stream_of_notice"]

LOCAL_ID_PREFIX = "e"
"""The ids the Lua filter gives the streams it admits (the processor's own have its pid)."""


def admitted_at(sid: str) -> float | None:
    """When Envoy admitted the stream ``sid`` (its wall clock, seconds) for one of the Lua
    filter's ids (``e<worker>-<microseconds>-<sequence>``); None for any other id."""
    if not sid.startswith(LOCAL_ID_PREFIX):
        return None
    parts = sid[len(LOCAL_ID_PREFIX) :].split("-")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return int(parts[1]) / 1e6


class BadNotice(ValueError):
    """A notice without what a stream needs (not from inferway's filter)."""


def stream_of_notice(
    forwarded: Mapping[str, str], settings: LlmSettings, clock: Callable[[], float]
) -> LlmStream:
    sid = forwarded.get("x-inferway-id", "")
    served = unquote(forwarded.get("x-inferway-served", ""))
    if not sid.startswith(LOCAL_ID_PREFIX) or not served:
        raise BadNotice(f"a notice without an id or a model: {sorted(forwarded)}")
    headers = forwarded_headers(forwarded, settings.client_header)
    client = client_key(headers, settings.client_header, hashed=settings.hash_client)
    stream = LlmStream(client, operation_of(headers[":path"]), clock())
    stream.wall_started = time.time()
    stream.started_at_wall(forwarded.get(FORWARDED_STARTED, ""))
    drop = forwarded.get("x-inferway-drop-usage") == "1"
    request = LlmRequest(
        model=served,
        requested_model=unquote(forwarded.get("x-inferway-requested", "")) or served,
        stream=forwarded.get("x-inferway-stream") == "1",
        shows_usage=not drop,
        body=None,
    )
    try:
        prompt_bytes = int(forwarded.get("x-inferway-prompt-bytes", "0"))
    except ValueError:
        prompt_bytes = 0
    stream.on_request(request, prompt_bytes, settings.routes.get(served, ""))
    stream.id = sid
    return stream
