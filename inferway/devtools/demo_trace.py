"""The demo's proof of tracing: one request followed from Envoy to the batch that computed it.

Spans reach the demo's own OTLP receiver from three places at their own pace (Envoy flushes on
a timer, the backend's exporter on ``force_flush``), so the demo waits for the whole chain
rather than for a number of spans.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import httpx
from opentelemetry.sdk.trace import TracerProvider
from rich.console import Console

from inferway.devtools.demo_backend import DEMO_MODEL
from inferway.devtools.demo_traffic import build_infer_request
from inferway.devtools.otlp_receiver import OtlpReceiver, ReceivedSpan
from inferway.devtools.trace_tree import build_trace_tree, find_trace_id, render_trace_tree

__all__ = ["BACKEND_SERVICE", "GATEWAY_SERVICE", "show_trace"]

GATEWAY_SERVICE = "inferway-gateway"
BACKEND_SERVICE = "inferway-backend"


def _trace_complete(request_id: str) -> Callable[[list[ReceivedSpan]], bool]:
    """True once the request's trace holds Envoy's span, the backend's span and a batch span
    linked to it."""

    def check(spans: list[ReceivedSpan]) -> bool:
        trace_id = find_trace_id(spans, request_id)
        if trace_id is None:
            return False
        own = [s for s in spans if s.trace_id == trace_id]
        linked = {sid for s in spans for t, sid in s.links if t == trace_id}
        return any(s.service == GATEWAY_SERVICE for s in own) and any(
            s.service == BACKEND_SERVICE and s.span_id in linked for s in own
        )

    return check


async def show_trace(
    console: Console,
    url: str,
    receiver: OtlpReceiver,
    provider: TracerProvider,
    client_options: dict[str, Any] | None = None,
) -> bool:
    """Send one request and print its trace: Envoy span -> backend request span -> batch."""
    async with httpx.AsyncClient(timeout=5.0, trust_env=False, **(client_options or {})) as client:
        response = await client.post(
            f"{url}/v2/models/{DEMO_MODEL}/infer", json=build_infer_request(random.Random(7))
        )
    request_id = response.headers.get("x-request-id", "")
    if response.status_code != 200 or not request_id:
        console.print(f"[yellow]! traced request answered HTTP {response.status_code}[/yellow]")
        return False
    await asyncio.to_thread(provider.force_flush, 5000)
    try:
        spans = await receiver.wait_for(_trace_complete(request_id), timeout=5.0)
    except TimeoutError as exc:
        console.print(f"[yellow]! the trace did not arrive: {exc}[/yellow]")
        return False
    trace_id = find_trace_id(spans, request_id) or ""
    console.print(
        render_trace_tree(
            build_trace_tree(spans, trace_id),
            title=f"trace of one request  [dim](x-request-id {request_id}, trace {trace_id})[/dim]",
        )
    )
    return True
