"""Thread-per-connection Python clients for ``peers.py``: what most users' client code does.

``loadgen.py`` is one asyncio process with a hand-rolled HTTP client that costs the machine as
little CPU as it can; most users instead call a server from threads with the standard
library. These clients do that, in a process of their own: ``concurrency`` threads, each with
one ``http.client.HTTPConnection`` kept alive (``keepalive``) or ``urllib.request.urlopen``
opening a new connection per request (which sends ``Connection: close``). A cell is a
count, as in issue 37's harness: ``warmup`` requests shared by the threads, then ``requests``
measured ones; the rate is measured requests over the time from the first measured send to
the last answer. Each thread also reports what the scheduler did with it (CPU migrations and
context switches, from ``/proc/thread-self/sched`` where the kernel has it): the cost of the
client's GIL hand-offs, which depends on how the server answers (docs/serving-performance.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import itertools
import multiprocessing as mp
import threading
import time
import urllib.request
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["THREAD_NAME", "ThreadCell", "ThreadClientWorker", "name_os_thread", "run_thread_cell"]

TIMEOUT_S = 30.0
THREAD_NAME = "iw-client"
"""The OS name of every client thread (``/proc/<pid>/task/<tid>/comm``): what
``thread_states.py`` counts, leaving out the process's other threads."""
_PR_SET_NAME = 15
SCHED_FIELDS = {
    "se.nr_migrations": "migrations",
    "nr_voluntary_switches": "voluntary_switches",
    "nr_involuntary_switches": "involuntary_switches",
}


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` in the kernel (Linux ``prctl``, 15 bytes at most:
    before 3.14 Python keeps a ``threading.Thread``'s name to itself). Elsewhere, or where it
    fails, the thread keeps its name."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def thread_sched() -> dict[str, int] | None:
    """This thread's scheduler counts so far (SCHED_FIELDS), or None where the kernel does not
    show them (no ``/proc/thread-self/sched`` without CONFIG_SCHED_DEBUG, or not Linux)."""
    try:
        with open("/proc/thread-self/sched") as f:
            text = f.read()
    except OSError:
        return None
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        name = SCHED_FIELDS.get(key.strip())
        if sep and name is not None:
            found[name] = int(float(value))
    return found if len(found) == len(SCHED_FIELDS) else None


@dataclass(frozen=True)
class ThreadCell:
    """One measurement: ``concurrency`` threads POST ``body`` to ``http://host:port{path}``."""

    host: str
    port: int
    path: str
    body: bytes
    concurrency: int
    keepalive: bool
    warmup: int = 200
    requests: int = 2000


def _phase(cell: ThreadCell, count: int) -> dict[str, Any]:
    """``count`` requests over ``cell.concurrency`` threads (a ticket each, shared)."""
    tickets = itertools.count()  # next() on it is atomic under the GIL
    latencies: list[float] = []
    errors: list[str] = []
    headers = {"Content-Type": "application/json"}
    url = f"http://{cell.host}:{cell.port}{cell.path}"
    start = threading.Barrier(cell.concurrency + 1)
    sched: list[dict[str, int] | None] = []

    def record(status: int, t0: float) -> None:
        if status == 200:
            latencies.append(time.perf_counter() - t0)
        else:
            errors.append(f"HTTP {status}")

    def keepalive_client() -> None:
        name_os_thread(THREAD_NAME)
        conn = http.client.HTTPConnection(cell.host, cell.port, timeout=TIMEOUT_S)
        start.wait()
        try:
            while next(tickets) < count:
                t0 = time.perf_counter()
                try:
                    conn.request("POST", cell.path, cell.body, headers)
                    answer = conn.getresponse()
                    answer.read()
                except (OSError, http.client.HTTPException) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    conn.close()
                    conn = http.client.HTTPConnection(cell.host, cell.port, timeout=TIMEOUT_S)
                    continue
                record(answer.status, t0)
        finally:
            conn.close()
            sched.append(thread_sched())

    def new_connection_client() -> None:
        name_os_thread(THREAD_NAME)
        start.wait()
        try:
            while next(tickets) < count:
                t0 = time.perf_counter()
                request = urllib.request.Request(url, data=cell.body, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                        answer.read()
                except OSError as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                record(answer.status, t0)
        finally:
            sched.append(thread_sched())

    target = keepalive_client if cell.keepalive else new_connection_client
    threads = [threading.Thread(target=target, daemon=True) for _ in range(cell.concurrency)]
    for thread in threads:
        thread.start()
    start.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - t0
    counted = (
        None if None in sched else {k: sum(c[k] for c in sched if c) for k in SCHED_FIELDS.values()}
    )
    return {
        "latencies_s": latencies,
        "errors": errors[:20],
        "elapsed_s": elapsed,
        "sched": counted,
    }


def run_thread_cell(cell: ThreadCell) -> dict[str, Any]:
    """The warm-up, then the measured requests (their latencies, errors and elapsed time)."""
    if cell.warmup > 0:
        _phase(cell, cell.warmup)
    return _phase(cell, cell.requests)


def _worker_main(conn: Connection) -> None:
    import sys

    sys.setswitchinterval(0.005)  # CPython's default, stated: the clients' GIL hand-offs
    while True:
        cell = conn.recv()
        if cell is None:
            return
        try:
            conn.send(run_thread_cell(cell))
        except Exception as exc:
            conn.send({"failed": f"{type(exc).__name__}: {exc}"})


class ThreadClientWorker:
    """The thread clients in a long-lived process of their own (as a user's program is)."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="threads")
        self._proc.start()
        child.close()

    @property
    def pid(self) -> int:
        assert self._proc.pid is not None
        return self._proc.pid

    def run(self, cell: ThreadCell) -> dict[str, Any]:
        self._conn.send(cell)
        result: dict[str, Any] = self._conn.recv()
        if "failed" in result:
            raise RuntimeError(f"thread client cell {cell.port}{cell.path} failed: {result}")
        return result

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
