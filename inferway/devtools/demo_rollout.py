"""The demo's rollout scene (``inferway demo --rollout``): the rollout controller, not a person,
moves the weights. A good v2 walks the steps to 100% while the analysis compares it with v1;
then a bad v3 (a share of its answers are 503s, ``demo_fault``) is rolled back to v2. Every
decision is printed as it happens: step, weight, the window's per-version counts, and the
verdict of each check with its test statistic and thresholds.

The analysis interval is 1 s and the only check is the error rate (Envoy's counters are read
live; its latency histograms only reach the admin API at each 5 s stats flush), so each
rollout decides within seconds at the demo's traffic.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import yaml
from rich.console import Console
from rich.table import Table

from inferway.controllers.rollout.config import TOTAL_WEIGHT
from inferway.controllers.rollout.state import Decision
from inferway.devtools.demo_backend import DEMO_MODEL
from inferway.devtools.demo_fault import DemoFault
from inferway.devtools.demo_traffic import CONCURRENCY, build_infer_request
from inferway.gateway.admin_documents import RolloutStatus
from inferway.gateway.rollouts.driver import RolloutDriver, UnknownRolloutError
from inferway.policies import Policy, dump_policy, load_policy_text

__all__ = [
    "BAD_CANARY_FAULT",
    "ROLLOUT_STEPS",
    "DemoLoad",
    "build_rollout_policy",
    "format_decision",
    "run_rollout_scene",
]

ROLLOUT_STEPS = (20, 50, 100)
"""Percent of the canary at each step: few and coarse, so the scene fits in seconds."""
BAD_CANARY_FAULT = DemoFault(error_rate=0.05)
"""The bad v3: 5% of its answers are 503s."""
MAX_INCREASE = "2%"
"""The error-rate check: the canary may fail at most 2 points more often than stable."""
SCENE_TIMEOUT_S = 45.0
"""Per rollout: longer means the analysis could not decide at the traffic the demo makes."""
ENDED = frozenset({"promoted", "rolled_back", "failed"})


def build_rollout_policy(base: Policy, name: str, stable: str, canary: str) -> Policy:
    """``base`` with its inference route at 100% ``stable`` / 0% ``canary`` and one rollout
    moving it (earlier rollouts replaced), loaded as the gateway will load the file."""
    data = yaml.safe_load(dump_policy(base))
    data["routes"][0]["backends"] = [
        {"service": stable, "weight": 100},
        {"service": canary, "weight": 0},
    ]
    data["rollouts"] = [
        {
            "name": name,
            "route": data["routes"][0]["name"],
            "stable": stable,
            "canary": canary,
            "steps": list(ROLLOUT_STEPS),
            "analysis": {
                "interval": "1s",
                "metrics": [{"name": "error-rate", "max_increase": MAX_INCREASE}],
            },
            "on_failure": "rollback",
        }
    ]
    return load_policy_text(yaml.safe_dump(data, sort_keys=False), "policy.yaml")


def _version(service: str) -> str:
    return service.removeprefix("model-")


def _verdict_text(verdict: dict[str, Any]) -> str:
    inputs, threshold = verdict["inputs"], verdict["threshold"]
    statistic = verdict["statistic"]
    stat = "" if statistic is None else f", LLR {statistic:+.2f}"
    bounds = ""
    if "pass_llr" in threshold and "fail_llr" in threshold:
        bounds = f" (pass <= {threshold['pass_llr']:.2f}, fail >= {threshold['fail_llr']:.2f})"
    counts = ""
    if "canary_trials" in inputs:
        counts = (
            f"; canary {inputs['canary_events']}/{inputs['canary_trials']} errors"
            f" vs stable {inputs.get('stable_errors', 0)}/{inputs.get('stable_requests', 0)}"
        )
    return f"{verdict['check']}: {verdict['result']} ({verdict['test']}{stat}{bounds}{counts})"


def format_decision(decision: Decision, stable: str, canary: str) -> list[str]:
    """One decision as the scene prints it: a line with step, weight, the window's counts per
    version and what was decided and why, then one line per check's verdict. Steps count
    from 0, as in ``inferway rollout status`` and the decisions' reasons."""
    w = decision.window
    window = ""
    if w:
        window = (
            f" · window {_version(stable)} {w.get('stable_requests', 0)} req "
            f"{w.get('stable_errors', 0)} err, {_version(canary)} "
            f"{w.get('canary_requests', 0)} req {w.get('canary_errors', 0)} err"
        )
    percent = decision.weight * 100 / TOTAL_WEIGHT
    head = (
        f"step {decision.step} · {_version(canary)} at {percent:g}%{window}"
        f" · {decision.action}: {decision.reason}"
    )
    return [head, *(f"    {_verdict_text(v.to_json())}" for v in decision.verdicts)]


