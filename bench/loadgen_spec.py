"""What a load point is, shared by the clients, the drivers and the worker process of
``loadgen.py`` (a module of its own so that none of them imports another in a circle)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["PROTOCOLS", "REQUEST_TIMEOUT_S", "LoadSpec", "Send", "request_row"]

PROTOCOLS = ("http-json", "http-binary", "grpc", "grpc-stream")
REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class LoadSpec:
    """One measurement point, sent to a worker process."""

    protocol: str
    host: str
    http_port: int
    grpc_port: int
    model: str
    width: int  # input features; every request is one row
    kind: str  # "open" | "closed"
    duration_s: float
    rate: float = 0.0  # open loop: mean requests/s
    concurrency: int = 1  # closed loop: clients
    warmup_s: float = 0.0
    seed: int = 0
    path: str = ""  # HTTP: the request path (default /v2/models/{model}/infer)
    keepalive: bool = True  # HTTP: False = a new connection per request (Connection: close)


Send = Callable[[], Awaitable[bool]]


def request_row(width: int, seed: int) -> np.ndarray:
    """The one input row every request of a point carries (seeded, so it can be checked)."""
    return np.random.default_rng(seed).random((1, width), dtype=np.float32)
