"""``inferway serve --workers N``: N processes serving the same ports.

One Python process serves at most one core of protocol work (its event loop holds the GIL),
so on a machine whose model work does not fill the other cores, more processes serve more
requests. Each worker loads the whole repository, batches its own requests, watches the
repository for new versions and binds the HTTP and gRPC ports with SO_REUSEPORT once its
models are warm, so the kernel spreads connections only over ready workers. Their metrics
are added up through prometheus_client's multiprocess files; each worker's ORCA report
describes that worker (they see about the same load).

The parent only supervises: it prints each worker's readiness, restarts a worker that dies
(with backoff; it gives up if workers keep dying at start) and, on SIGINT/SIGTERM, stops them
all, each draining its in-flight requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import queue
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from inferway.backends.runners.onnx import WORKERS_ENV
from inferway.backends.serving.settings import (
    DEFAULT_BACKLOG,
    ServingSettings,
)
from inferway.backends.tls import BackendTls
from inferway.observability.log_format import LogFormat

__all__ = ["WorkerSettings", "run_workers"]

log = logging.getLogger("inferway.backends.workers")

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
REFRESH_S = 0.5
"""How often a worker writes its gauges (queue depth, in-flight batches) to the shared files."""
STOP_GRACE_S = 10.0
GIVE_UP_AFTER = 5
"""Consecutive worker deaths within ``STABLE_S`` of their start after which the parent stops."""
STABLE_S = 10.0


class _WorkerIndex(logging.Filter):
    """Adds the ``worker`` field (the worker's index) to each line a worker logs."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index
        return True


@dataclass(frozen=True)
class WorkerSettings:
    repository: Path
    host: str
    http_port: int
    grpc_port: int
    log_level: int
    log_format: LogFormat = "text"
    tls: BackendTls | None = None
    otlp_endpoint: str | None = None
    serving: ServingSettings = field(default_factory=ServingSettings)
    backlog: int = DEFAULT_BACKLOG


def _worker_main(settings: WorkerSettings, index: int, events: Any, parent: int) -> None:
    """A worker process (spawned): serve until SIGTERM/SIGINT, report readiness on ``events``."""
    from inferway.parent_death import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM, expected_parent=parent)
    from inferway.observability.log_format import install_log_handler

    handler = install_log_handler(settings.log_level, settings.log_format)
    handler.addFilter(_WorkerIndex(index))  # every line says which worker wrote it
    from inferway.backends.process_tuning import tune_for_serving
    from inferway.observability.masking import build_masker_from
    from inferway.observability.redaction import install_redaction

    install_redaction(masker=build_masker_from(settings.serving.mask))
    tune_for_serving()
    provider = None
    if settings.otlp_endpoint:
        from inferway.observability.otel import setup_tracing

        provider = setup_tracing("inferway-backend", settings.otlp_endpoint)
    try:
        import uvloop

        uvloop.run(_serve_worker(settings, index, events))
    finally:
        if provider is not None:
            provider.shutdown()


async def _serve_worker(settings: WorkerSettings, index: int, events: Any) -> None:
    from inferway.backends.app import describe_served, start_backend
    from inferway.backends.process_tuning import freeze_startup_heap

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    handle = await start_backend(
        settings.repository,
        host=settings.host,
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        tls=settings.tls,
        settings=settings.serving,
        backlog=settings.backlog,
        reuse_port=True,
        load_first=True,
        metrics_dir=os.environ[METRICS_DIR_ENV],
    )
    freeze_startup_heap()
    try:
        models = [describe_served(m) for m in handle.repository.models()]
        refused = [f"{w}: {why}" for w, why in sorted(handle.repository.errors.items())]
        events.put(("ready", index, os.getpid(), models, refused))
        while not stop.is_set():
            handle.metrics.refresh()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_S):
                    await stop.wait()
    finally:
        await handle.stop()


