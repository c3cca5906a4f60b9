"""The long fuzzing run against a live ``inferway serve`` (issue 33): generated inference
requests (tests/request_fuzz.py: JSON and binary-extension bodies, mutated fields, headers,
lengths, methods, paths) for ``--duration`` seconds, each checked for exactly one whole 2xx/4xx
answer (strict JSON when JSON); then the server must still answer and its log must hold no
traceback. Prints the cases tried and the failures, and writes them as JSON to
bench/results/fuzz_requests_<frontend>.json (or ``--json``).

    .venv/bin/python bench/fuzz_requests.py --duration 600 [--frontend aiohttp]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import environment, write_results
from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests.* helpers

from tests.request_fuzz import (
    FuzzServer,
    RequestCase,
    check_answer,
    fuzz_server,
    requests,
    send,
)

BATCH = 2000
"""Examples per Hypothesis run; runs repeat until the duration is spent."""
KEPT_FAILURES = 20


def _run(server: FuzzServer, until: float, statuses: Counter[int], failures: list[str]) -> int:
    """One Hypothesis run of at most BATCH cases (fewer once ``until`` passes); cases sent."""
    sent = 0

    @settings(
        max_examples=BATCH,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=requests())
    def one(case: RequestCase) -> None:
        nonlocal sent
        if time.monotonic() > until:
            return
        try:
            status, wrong = check_answer(case, send(server, case))
        except OSError as exc:
            status, wrong = 0, f"{type(exc).__name__}: {exc}"
        sent += 1
        statuses[status] += 1
        if wrong is not None:
            failures.append(f"{case!r}: {wrong}"[:2000])

    one()
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of fuzzing")
    parser.add_argument("--frontend", choices=["fast", "aiohttp"], default="fast")
    parser.add_argument(
        "--json", type=Path, help="where to write the results (default bench/results/...)"
    )
    args = parser.parse_args(argv)
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory() as workdir,
        fuzz_server(Path(workdir), args.frontend) as server,
    ):
        until = started + args.duration
        cases = 0
        while time.monotonic() < until:
            cases += _run(server, until, statuses, failures)
            print(
                f"{time.monotonic() - started:7.0f} s  {cases} cases  {len(failures)} failures",
                flush=True,
            )
        healthy = server.healthy()
        log = server.log_text()
    tracebacks = log.count("Traceback")
    result = {
        "environment": environment(),
        "frontend": args.frontend,
        "seconds": round(time.monotonic() - started, 1),
        "cases": cases,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "failures": len(failures),
        "first_failures": failures[:KEPT_FAILURES],
        "tracebacks_in_server_log": tracebacks,
        "server_still_answering": healthy,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=2))
    print(f"wrote {write_results(f'fuzz_requests_{args.frontend}', result, args.json)}")
    return 0 if not failures and not tracebacks and healthy else 1


if __name__ == "__main__":
    raise SystemExit(main())
