"""bench/frontend_cost.py, the in-process front-end cost: both connection kinds run over a real
backend, a new connection per request is closed by the front end after its answer (or the
benchmark fails), and bad options are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "frontend_cost.py"


def _run(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *options, "--out", str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_kept_and_new_connections_are_both_measured(tmp_path: Path) -> None:
    done = _run(
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
    done = _run(tmp_path, "--connections", "pooled", "--requests", "10", "--rounds", "1")
    assert done.returncode != 0
    assert "--connections: 'pooled' is not keepalive or new" in done.stderr
