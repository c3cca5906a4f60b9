"""Running a script of bench/ as a user would, its results file under a test's folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run_bench(script: str, out_dir: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``bench/<script> OPTIONS --out out_dir/out.json``, its output captured (5 minutes)."""
    return subprocess.run(
        [sys.executable, str(BENCH / script), *options, "--out", str(out_dir / "out.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
