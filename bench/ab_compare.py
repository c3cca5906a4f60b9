"""Two checkouts of inferway, one benchmark, side by side: A B B A ... rounds in one run.

Refactors promise "behaviour unchanged"; on these noisy machines only a side-by-side run can
show it. Each round runs the benchmark script of checkout A, then of B (then B, A), each from
its own tree with that tree first on ``PYTHONPATH``, and reads the JSON it writes. The table
gives every round's headline figures and the medians per checkout.

    git worktree add --detach /tmp/base <commit>
    .venv/bin/python bench/ab_compare.py --a /tmp/base --b . --bench propagation --rounds 4
    .venv/bin/python bench/ab_compare.py --a /tmp/base --b . --bench tiny --rounds 4

Benches: ``peers64`` (bench/peers.py --quick at c=64, inferway-fast beside Mosec, every client
kind: throughput as a multiple of Mosec's in the same run, and p99; Mosec's venv from
``PEERS_VENVS``), ``propagation`` (bench/propagation.py --quick: file saved -> Envoy ACK,
p50/p99 at the default 10 ms debounce) and ``tiny`` (bench/batching.py on the tiny model,
adaptive mode, HTTP JSON, HTTP binary, gRPC unary and stream: p50 at one request in flight and
the closed-loop rate of 16 clients; no open-loop grid, no rate search).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import environment, print_table, write_results

__all__ = ["main"]

Figures = dict[str, float]


def _propagation(out: Path) -> tuple[list[str], Callable[[dict[str, Any]], Figures]]:
    def figures(data: dict[str, Any]) -> Figures:
        scenario = next(s for s in data["scenarios"] if s["debounce_ms"] == 10)
        return {
            "propagation p50 ms": scenario["total"]["p50_ms"],
            "propagation p99 ms": scenario["total"]["p99_ms"],
        }

    return ["bench/propagation.py", "--quick", "--debounce-ms", "10", "--json", str(out)], figures


def _tiny(out: Path) -> tuple[list[str], Callable[[dict[str, Any]], Figures]]:
    def figures(data: dict[str, Any]) -> Figures:
        found: Figures = {}
        for run in data["runs"]:
            if run["mode"] != "adaptive":
                continue
            protocol = run["protocol"]
            found[f"{protocol} 1-in-flight p50 ms"] = run["one_in_flight"]["p50_ms"]
            found[f"{protocol} closed-16 req/s"] = run["closed"]["achieved_rps"]
        return found

    command = [
        "bench/batching.py",
        "--models",
        "tiny",
        "--modes",
        "adaptive",
        "--duration",
        "2",
        "--tiny-rates",
        "600",
        "--no-search",
        "--out",
        str(out),
    ]
    return command, figures


def _peers64(out: Path) -> tuple[list[str], Callable[[dict[str, Any]], Figures]]:
    def figures(data: dict[str, Any]) -> Figures:
        found: Figures = {}
        for row in data["summary"]:
            kind = f"{row['client']} {row['connections']}"
            if row["server"] == "inferway-fast" and row["ratio_to_mosec"] is not None:
                found[f"{kind} x mosec"] = row["ratio_to_mosec"]
                found[f"{kind} p99 ms"] = row["p99_ms"]
            if row["server"] == "mosec":
                found[f"{kind} mosec p99 ms"] = row["p99_ms"]
        return found

    venvs = os.environ.get("PEERS_VENVS", str(Path.home() / ".cache" / "inferway-bench" / "peers"))
    command = [
        "bench/peers.py",
        "--servers",
        "inferway-fast,mosec",
        "--concurrency",
        "64",
        "--quick",
        "--venvs",
        venvs,
        "--out",
        str(out),
    ]
    return command, figures


BENCHES = {"peers64": _peers64, "propagation": _propagation, "tiny": _tiny}


def _run(tree: Path, bench: str, scratch: Path, label: str) -> Figures:
    out = scratch / f"{label}-{time.monotonic_ns()}.json"
    command, figures = BENCHES[bench](out)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    print(f"[{label}] {tree}: {' '.join(command)}", flush=True)
    subprocess.run(
        [sys.executable, *command], cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL
    )
    return figures(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="checkout A (e.g. the baseline)")
    parser.add_argument("--b", type=Path, required=True, help="checkout B (e.g. this tree)")
    parser.add_argument("--bench", choices=sorted(BENCHES), required=True)
    parser.add_argument("--rounds", type=int, default=4, help="A/B pairs, order alternating")
    args = parser.parse_args(argv)
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    results: dict[str, list[Figures]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="inferway-ab-") as scratch:
        for round_index in range(args.rounds):
            order = ("A", "B") if round_index % 2 == 0 else ("B", "A")
            for label in order:
                results[label].append(_run(trees[label], args.bench, Path(scratch), label))
    names = sorted({name for runs in results.values() for run in runs for name in run})
    rows = []
    for name in names:
        a = [run[name] for run in results["A"] if name in run]
        b = [run[name] for run in results["B"] if name in run]
        median_a, median_b = statistics.median(a), statistics.median(b)
        rows.append(
            (
                name,
                " / ".join(f"{v:.2f}" for v in a),
                " / ".join(f"{v:.2f}" for v in b),
                f"{median_a:.2f}",
                f"{median_b:.2f}",
                f"{median_b / median_a:.3f}" if median_a else "-",
            )
        )
    print_table(
        f"{args.bench}: A = {trees['A']}, B = {trees['B']} ({args.rounds} rounds, alternating)",
        ["figure", "A runs", "B runs", "A median", "B median", "B / A"],
        rows,
    )
    path = write_results(
        f"ab_{args.bench}",
        {
            "benchmark": f"ab_compare {args.bench}",
            "command": " ".join(["bench/ab_compare.py", *(argv or sys.argv[1:])]),
            "environment": environment(),
            "trees": {k: str(v) for k, v in trees.items()},
            "runs": results,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