class DemoLoad:
    """Steady inference traffic through Envoy while a rollout runs (the analysis needs
    requests on both versions); counts answers by model version or status."""

    def __init__(self, url: str, client_options: dict[str, Any] | None = None) -> None:
        self.url = f"{url}/v2/models/{DEMO_MODEL}/infer"
        self.counts: Counter[str] = Counter()
        self._options = client_options or {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None

    async def _worker(self, client: httpx.AsyncClient, seed: int) -> None:
        rng = random.Random(seed)
        while not self._stop.is_set():
            try:
                response = await client.post(self.url, json=build_infer_request(rng))
                if response.status_code == 200:
                    self.counts[f"v{response.json().get('model_version', '?')}"] += 1
                else:
                    self.counts[f"HTTP {response.status_code}"] += 1
            except httpx.HTTPError as exc:
                self.counts[type(exc).__name__] += 1

    async def __aenter__(self) -> DemoLoad:
        self._client = httpx.AsyncClient(timeout=5.0, trust_env=False, **self._options)
        workers = CONCURRENCY // 2
        self._tasks = [asyncio.create_task(self._worker(self._client, i)) for i in range(workers)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        if self._client is not None:
            await self._client.aclose()


def _counts_table(title: str, before: Counter[str], after: Counter[str]) -> Table:
    seen = after - before
    table = Table(title=title, title_justify="left")
    table.add_column("answered by")
    table.add_column("requests", justify="right")
    for key in sorted(seen):
        table.add_row(key, str(seen[key]))
    return table


async def _wait_ended(driver: RolloutDriver, name: str) -> RolloutStatus | None:
    deadline = time.monotonic() + SCENE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            status = driver.status(name, history=0)
        except UnknownRolloutError:  # the edit has not been applied yet
            status = None
        if status is not None and status["phase"] in ENDED:
            return status
        await asyncio.sleep(0.2)
    return None


async def _one_rollout(
    console: Console,
    driver: RolloutDriver,
    load: DemoLoad,
    write: Callable[[Policy], None],
    policy: Policy,
    want: str,
) -> bool:
    spec = policy.rollouts[0]
    before = Counter(load.counts)
    started = time.perf_counter()
    write(policy)
    status = await _wait_ended(driver, spec.name)
    if status is None:
        console.print(f"[red]✗ {spec.name} did not end within {SCENE_TIMEOUT_S:.0f}s[/red]")
        return False
    took = time.perf_counter() - started
    mark = "[green]✓[/green]" if status["phase"] == want else "[red]✗[/red]"
    console.print(
        f"{mark} {spec.name}: [bold]{status['phase']}[/bold] in {took:.1f}s "
        f"({_version(spec.canary)} at {status['weight_percent']:g}%): {status['reason']}",
        markup=True,
        highlight=False,
    )
    console.print(_counts_table(f"Answers during {spec.name}", before, load.counts))
    return bool(status["phase"] == want)


async def run_rollout_scene(
    console: Console,
    url: str,
    driver: RolloutDriver,
    base: Policy,
    write: Callable[[Policy], None],
    client_options: dict[str, Any] | None = None,
) -> bool:
    """Roll out v2 over v1 (it must be promoted), then v3 over v2 (it must be rolled back),
    each by writing the policy file with ``write``; True when both ended as they should."""
    names = {"demo-v2": ("model-v1", "model-v2"), "demo-v3": ("model-v2", "model-v3")}

    def show(name: str, decision: Decision) -> None:
        stable, canary = names.get(name, ("stable", "canary"))
        head, *verdicts = format_decision(decision, stable, canary)
        console.print(f"  [cyan]{name}[/cyan] {head}", highlight=False)
        for line in verdicts:
            console.print(line, markup=False, highlight=False)

    driver.add_hook(show)
    console.print(
        f"[bold]rollout[/bold]: steps {', '.join(f'{s}%' for s in ROLLOUT_STEPS)}, judged every "
        f"1s on error rate (canary vs stable, max increase {MAX_INCREASE}); "
        f"v3 answers {BAD_CANARY_FAULT.error_rate:.0%} of its requests with 503"
    )
    async with DemoLoad(url, client_options) as load:
        good = await _one_rollout(
            console, driver, load, write, build_rollout_policy(base, "demo-v2", *names["demo-v2"]),
            "promoted",
        )  # fmt: skip
        if not good:
            return False
        bad = await _one_rollout(
            console, driver, load, write, build_rollout_policy(base, "demo-v3", *names["demo-v3"]),
            "rolled_back",
        )  # fmt: skip
    return bad
