"""One chat completion through a test gateway whose replicas are ``ControlledBackend`` s: a
tenant's long system prompt (its shared prefix, for the picker's prefix scorer) and a short
question; the answer says which replica served it."""

from __future__ import annotations

import asyncio
import json

from tests.traffic_harness import TrafficGateway

__all__ = ["SYSTEM", "chat"]

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
