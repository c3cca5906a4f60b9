"""(a) of the batching benchmark: what ONNX Runtime alone does on this machine, called
in-process at every batch size, so the server's throughput has a yardstick measured in the
same run."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

__all__ = ["measure_direct"]


def measure_direct(path: Path, width: int, seconds: float, sweep: tuple[int, ...]) -> dict:
    """Batch-size sweep of the same runner the server uses, in this process: one session with
    the default threads, then (at the three best batch sizes) two single-threaded sessions
    running side by side, which on 2 cores can beat one 2-threaded session. (a) is the best
    of both, so the server is measured against the most ONNX Runtime can do here."""
    from inferway.backends.runners.onnx import CPU, OnnxRunner

    runner = OnnxRunner(path, providers=[CPU])
    rows = []
    for batch in sweep:
        feed = {"x": np.random.default_rng(batch).random((batch, width), dtype=np.float32)}
        runner.run(feed)
        times: list[float] = []
        began = time.perf_counter()
        while time.perf_counter() - began < seconds or len(times) < 3:
            t0 = time.perf_counter()
            runner.run(feed)
            times.append(time.perf_counter() - t0)
        median = statistics.median(times)
        rows.append({"batch": batch, "ms": round(median * 1000, 3), "rows_s": batch / median})
    runner.close()
    pairs = []
    for batch in sorted(r["batch"] for r in sorted(rows, key=lambda r: -r["rows_s"])[:3]):
        pairs.append({"batch": batch, "rows_s": _two_sessions(path, width, batch, seconds)})
    best = max(rows, key=lambda r: r["rows_s"])
    best_pair = max(pairs, key=lambda r: r["rows_s"])
    config = "1 session x 2 threads"
    if best_pair["rows_s"] > best["rows_s"]:
        best, config = best_pair, "2 sessions x 1 thread"
    return {
        "sweep": rows,
        "two_sessions": pairs,
        "batch1_rows_s": rows[0]["rows_s"],
        "best_batch": best["batch"],
        "best_rows_s": best["rows_s"],
        "best_config": config,
        "ratio": best["rows_s"] / rows[0]["rows_s"],
    }


def _two_sessions(path: Path, width: int, batch: int, seconds: float) -> float:
    """Rows/s of two single-threaded sessions running ``batch``-row batches concurrently."""
    import threading

    from inferway.backends.runners.onnx import CPU, OnnxRunner

    runners = [OnnxRunner(path, providers=[CPU], intra_op_threads=1) for _ in range(2)]
    feed = {"x": np.random.default_rng(batch).random((batch, width), dtype=np.float32)}
    for r in runners:
        r.run(feed)
    done = [0, 0]
    stop_at = time.perf_counter() + max(seconds * 2, 1.0)

    def work(i: int) -> None:
        while time.perf_counter() < stop_at:
            runners[i].run(feed)
            done[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    for r in runners:
        r.close()
    return sum(done) * batch / elapsed
