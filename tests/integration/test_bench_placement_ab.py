"""bench/placement_ab.py runs the shipped server and the same with the one-CPU placement rule it
had before the quiet rule (a patch that must keep up with BatchPlacement), each on one core,
and refuses bad cells."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.bench_script import run_bench


def test_both_servers_are_measured_with_their_cpu_and_placement(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("placement_ab.py puts its clients and servers on different cores: needs two")
    done = run_bench(
        "placement_ab.py",
        tmp_path,
        *("--cells", "threads:new@1,loadgen:keepalive@4", "--rounds", "1", "--requests", "150"),
        *("--warmup-requests", "20", "--duration", "0.5", "--warmup", "0.2", "-o", "json"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout)
    cells = {(c["cell"], c["server"]): c for c in results["cells"]}
    assert sorted(cells) == [
        (cell, server)
        for cell in ("loadgen:keepalive@4", "threads:new@1")
        for server in ("band", "shipped")
    ]
    for cell in cells.values():
        assert cell["throughput"] > 0 and cell["errors"] == 0
        assert cell["server_cpu_us"] > 0 and 0 <= cell["on_loop_share"] <= 1
    # a lone client on one core: the shipped rule computes its batches on the loop (all but
    # the first, before any cost is learned)
    assert cells[("threads:new@1", "shipped")]["on_loop_share"] > 0.9


@pytest.mark.parametrize("cell", ["threads:new", "threads:pooled@4", "grpc:new@1", "loadgen:new@0"])
def test_a_malformed_cell_is_refused(tmp_path: Path, cell: str) -> None:
    done = run_bench("placement_ab.py", tmp_path, "--cells", cell)
    assert done.returncode == 2
    assert f"--cells: {cell!r} is not client:connections@concurrency" in done.stderr
