"""The verdict of a verify run: one JSON document (``-o json``, ``--json FILE``; its fields
only grow, docs/verify.md) and the tables a person reads. ``ok`` is true only when every bar
that was measured is met; a part that was not run or could not measure is no failure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from inferway.tools.verify.cost import CostReport
from inferway.tools.verify.functional import FunctionalReport
from inferway.tools.verify.load import LoadReport
from inferway.tools.verify.openai_checks import OpenAICheck
from inferway.tools.verify.openai_load import LLMLoadReport
from inferway.tools.verify.stats import ChiSquare

__all__ = ["VerifyRun", "render_run", "run_document"]


@dataclass
class VerifyRun:
    policy: str
    gateway: str
    functional: FunctionalReport
    load: LoadReport | None
    cost: CostReport
    png: str | None = None
    openai: list[OpenAICheck] = field(default_factory=list)
    llm_load: LLMLoadReport | None = None


def _chi(test: ChiSquare) -> dict[str, Any]:
    return {
        "pools": {
            k: {"observed": test.observed.get(k, 0), "expected": round(v, 3)}
            for k, v in test.expected.items()
        },
        "statistic": test.statistic,
        "p_value": test.p_value,
        "dof": test.dof,
        "alpha": test.alpha,
        "ok": test.ok,
        "note": test.note,
    }


def _bars(run: VerifyRun) -> list[dict[str, Any]]:
    f = run.functional
    bars: list[dict[str, Any]] = [
        {
            "name": "routed correctly",
            "target": f">= {f.bar:g}%",
            "measured": f"{f.correctness:.2f}% ({f.correct}/{f.requests})"
            if f.requests or not run.openai
            else "no requests: the policy has openai routes only",
            "ok": f.correctness >= f.bar if f.requests or not run.openai else None,
        },
        {
            "name": "activation frequency (all pools)",
            "target": f"chi-square p >= {f.activation.alpha:g}",
            "measured": f.activation.note or f"p = {f.activation.p_value:.4g}",
            "ok": f.activation.ok,
        },
    ]
    for route, test in sorted(f.per_route.items()):
        bars.append(
            {
                "name": f"activation frequency ({route})",
                "target": f"chi-square p >= {test.alpha:g}",
                "measured": test.note or f"p = {test.p_value:.4g}",
                "ok": test.ok,
            }
        )
    if run.load is not None:
        s, p99 = run.load.settings, run.load.p99_ms
        bars.append(
            {
                "name": "load p99",
                "target": f"<= {s.sla_p99_ms:g} ms",
                "measured": "no requests" if p99 is None else f"{p99:.1f} ms",
                "ok": p99 is not None and p99 <= s.sla_p99_ms,
            }
        )
        bars.append(
            {
                "name": "load errors",
                "target": f"<= {s.max_error_percent:g}%",
                "measured": f"{run.load.error_percent:.2f}%",
                "ok": run.load.error_percent <= s.max_error_percent,
            }
        )
    if run.openai:
        passed = sum(c.ok for c in run.openai)
        bars.append(
            {
                "name": "openai routes (routing, streams, usage, 404)",
                "target": "every check passes",
                "measured": f"{passed}/{len(run.openai)} passed",
                "ok": passed == len(run.openai),
            }
        )
    if run.llm_load is not None:
        bars.append(
            {
                "name": "openai load errors",
                "target": f"<= {run.llm_load.max_error_percent:g}%",
                "measured": f"{run.llm_load.error_percent:.2f}% of {run.llm_load.requests}",
                "ok": run.llm_load.ok,
            }
        )
    mean = run.cost.mean_utilization
    if run.cost.min_utilization is not None:
        bars.append(
            {
                "name": "utilisation",
                "target": f">= {100 * run.cost.min_utilization:g}%",
                "measured": run.cost.note or f"{100 * (mean or 0):.1f}%",
                "ok": run.cost.ok,
            }
        )
    return bars


def _generator_line(generator: dict[str, Any], sla_p99_ms: float) -> str:
    """What locust itself added: its loop's lateness and its collector's longest pause; with a
    hint when that alone takes a large share of the p99 budget."""
    lag = generator.get("loop_lag_ms") or {}
    full = (generator.get("gc") or {}).get("2") or {}
    worst = generator.get("loop_lag_max_ms") or 0.0
    line = (
        f"  load generator: its loop ran late by p99 {lag.get('p99') or 0:.1f} ms, at most "
        f"{worst:.1f} ms; {full.get('collections', 0)} full collections, longest "
        f"{full.get('max_ms', 0.0):.1f} ms"
    )
    if lag.get("p99") is not None and float(lag["p99"]) >= sla_p99_ms / 4:
        line += (
            f" (a quarter of the {sla_p99_ms:g} ms budget or more is the load generator's "
            "own delay: give it cores of its own, --load-cpus)"
        )
    return line


def run_document(run: VerifyRun) -> dict[str, Any]:
    f = run.functional
    bars = _bars(run)
    load = None
    if run.load is not None:
        result = run.load.result
        load = {
            **{k: result[k] for k in ("users", "duration_s", "requests", "failures")},
            **{k: result[k] for k in ("throughput_rps", "latency_ms", "statuses", "errors")},
            "error_percent": run.load.error_percent,
            "sla_p99_ms": run.load.settings.sla_p99_ms,
            "ok": run.load.ok,
            "timeline": result["timeline"],
            "exclude_ramp": run.load.settings.steady_only,
            "ramp": result.get("ramp"),
            "load_generator": result.get("load_generator"),
            "png": run.png,
        }
    return {
        "ok": all(b["ok"] is not False for b in bars) and (run.load is None or run.load.ok),
        "policy": run.policy,
        "gateway": run.gateway,
        "bars": bars,
        "functional": {
            "ok": f.ok,
            "requests": f.requests,
            "correct": f.correct,
            "correctness_percent": round(f.correctness, 4),
            "bar_percent": f.bar,
            "routes": f.routes,
            "mismatches": f.mismatches,
            "activation": _chi(f.activation),
            "splits": {route: _chi(test) for route, test in f.per_route.items()},
            "replicas": f.replicas,
            "uncovered": f.uncovered,
            "unreached_routes": f.unreached,
        },
        "load": load,
        "openai": {
            "ok": all(c.ok for c in run.openai),
            "checks": [c.document() for c in run.openai],
            "load": run.llm_load.document() if run.llm_load is not None else None,
        },
        "cost": {
            "available": bool(run.cost.cost or run.cost.utilization),
            "source": run.cost.source,
            "note": run.cost.note,
            "cost": [s.document() for s in run.cost.cost],
            "utilization": [s.document() for s in run.cost.utilization],
            "mean_utilization": run.cost.mean_utilization,
            "ok": run.cost.ok,
        },
    }


def _verdict(ok: bool | None) -> Text:
    if ok is None:
        return Text("n/a", style="dim")
    return Text("pass", style="green") if ok else Text("FAIL", style="bold red")


def render_run(document: dict[str, Any], console: Console, *, mismatches: int = 10) -> None:
    """The bars, the routes, the first mismatches, load and cost, as tables."""
    bars = Table(title=f"inferway verify {document['policy']} @ {document['gateway']}")
    for column in ("bar", "target", "measured", "verdict"):
        bars.add_column(column)
    for b in document["bars"]:
        bars.add_row(b["name"], b["target"], b["measured"], _verdict(b["ok"]))
    console.print(bars)
    f = document["functional"]
    routes = Table(title="routes", title_justify="left")
    for column in ("route", "requests", "correct"):
        routes.add_column(column)
    for name, counts in f["routes"].items():
        routes.add_row(name, str(counts["requests"]), str(counts["correct"]))
    console.print(routes)
    pools = Table(title="activation per pool", title_justify="left")
    for column in ("pool", "observed", "expected", "replicas (requests)"):
        pools.add_column(column)
    for pool, counts in f["activation"]["pools"].items():
        replicas = f["replicas"].get(pool, {})
        served = ", ".join(f"{r} ({n})" for r, n in sorted(replicas.items()))
        pools.add_row(pool, str(counts["observed"]), f"{counts['expected']:.1f}", served)
    console.print(pools)
    if f["mismatches"]:
        table = Table(title="mis-routed requests", title_justify="left")
        for column in ("request", "expected", "observed", "count"):
            table.add_column(column)
        for m in f["mismatches"][:mismatches]:
            table.add_row(m["covers"], m["expected"], m["observed"], str(m["count"]))
        console.print(table)
    for line in f["uncovered"]:
        console.print(Text(f"not covered: {line}", style="yellow"))
    for name in f["unreached_routes"]:
        console.print(Text(f"route {name}: no request reaches it (an earlier route catches all)"))
    load = document["load"]
    if load is not None:
        q = load["latency_ms"]
        console.print(
            f"load: {load['users']} users for {load['duration_s']:.1f}s: {load['requests']} "
            f"requests, {load['throughput_rps']:.1f} req/s, p50 {q['p50'] or 0:.1f} / p95 "
            f"{q['p95'] or 0:.1f} / p99 {q['p99'] or 0:.1f} ms, {load['failures']} errors"
            + (f"; latency over time: {load['png']}" if load["png"] else "")
        )
        ramp = load.get("ramp")
        if load.get("exclude_ramp") and ramp:
            r = ramp["latency_ms"]
            console.print(
                f"  judged after the ramp; the ramp's {ramp['requests']} requests: "
                f"p99 {r['p99'] or 0:.1f} ms"
            )
        generator = load.get("load_generator")
        if generator:
            console.print(Text(_generator_line(generator, load["sla_p99_ms"])))
    _render_openai(document.get("openai") or {}, console)
    cost = document["cost"]
    if not cost["available"]:
        console.print(f"cost and utilisation: {cost['note'] or 'not available'}")
    for sample in cost["cost"] + cost["utilization"]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(sample["labels"].items()))
        console.print(f"{sample['name']}{{{labels}}} {sample['value']:g}")
    console.print(_verdict(document["ok"]))


def _render_openai(openai: dict[str, Any], console: Console) -> None:
    """The OpenAI routes' checks (failed ones first) and their load run's TTFT/ITL/tokens."""
    checks = sorted(openai.get("checks") or [], key=lambda c: bool(c["ok"]))
    if checks:
        table = Table(title="openai routes", title_justify="left")
        for column in ("check", "request", "detail", "verdict"):
            table.add_column(column)
        for c in checks:
            table.add_row(c["check"], c["where"], c["detail"], _verdict(c["ok"]))
        console.print(table)
    load = openai.get("load")
    if load is not None:
        t, i = load["ttft_ms"], load["itl_ms"]
        console.print(
            f"openai load: {load['users']} streams for {load['duration_s']:.1f}s: "
            f"{load['requests']} requests, {load['tokens']} tokens, "
            f"{load['tokens_per_s']:.1f} tokens/s; TTFT p50 {t['p50'] or 0:.1f} / p99 "
            f"{t['p99'] or 0:.1f} ms; ITL p50 {i['p50'] or 0:.1f} / p99 {i['p99'] or 0:.1f} ms; "
            f"{load['errors']} errors"
        )
