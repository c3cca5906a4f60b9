"""One chat completion through a test gateway whose replicas are ``ControlledBackend`` s: a
tenant's long system prompt (its shared prefix, for the picker's prefix scorer) and a short
question; the answer says which replica served it."""

from __future__ import annotations

import asyncio
import json

from tests.traffic_harness import TrafficGateway

__all__ = ["SYSTEM", "chat", "llamacpp_metrics", "picker_policy"]

_POLICY = """
version: 1
listeners:
  - name: ingress
    port: {listener_port}
services:
  - name: llm
    endpoints: ["127.0.0.1:{a}", "127.0.0.1:{b}", "127.0.0.1:{c}"]
    picker:
PICKER@OTHER_SERVICE@routes:
  - name: chat
    match:
      path:
        prefix: /v1/
    backends:
      - service: llm
@OTHER_ROUTE@"""
_OTHER_SERVICE = """  - name: plain
    endpoints: ["127.0.0.1:{c}"]
"""
_OTHER_ROUTE = """  - name: other
    match:
      path:
        prefix: /other/
    backends:
      - service: plain
"""


def picker_policy(picker: str, *, other_route: bool = True) -> str:
    """A gateway policy (``TrafficGateway``'s placeholders left in) for the three controlled
    replicas ``a``, ``b``, ``c`` of service ``llm`` with ``picker`` (its lines, indented six
    spaces) on route ``chat`` (``/v1/``); with ``other_route``, also ``/other/`` to a service
    without a picker (replica ``c`` again)."""
    return (
        _POLICY.replace("PICKER", picker)
        .replace("@OTHER_SERVICE@", _OTHER_SERVICE if other_route else "")
        .replace("@OTHER_ROUTE@", _OTHER_ROUTE if other_route else "")
    )


def llamacpp_metrics(deferred: int) -> str:
    """llama.cpp's queue metrics, as its server exposes them (one request running)."""
    return (
        "# TYPE llamacpp:requests_deferred gauge\n"
        f"llamacpp:requests_deferred {deferred}\n"
        "# TYPE llamacpp:requests_processing gauge\n"
        "llamacpp:requests_processing 1\n"
    )


SYSTEM = "You are the careful assistant of tenant {}. " * 60
"""About 2,600 characters per tenant: many prefix blocks."""


async def chat(
    gw: TrafficGateway, tenant: str, question: str, timeout: float = 10
) -> tuple[int, str | None]:
    """(status, the replica that answered) of one chat completion, within ``timeout``."""
    assert gw.session is not None
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": SYSTEM.replace("{}", tenant)},
            {"role": "user", "content": question},
        ],
    }
    async with asyncio.timeout(timeout):
        async with gw.session.post(f"{gw.url}/v1/chat/completions", json=body) as response:
            text = await response.text()
            served = json.loads(text).get("backend") if response.status == 200 else None
            return response.status, served
