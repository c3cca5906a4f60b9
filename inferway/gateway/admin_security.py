"""Hardening of the admin API: a bearer token for every state-changing request, bounded and
well-formed bodies, and the ``POST /reload`` endpoint that needs them.

Reads (``GET``/``HEAD``) are open while the API binds loopback (the default), so ``inferway
status`` works on the host without credentials; once it binds any other address they need
the token too (:data:`READS_NEED_TOKEN`), except ``/healthz`` and ``/metrics`` (probes and
Prometheus). Anything else (``POST /reload``, rollout commands) always requires
``Authorization: Bearer <token>``. The token comes from ``--admin-token-file``,
else ``INFERWAY_ADMIN_TOKEN``, else it is generated once and written (mode 0600) to
``<workdir>/admin-token`` so an operator on the host can read it and nobody else can.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from inferway.gateway.admin_documents import ADMIN_TOKEN_ENV

if TYPE_CHECKING:
    from inferway.gateway.watcher import PolicyWatcher

__all__ = [
    "ADMIN_TOKEN",
    "ADMIN_TOKEN_ENV",
    "MAX_BODY_BYTES",
    "OPEN_READS",
    "READS_NEED_TOKEN",
    "RELOAD",
    "ReloadCallable",
    "admin_security_middleware",
    "build_reload",
    "is_loopback",
    "read_json_object",
    "reload_handler",
    "resolve_admin_token",
]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
"""aiohttp's client_max_size for the admin app: bigger bodies get 413."""
TOKEN_FILE_NAME = "admin-token"
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_READS = frozenset({"/healthz", "/metrics"})
"""Paths read without the token even when reads need it."""

ReloadCallable = Callable[[bool], Awaitable[dict[str, Any]]]
ADMIN_TOKEN = web.AppKey("admin_token", str)
RELOAD: web.AppKey[ReloadCallable] = web.AppKey("reload")
READS_NEED_TOKEN = web.AppKey("reads_need_token", bool)
"""Set (True) when the admin API binds a non-loopback address: reads need the token too."""


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def resolve_admin_token(
    *,
    token_file: Path | None,
    workdir: Path,
    environ: dict[str, str] | os._Environ[str] = os.environ,
) -> tuple[str, str]:
    """The admin token and where it came from (for the log; the token itself is never logged)."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise OSError(f"cannot read the admin token file {token_file}: {error}") from None
        if not token:
            raise OSError(f"the admin token file {token_file} is empty")
        return token, str(token_file)
    token = environ.get(ADMIN_TOKEN_ENV, "").strip()
    if token:
        return token, f"${ADMIN_TOKEN_ENV}"
    path = workdir / TOKEN_FILE_NAME
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token, str(path)
    workdir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    os.chmod(path, 0o600)
    return token, str(path)


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


@web.middleware
async def admin_security_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """401 for a state-changing request without the right bearer token (and for a read other
    than :data:`OPEN_READS` when :data:`READS_NEED_TOKEN` is set); JSON 413 for a body
    over :data:`MAX_BODY_BYTES` (aiohttp raises it when the body is read)."""
    reading = request.method in _READ_METHODS
    guarded = not reading or (
        request.app.get(READS_NEED_TOKEN, False) and request.path not in OPEN_READS
    )
    if guarded and not _authorized(request):
        what = (
            "reads the gateway's state, and this admin API binds a non-loopback address"
            if reading
            else "changes the gateway's state"
        )
        return _error(
            401,
            f"{request.method} {request.path} {what}: it needs "
            "'Authorization: Bearer <admin token>' (see --admin-token-file, "
            f"${ADMIN_TOKEN_ENV} or <workdir>/{TOKEN_FILE_NAME})",
            **{"WWW-Authenticate": 'Bearer realm="inferway-admin"'},
        )
    too_big = request.content_length is not None and request.content_length > MAX_BODY_BYTES
    if not reading and too_big:
        return _error(413, f"request body larger than {MAX_BODY_BYTES} bytes")
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"request body larger than {MAX_BODY_BYTES} bytes")


def _authorized(request: web.Request) -> bool:
    expected = request.app.get(ADMIN_TOKEN)
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return (
        bool(expected)
        and scheme.lower() == "bearer"
        and hmac.compare_digest(token.strip().encode(), (expected or "").encode())
    )


async def read_json_object(request: web.Request, allowed: frozenset[str]) -> dict[str, Any]:
    """The body as a JSON object with only ``allowed`` keys; an empty body is ``{}``.
    Raises HTTPBadRequest (JSON body) for anything else."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"malformed JSON body: {error}"}),
            content_type="application/json",
        ) from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "the body must be a JSON object"}),
            content_type="application/json",
        )
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"unknown field(s) {unknown}; allowed: {sorted(allowed)}"}),
            content_type="application/json",
        )
    return data


async def reload_handler(request: web.Request) -> web.Response:
    """``POST /reload`` (body optional: ``{"force": true}`` re-applies an unchanged file)."""
    reload = request.app.get(RELOAD)
    if reload is None:
        return _error(404, "this gateway has no policy file to reload")
    body = await read_json_object(request, frozenset({"force"}))
    force = body.get("force", False)
    if not isinstance(force, bool):
        return _error(400, f"'force' must be true or false, got {force!r}")
    result = await reload(force)
    return web.json_response(result, status=422 if result.get("refused") else 200)


def build_reload(watcher: PolicyWatcher) -> ReloadCallable:
    """``POST /reload`` for a gateway's policy watcher: re-read the file now."""

    async def reload(force: bool) -> dict[str, Any]:
        restarted = await watcher.ensure_running()  # a watch that had ended starts again
        if force:
            watcher.mark_loaded("")  # forget the live digest: the file is re-applied
        result = watcher.reload()
        plane = watcher.control_plane
        extra = {"watcher_restarted": True} if restarted else {}
        if result is None:
            return {"changed": False, "version": plane.version} | extra
        if result.refusal is not None:
            return {
                "changed": False,
                "version": plane.version,
                "refused": [str(issue) for issue in result.refusal.issues],
            } | extra
        return {"changed": True, "version": result.version} | extra

    return reload
