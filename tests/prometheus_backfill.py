"""History for a real Prometheus in tests: samples written as OpenMetrics and turned into TSDB
blocks by ``promtool tsdb create-blocks-from openmetrics`` (Prometheus' own backfill), so a
test can ask a real server about the last days without waiting for them.

    backfill(workdir / "tsdb", {"up": [({"instance": "a"}, [(t0, 1.0), (t0 + 60, 1.0)])]})
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.components import require_binary

__all__ = ["Series", "backfill", "openmetrics"]

Series = tuple[Mapping[str, str], Sequence[tuple[float, float]]]
"""Labels, then (unix time in seconds, value) samples in time order."""


def openmetrics(families: Mapping[str, Sequence[Series]]) -> str:
    """``{wire name: series}`` as an OpenMetrics exposition with timestamps. Every family is
    typed ``unknown``: PromQL reads counters and gauges alike, and the wire names (Envoy's
    counters end in ``_total`` or not) stay as they are."""
    lines: list[str] = []
    for name, series in families.items():
        lines.append(f"# TYPE {name} unknown")
        for labels, samples in series:
            matchers = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            lines.extend(f"{name}{{{matchers}}} {v!r} {t:.3f}" for t, v in samples)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def backfill(tsdb: Path, families: Mapping[str, Sequence[Series]]) -> None:
    """Write ``families`` into ``tsdb`` as blocks (before Prometheus starts on that folder)."""
    promtool = require_binary("promtool", "backfilling a test Prometheus' TSDB")
    tsdb.mkdir(parents=True, exist_ok=True)
    source = tsdb.parent / "backfill.om"
    source.write_text(openmetrics(families))
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
