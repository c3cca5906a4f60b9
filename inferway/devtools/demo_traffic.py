"""The demo's traffic: inference requests sent through Envoy, and whether their split matches.

The split is judged statistically, not exactly: a few hundred requests drawn at 10% canary
rarely land on exactly 10%, so a result counts as matching the policy when it lies within the
binomial noise such a sample has.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from inferway.devtools.demo_backend import DEMO_FEATURES, DEMO_MODEL
from inferway.policies import Policy

__all__ = [
    "CONCURRENCY",
    "build_infer_request",
    "close_to_expected",
    "sample_traffic",
    "split_ok",
]

CONCURRENCY = 16


def build_infer_request(rng: random.Random, rows: int = 1) -> dict[str, object]:
    """A KServe v2 JSON inference request for the demo model: ``rows`` random input rows."""
    data = [round(rng.uniform(-1.0, 1.0), 4) for _ in range(rows * DEMO_FEATURES)]
    return {
        "inputs": [{"name": "x", "shape": [rows, DEMO_FEATURES], "datatype": "FP32", "data": data}]
    }


async def sample_traffic(
    url: str, count: int, console: Console, label: str, client_options: dict[str, Any] | None = None
) -> tuple[Counter[str], float]:
    """Send ``count`` inference requests through Envoy (at most CONCURRENCY at once) and count
    the model versions that answered."""
    rng = random.Random(count)
    seen: Counter[str] = Counter()
    limit = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    started = time.perf_counter()
    progress = Progress(
        TextColumn("  {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task(label, total=count)
        async with httpx.AsyncClient(
            timeout=5.0, limits=limits, trust_env=False, **(client_options or {})
        ) as client:

            async def one(index: int) -> None:
                async with limit:
                    try:
                        response = await client.post(
                            f"{url}/v2/models/{DEMO_MODEL}/infer", json=build_infer_request(rng)
                        )
                        if response.status_code == 200:
                            seen[f"v{response.json().get('model_version', '?')}"] += 1
                        else:
                            seen[f"HTTP {response.status_code}"] += 1
                    except httpx.HTTPError as exc:
                        seen[type(exc).__name__] += 1
                    progress.advance(task)

            await asyncio.gather(*(one(i) for i in range(count)))
    return seen, time.perf_counter() - started


def close_to_expected(observed_pct: float, expected_pct: float, total: int) -> bool:
    """Within 4 standard deviations of a binomial sample (plus 1 point of slack)."""
    if total == 0:
        return False
    p = expected_pct / 100.0
    sigma = 100.0 * math.sqrt(max(p * (1 - p), 1e-9) / total)
    return abs(observed_pct - expected_pct) <= 4 * sigma + 1.0


def split_ok(seen: Counter[str], policy: Policy) -> bool:
    total = sum(seen.values())
    expected = {b.service.removeprefix("model-"): b.weight for b in policy.routes[0].backends}
    if set(seen) - set(expected):
        return False
    return all(
        close_to_expected(100.0 * seen.get(v, 0) / max(total, 1), want, total)
        for v, want in expected.items()
    )
