"""Long policy fuzzing run (issue 33): mutated policies against ``inferway validate``'s
in-process path and, every ``--watcher-every``-th case, as an edit written to a running
gateway's policy file (no Envoy), with a known-good checkpoint edit every
``--checkpoint-every`` watcher edits. Prints cases tried, accepted, refused and failures (a
traceback, a refusal without a location, a lost good config, a dead watcher) and writes them
as JSON, failures with the policy text that caused them.

    .venv/bin/python bench/fuzz_policies.py --cases 100000 --out bench/results/fuzz_policies.json
    .venv/bin/python bench/fuzz_policies.py --seconds 600

It stops at ``--cases`` policies or after ``--seconds`` (600 when neither is given, no time
limit with ``--cases`` alone), printing cases, rate, failures and the time to the target
every ``--progress`` cases.

The bounded run of the same engine is tests/integration/test_policy_fuzz.py.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _common import environment, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests.* helpers

from inferway.gateway.runtime import GatewayOptions, start_gateway
from tests.policy_fuzz import (
    FuzzStats,
    WatcherTarget,
    check_validate,
    load_seeds,
    mutate,
)


async def fuzz(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    seeds, watcher_seeds = load_seeds(), load_seeds(for_watcher=True)
    directory = Path(tempfile.mkdtemp(prefix="inferway-fuzz-"))
    policy = directory / "live" / "policy.yaml"
    policy.parent.mkdir()
    policy.write_text(yaml.safe_dump(watcher_seeds[0], sort_keys=False), encoding="utf-8")
    gateway = await start_gateway(
        GatewayOptions(
            policy_path=policy,
            xds_port=0,
            admin_port=0,
            with_envoy=False,
            workdir=directory / "work",
        )
    )
    gateway.watcher.settle_ms = args.settle_ms
    target = WatcherTarget(gateway, watcher_seeds[0])
    validate, watcher = FuzzStats(), FuzzStats()
    started = time.monotonic()
    seconds = args.seconds if args.seconds is not None else 600.0 if args.cases is None else 1e9
    deadline = started + seconds
    case = 0
    try:
        while time.monotonic() < deadline and (args.cases is None or case < args.cases):
            case += 1
            if case % args.watcher_every == 0:
                await target.edit(mutate(rng.choice(watcher_seeds), rng), watcher)
                if watcher.tried % args.checkpoint_every == 0:
                    await target.checkpoint(watcher, watcher.tried)
            else:
                check_validate(mutate(rng.choice(seeds), rng), directory, validate)
            if case % args.progress == 0:
                _print_progress(
                    case,
                    time.monotonic() - started,
                    len(validate.failures) + len(watcher.failures),
                    args.cases,
                )
                if args.out is not None:  # so far, in case the run is cut short
                    partial = _summary(args, case, time.monotonic() - started, validate, watcher)
                    write_results("fuzz_policies", partial | {"partial": True}, args.out)
        await target.checkpoint(watcher, watcher.tried + 1)
        alive = gateway.watcher.running and gateway.watcher.health.restarts == 0
    finally:
        await gateway.stop()
    summary = _summary(args, case, time.monotonic() - started, validate, watcher)
    summary["watcher"]["alive_at_end"] = alive
    return summary


def _print_progress(case: int, elapsed: float, failures: int, target: int | None) -> None:
    rate = case / elapsed if elapsed > 0 else 0.0
    line = f"{elapsed:7.0f} s  {case} cases  {rate:.1f}/s  {failures} failures"
    if target is not None and rate > 0:
        line += f"  {100 * case / target:.1f}% of {target}, ~{(target - case) / rate:.0f} s left"
    print(line, flush=True)


def _summary(
    args: argparse.Namespace,
    case: int,
    elapsed: float,
    validate: FuzzStats,
    watcher: FuzzStats,
) -> dict[str, Any]:
    failures = validate.failures + watcher.failures
    return {
        "seed": args.seed,
        "seconds": round(elapsed, 1),
        "cases": case,
        "target_cases": args.cases,
        "rate_per_s": round(case / elapsed, 1),
        "validate": validate.as_dict(),
        "watcher": watcher.as_dict() | {"settle_ms": args.settle_ms},
        "failures": len(failures),
        "failure_cases": failures[:50],
        "environment": environment(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=None, help="at most (default 600 without --cases)"
    )
    parser.add_argument("--cases", type=int, default=None, help="stop after this many")
    parser.add_argument("--progress", type=int, default=1000, help="cases between lines")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--watcher-every", type=int, default=25)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument(
        "--settle-ms", type=int, default=100, help="the watcher's settle time (its default)"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # each refused edit logs warnings; errors stay
    result = asyncio.run(fuzz(args))
    print(
        f"{result['cases']} policies in {result['seconds']} s ({result['rate_per_s']}/s): "
        f"validate {result['validate']}, watcher {result['watcher']}; "
        f"failures {result['failures']}"
    )
    path = write_results("fuzz_policies", result, args.out)
    print(f"wrote {path}")
    short = args.cases is not None and result["cases"] < args.cases
    if short:
        print(f"only {result['cases']} of the {args.cases} cases asked for (--seconds)")
    if result["failures"] or not result["watcher"]["alive_at_end"] or short:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