class _Workers:
    """The parent's view: start, watch, restart and stop the worker processes."""

    def __init__(
        self, settings: WorkerSettings, count: int, echo: Callable[[str], None], metrics_dir: str
    ) -> None:
        self._settings = settings
        self._count = count
        self._echo = echo
        self._metrics_dir = metrics_dir
        self._ctx = mp.get_context("spawn")
        self._events = self._ctx.Queue()
        self._procs: dict[int, BaseProcess] = {}
        self._started: dict[int, float] = {}
        self._ready: set[int] = set()
        self._deaths = 0
        self._announced = False
        self.stopping = False

    def start(self, index: int) -> None:
        proc = self._ctx.Process(
            target=_worker_main,
            args=(self._settings, index, self._events, os.getpid()),
            name=f"inferway-worker-{index}",
        )
        proc.start()
        self._procs[index] = proc
        self._started[index] = time.monotonic()

    def poll(self, timeout: float) -> bool:
        """Handle readiness reports and dead workers; False when the parent should give up."""
        try:
            kind, index, pid, models, refused = self._events.get(timeout=timeout)
        except queue.Empty:
            pass
        else:
            if kind == "ready":
                self._ready.add(index)
                self._echo(f"  worker {index} (pid {pid}) ready")
                if not self._announced:  # every worker loads the same models: list them once
                    self._announced = True
                    for line in models:
                        self._echo(f"  model {line}")
                    for line in refused:
                        self._echo(f"  refused {line}")
                if len(self._ready) == self._count:
                    self._echo(f"all {self._count} workers ready")
        for index, proc in list(self._procs.items()):
            if proc.exitcode is None or self.stopping:
                continue
            uptime = time.monotonic() - self._started[index]
            self._ready.discard(index)
            _forget_dead(self._metrics_dir, proc.pid)
            self._deaths = self._deaths + 1 if uptime < STABLE_S else 1
            log.error(
                "worker %d (pid %s) exited with code %s after %.1fs; restarting it",
                index,
                proc.pid,
                proc.exitcode,
                uptime,
            )
            if self._deaths >= GIVE_UP_AFTER:
                log.error("workers keep dying right after they start; giving up")
                return False
            time.sleep(min(0.2 * 2**self._deaths, 5.0))
            self.start(index)
        return True

    def stop(self) -> None:
        self.stopping = True
        for proc in self._procs.values():
            if proc.exitcode is None and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                log.warning("worker %s did not stop in %.0fs; killing it", proc.name, STOP_GRACE_S)
                proc.kill()
                proc.join(5)


def _forget_dead(metrics_dir: str, pid: int | None) -> None:
    """A dead worker's live gauges leave the sums (prometheus_client's multiprocess rule)."""
    if pid is None:
        return
    from prometheus_client import multiprocess

    with contextlib.suppress(Exception):
        multiprocess.mark_process_dead(pid, metrics_dir)


def run_workers(settings: WorkerSettings, count: int, echo: Callable[[str], None]) -> int:
    """Run ``count`` workers until SIGINT/SIGTERM; the process exit code."""
    if count < 2:
        raise ValueError("run_workers is for 2 or more workers; serve in-process otherwise")
    if settings.http_port == 0 or settings.grpc_port == 0:
        raise ValueError("workers share their ports: give --http-port and --grpc-port")
    own_dir = METRICS_DIR_ENV not in os.environ
    metrics_dir = os.environ.get(METRICS_DIR_ENV) or tempfile.mkdtemp(prefix="inferway-metrics-")
    os.environ[METRICS_DIR_ENV] = metrics_dir  # the workers inherit it
    os.environ[WORKERS_ENV] = str(count)  # and split the cores between them
    stop_requested = False

    def request_stop(signum: int, frame: Any) -> None:
        nonlocal stop_requested
        stop_requested = True

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    workers = _Workers(settings, count, echo, metrics_dir)
    code = 0
    try:
        for index in range(count):
            workers.start(index)
        while not stop_requested:
            if not workers.poll(timeout=0.2):
                code = 1
                break
        echo("stopping: draining in-flight requests")
    finally:
        workers.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            os.environ.pop(METRICS_DIR_ENV, None)
        os.environ.pop(WORKERS_ENV, None)
    return code
