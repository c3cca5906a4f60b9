"""``POST /profile`` on the admin API: a remote operator profiles the control plane, or one of
the replicas this gateway runs, without a shell on the host.

State-changing methods need the admin token (admin_security), and profiling pauses the target
for microseconds per sample, so POST it is. One profile at a time (409 while one runs); at most
``MAX_SECONDS`` long. The answer is JSON: the top frames and the flame graph SVG as text.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from inferway.gateway.admin_security import read_json_object
from inferway.observability.py_spy import ProfileError, ProfileResult, record_profile

__all__ = ["MAX_SECONDS", "add_profile_routes", "profile_document"]

MAX_SECONDS = 60.0
ReplicaPids = Callable[[str], list[int]]
"""A service's running replicas' pids (in index order); KeyError for an unknown service."""

_PIDS: web.AppKey[ReplicaPids] = web.AppKey("profile_replica_pids")
_LOCK = web.AppKey("profile_lock", asyncio.Lock)
_FIELDS = frozenset({"target", "seconds", "rate", "service", "replica", "idle", "top"})


def profile_document(result: ProfileResult, *, top: int, target: str) -> dict[str, Any]:
    """What ``POST /profile`` and ``inferway profile -o json`` print (svg: a path or text)."""
    return {
        "target": target,
        "pid": result.pid,
        "seconds": result.seconds,
        "rate": result.rate,
        "samples": result.stacks.samples,
        "top": [frame.as_dict() for frame in result.stacks.top(top)],
    }


def _bad(message: str, status: int = 400) -> web.HTTPException:
    cls = {404: web.HTTPNotFound, 409: web.HTTPConflict}.get(status, web.HTTPBadRequest)
    return cls(text=json.dumps({"error": message}), content_type="application/json")


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _bad(f"{key} must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _pid(request: web.Request, body: dict[str, Any]) -> tuple[int, str]:
    target = body.get("target", "gateway")
    if target == "gateway":
        return os.getpid(), "gateway"
    if target != "backend":
        raise _bad(f"target must be 'gateway' or 'backend', got {target!r}")
    service = body.get("service")
    if not isinstance(service, str) or not service:
        raise _bad("target 'backend' needs 'service': one the gateway runs replicas of")
    pids_of = request.app.get(_PIDS)
    if pids_of is None:
        raise _bad("this gateway runs no replicas; profile a backend on its host", 404)
    try:
        pids = pids_of(service)
    except KeyError:
        raise _bad(f"this gateway runs no replicas of service {service!r}", 404) from None
    index = int(_number(body, "replica", 0, 0, 10_000))
    if index >= len(pids):
        raise _bad(f"service {service!r} has {len(pids)} running replica(s), no index {index}", 404)
    return pids[index], f"backend {service}[{index}]"


async def _profile(request: web.Request) -> web.Response:
    body = await read_json_object(request, _FIELDS)
    seconds = _number(body, "seconds", 10, 1, MAX_SECONDS)
    rate = int(_number(body, "rate", 100, 1, 1000))
    top = int(_number(body, "top", 15, 1, 200))
    pid, target = _pid(request, body)
    lock = request.app[_LOCK]
    if lock.locked():
        raise _bad("a profile is already running; try again when it ends", 409)
    async with lock:
        with tempfile.TemporaryDirectory(prefix="inferway-profile-") as scratch:
            svg = Path(scratch) / "profile.svg"
            try:
                result = await record_profile(
                    pid, svg, seconds=seconds, rate=rate, idle=bool(body.get("idle", False))
                )
            except ProfileError as error:
                return web.json_response({"error": str(error)}, status=502)
            document = profile_document(result, top=top, target=target)
            document["svg"] = svg.read_text(encoding="utf-8")
    return web.json_response(document)


def add_profile_routes(app: web.Application, replica_pids: ReplicaPids | None = None) -> None:
    app[_LOCK] = asyncio.Lock()
    if replica_pids is not None:
        app[_PIDS] = replica_pids
    app.router.add_post("/profile", _profile)
