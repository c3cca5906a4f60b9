"""bench/frontend_cost.py, the in-process front-end cost: both connection kinds run over a real
backend, a new connection per request is closed by the front end after its answer (or the
benchmark fails), and bad options are refused."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_script import run_bench


def test_kept_and_new_connections_are_both_measured(tmp_path: Path) -> None:
    done = run_bench(
        "frontend_cost.py",
        tmp_path,
        "--bodies",
        "json",
        "--connections",
        "keepalive,new",
        "--requests",
        "300",
        "--warmup",
        "100",
        "--rounds",
        "1",
        "--concurrency",
        "8",
        "-o",
        "json",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)["rows"]
    assert sorted(r["connections"] for r in rows) == ["keepalive", "new"]
    for row in rows:
        assert row["cpu_us_per_request"] > row["ort_us_per_request"] > 0
        assert row["mean_batch"] >= 1


def test_a_bad_connection_kind_is_refused(tmp_path: Path) -> None:
    done = run_bench(
        "frontend_cost.py", tmp_path, "--connections", "pooled", "--requests", "10", "--rounds", "1"
    )
    assert done.returncode != 0
    assert "--connections: 'pooled' is not keepalive or new" in done.stderr
