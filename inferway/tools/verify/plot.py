"""The load run's latency over time as a PNG: p50/p95/p99 per second against the SLA line,
throughput on the second axis. matplotlib (the verify extra) with its file-only Agg backend,
so it draws on a server without a display."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_latency_png"]


def write_latency_png(result: dict[str, Any], sla_p99_ms: float, path: Path) -> Path:
    """Draw locust_run's ``timeline`` into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    timeline = result["timeline"]
    seconds = [row["second"] for row in timeline]
    figure, latency = plt.subplots(figsize=(9, 4.5), dpi=100)
    try:
        for q, style in (("p50", "-"), ("p95", "--"), ("p99", "-")):
            values = [row[q] if row[q] is not None else float("nan") for row in timeline]
            latency.plot(seconds, values, style, label=q, linewidth=2 if q == "p99" else 1)
        latency.axhline(sla_p99_ms, color="red", linestyle=":", label=f"SLA p99 {sla_p99_ms:g} ms")
        latency.set_xlabel("second of the run")
        latency.set_ylabel("latency (ms)")
        throughput = latency.twinx()
        throughput.bar(seconds, [row["requests"] for row in timeline], alpha=0.15, color="grey")
        throughput.set_ylabel("requests per second")
        latency.set_zorder(throughput.get_zorder() + 1)
        latency.patch.set_visible(False)
        latency.legend(loc="upper left")
        latency.set_title(
            f"inferway verify: {result['users']} users, "
            f"{result['throughput_rps']:.0f} req/s, p99 {result['latency_ms']['p99'] or 0:.1f} ms"
        )
        figure.tight_layout()
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)
    return path
