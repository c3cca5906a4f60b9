"""bench/accept_ab.py runs both servers (the shipped front end and the same with uvloop's own
accept, a patch that must keep up with FastHttpServer) and its ramp, and refuses bad options."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_script import run_bench


def test_both_servers_and_a_ramp_are_measured(tmp_path: Path) -> None:
    done = run_bench(
        "accept_ab.py",
        tmp_path,
        *("--cells", "loadgen:new", "--rounds", "1", "--ramps", "1", "--concurrency", "8"),
        *("--duration", "0.5", "--warmup", "0.2", "--ramp-s", "0.5", "--requests", "100"),
        *("--warmup-requests", "20", "-o", "json"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout)
    assert sorted(c["server"] for c in results["cells"]) == ["accept-all", "accept-one"]
    for cell in results["cells"]:
        assert cell["throughput"] > 0 and cell["errors"] == 0
    assert sorted(r["server"] for r in results["ramps"]) == ["accept-all", "accept-one"]


def test_an_unknown_cell_is_refused(tmp_path: Path) -> None:
    done = run_bench("accept_ab.py", tmp_path, "--cells", "loadgen:pooled")
    assert done.returncode == 2
    assert "--cells: loadgen:pooled" in done.stderr
