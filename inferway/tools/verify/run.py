"""One verify run from start to verdict: generate the cases from the policy's routes, send
them, judge them; then the load run and the cost read-out; one document out (report.py).
Library code: the CLI (cli.py) parses options into :class:`VerifySettings` and calls
:func:`run_verify`; tests and a rollout gate can call it the same way."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferway.tools.verify.cases import generate_probes
from inferway.tools.verify.cost import read_cost
from inferway.tools.verify.expect import Outcome, expect
from inferway.tools.verify.functional import run_functional, summarize
from inferway.tools.verify.load import LoadReport, LoadSettings, run_load
from inferway.tools.verify.openai_checks import OpenAITarget, run_openai_checks
from inferway.tools.verify.openai_load import LLMLoadReport, run_llm_load
from inferway.tools.verify.report import VerifyRun, run_document
from inferway.tools.verify.routes import VerifyRoute

__all__ = ["VerifySettings", "run_verify"]


@dataclass(frozen=True)
class VerifySettings:
    requests: int = 1000
    concurrency: int = 8
    min_correct: float = 99.9
    alpha: float = 0.001
    users: int | None = None
    """None: no load run."""
    duration_s: float = 60.0
    spawn_rate: float | None = None
    """None: every user started within the first second."""
    think_time_s: float = 0.0
    exclude_ramp: bool = False
    """Judge only requests sent once every user has started."""
    load_cpus: tuple[int, ...] = ()
    """CPUs the locust process may use (empty: any)."""
    sla_p99_ms: float = 50.0
    max_error_percent: float = 0.5
    prometheus: str | None = None
    admin: str | None = None
    min_utilization: float | None = None
    png: Path | None = None
    seed: int = 0
    llm_max_tokens: int = 16
    """Tokens each streamed request of the OpenAI load run asks for."""


async def run_verify(
    policy: str,
    gateway: str,
    routes: list[VerifyRoute],
    settings: VerifySettings,
    openai: list[OpenAITarget] | None = None,
) -> dict[str, Any]:
    """The verdict document (docs/verify.md) of ``gateway`` against ``routes`` and the
    ``openai`` routes (openai_checks.py; their load run beside locust's with ``users``)."""
    openai = openai or []
    probes, coverage = generate_probes(routes, seed=settings.seed)
    silent = {r.name for r in routes if not r.served_by}
    for name in sorted(silent):
        coverage.uncovered.append(f"route {name}: served_by_headers off, its pool is not visible")
    probes = [p for p in probes if expect(routes, p).route not in silent]
    # a policy of openai routes only has nothing for the generic check: its bar is n/a
    observations = (
        await run_functional(
            gateway,
            routes,
            probes,
            requests=settings.requests,
            concurrency=settings.concurrency,
        )
        if probes
        else []
    )
    functional = summarize(
        observations, routes, coverage, bar=settings.min_correct, alpha=settings.alpha
    )
    checks = await run_openai_checks(gateway, openai) if openai else []
    llm_load: LLMLoadReport | None = None
    if openai and settings.users is not None:
        llm_load = await run_llm_load(
            gateway,
            openai,
            users=settings.users,
            duration_s=settings.duration_s,
            max_tokens=settings.llm_max_tokens,
            max_error_percent=settings.max_error_percent,
        )
    load: LoadReport | None = None
    png: str | None = None
    if settings.users is not None and (routes or not openai):
        served = [p for p in probes if expect(routes, p).outcome is Outcome.pool]
        load_settings = LoadSettings(
            users=settings.users,
            duration_s=settings.duration_s,
            spawn_rate=settings.spawn_rate or float(settings.users),
            think_time_s=settings.think_time_s,
            sla_p99_ms=settings.sla_p99_ms,
            max_error_percent=settings.max_error_percent,
            steady_only=settings.exclude_ramp,
            cpus=settings.load_cpus,
        )
        load = await asyncio.to_thread(run_load, gateway, served or probes, load_settings)
        if settings.png is not None:
            from inferway.tools.verify.plot import write_latency_png

            png = str(write_latency_png(load.result, settings.sla_p99_ms, settings.png))
    cost = await asyncio.to_thread(
        read_cost, settings.prometheus, settings.admin, min_utilization=settings.min_utilization
    )
    run = VerifyRun(policy, gateway, functional, load, cost, png, checks, llm_load)
    return run_document(run)
