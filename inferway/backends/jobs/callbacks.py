"""Delivering a finished job to its callback URL: one POST of the job document, tried again
with doubling waits when the receiver fails, times out or cannot be reached.

Any 2xx answer is a delivery. A 4xx other than 408/429 says the receiver will never take this
document, so it is not retried. The outcome (attempts, last error) is recorded on the job.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

__all__ = ["CallbackOutcome", "check_callback_url", "deliver_callback"]

log = logging.getLogger("inferway.backends.jobs")

_RETRIED_4XX = frozenset({408, 429})


@dataclass(frozen=True, slots=True)
class CallbackOutcome:
    attempts: int
    error: str | None
    """None: delivered."""


def check_callback_url(url: str) -> str:
    """The URL, if it is an absolute http(s) URL with a host (ValueError saying why not)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"callback URL must be an absolute http:// or https:// URL, got {url!r}")
    return url


async def deliver_callback(
    session: aiohttp.ClientSession,
    url: str,
    document: dict[str, Any],
    *,
    timeout_s: float,
    retries: int,
    backoff_s: float,
) -> CallbackOutcome:
    """POST ``document`` as JSON to ``url``, at most ``1 + retries`` times."""
    body = orjson.dumps(document)
    error: str | None = None
    for attempt in range(1, retries + 2):
        try:
            async with session.post(
                url,
                data=body,
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                allow_redirects=False,
            ) as resp:
                if 200 <= resp.status < 300:
                    return CallbackOutcome(attempt, None)
                error = f"HTTP {resp.status} from the receiver"
                if 400 <= resp.status < 500 and resp.status not in _RETRIED_4XX:
                    return CallbackOutcome(attempt, error + " (not retried)")
        except TimeoutError:
            error = f"no answer within {timeout_s:g}s"
        except aiohttp.ClientError as exc:
            error = f"{type(exc).__name__}: {exc}"
        if attempt <= retries:
            log.info("callback to %s failed (%s); retrying", url, error)
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
    log.warning("callback to %s not delivered after %d attempts: %s", url, retries + 1, error)
    return CallbackOutcome(retries + 1, error)
