"""The demo's model servers: two real inference backends serving two versions of one model.

Each backend is ``inferway.backends.app.start_backend`` over its own small model repository
(the deterministic demo MLP, version 1 in one and version 2 in the other), so every request
through the demo is a real ONNX Runtime inference behind adaptive batching, and the answer's
``model_version`` tells which version served it. A version given a ``DemoFault`` is reached
through a front that fails or slows some of its requests (``demo_fault``): the rollout scene's
bad canary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.trace import TracerProvider

from inferway.backends.app import BackendHandle, start_backend
from inferway.devtools.demo_fault import DemoFault, FaultFront, start_fault_front
from inferway.devtools.demo_models import write_demo_repository

__all__ = ["DEMO_FEATURES", "DEMO_MODEL", "DemoBackends", "start_demo_backends"]

DEMO_MODEL = "demo"
DEMO_FEATURES = 64
"""Input width of the demo MLP: small, so the demo spends its time on routing, not matmuls."""
_SIZES = (DEMO_FEATURES, 256, 256, 10)
_BATCHING = {"batching": {"mode": "adaptive", "max_batch_size": 32}}


@dataclass
class DemoBackends:
    """Running backends: ``ports[name]`` is the HTTP port of backend ``name`` (e.g. "v1") on
    ``host``; backend ``vN`` serves version N of model ``demo``."""

    host: str
    ports: dict[str, int]
    handles: dict[str, BackendHandle] = field(default_factory=dict, repr=False)
    fronts: dict[str, FaultFront] = field(default_factory=dict, repr=False)

    async def stop(self) -> None:
        await asyncio.gather(*(front.stop() for front in self.fronts.values()))
        self.fronts.clear()
        await asyncio.gather(*(handle.stop(grace=1.0) for handle in self.handles.values()))
        self.handles.clear()


async def start_demo_backends(
    workdir: str | Path,
    versions: Sequence[int] = (1, 2),
    *,
    host: str = "127.0.0.1",
    tracer_provider: TracerProvider | None = None,
    faults: Mapping[int, DemoFault] | None = None,
) -> DemoBackends:
    """Write one repository per version under ``workdir`` and start a backend on each (free
    loopback ports); returns once every model is loaded and warm. Spans go to
    ``tracer_provider`` (the global one when None). A version in ``faults`` is served behind
    its fault front: ``ports`` then names the front's port."""
    backends = DemoBackends(host, {})

    async def one(version: int) -> None:
        root = Path(workdir) / f"models-v{version}"
        await asyncio.to_thread(
            write_demo_repository, root, DEMO_MODEL, (version,), sizes=_SIZES, config=_BATCHING
        )
        handle = await start_backend(root, host=host, watch=False, tracer_provider=tracer_provider)
        backends.handles[f"v{version}"] = handle
        fault = (faults or {}).get(version)
        if fault is None:
            backends.ports[f"v{version}"] = handle.http_port
            return
        front = await start_fault_front(handle.http_port, fault, host)
        backends.fronts[f"v{version}"] = front
        backends.ports[f"v{version}"] = front.port

    try:
        await asyncio.gather(*(one(v) for v in versions))
    except BaseException:
        await backends.stop()
        raise
    backends.ports = dict(sorted(backends.ports.items()))
    return backends
