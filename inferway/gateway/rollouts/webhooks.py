"""Rollout webhooks: POST a decision's JSON to the user's URL, with a timeout and retries.

A ``pre-step`` hook is a gate (2xx lets the step happen); the others are notifications whose
failure is logged and changes nothing. Calls run at the edge, never inside the controller.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from inferway.policies.rollouts import RolloutWebhook

__all__ = ["call_webhook"]

log = logging.getLogger(__name__)

RETRY_DELAY_S = 0.2
"""Pause before retry ``n`` is ``n * RETRY_DELAY_S``: short, a gate is waited on."""


async def call_webhook(hook: RolloutWebhook, payload: dict[str, Any]) -> str | None:
    """None when the hook answered 2xx (within its retries); else why not."""
    timeout = aiohttp.ClientTimeout(total=hook.timeout)
    reason = "not called"
    for attempt in range(hook.retries + 1):
        if attempt:
            await asyncio.sleep(attempt * RETRY_DELAY_S)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout, trust_env=False) as session,
                session.post(hook.url, json=payload) as response,
            ):
                body = (await response.text())[:200]
                if 200 <= response.status < 300:
                    return None
                reason = f"{hook.type} webhook {hook.url} answered {response.status}: {body}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            reason = f"{hook.type} webhook {hook.url}: {exc or type(exc).__name__}"
    log.warning("%s (after %d attempts)", reason, hook.retries + 1)
    return reason
