"""Open Inference Protocol (KServe v2) over HTTP, with the binary tensor data extension.

Every response, errors included, carries the ORCA load header; every failure is a JSON
``{"error": "..."}`` with a 4xx/5xx status, never a dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from inferway.backends.protocol.bad_http_log import install_bad_http_filter
from inferway.backends.protocol.binary_codec import split_binary_body
from inferway.backends.protocol.json_codec import (
    decode_json_request,
    encode_json_response,
    parse_json_header,
)
from inferway.backends.protocol.server_info import EXTENSIONS, SERVER_NAME, SERVER_VERSION
from inferway.backends.protocol.triton_config import model_config_json
from inferway.backends.serving.core import Chosen, ServingCore, Transport
from inferway.backends.serving.failures import (
    BodyTimeoutError,
    Failure,
    PayloadTooLargeError,
    UnsupportedRequestError,
    classify_error,
)
from inferway.backends.serving.input_validation import InferInputError
from inferway.backends.serving.request import DecodedRequest
from inferway.backends.telemetry import orca, tracing
from inferway.backends.telemetry.metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from inferway.backends.models.served_model import ServedModel

__all__ = [
    "ASYNC_INFER",
    "BINARY_HEADER",
    "ENVOY_TIMEOUT_HEADER",
    "HTTP",
    "build_http_app",
    "envoy_timeout_s",
]

log = logging.getLogger("inferway.backends.http")

BINARY_HEADER = "Inference-Header-Content-Length"
ENVOY_TIMEOUT_HEADER = "x-envoy-expected-rq-timeout-ms"
"""Envoy tells the upstream how long the route waits; the backend treats it as a deadline."""
HTTP = Transport(protocol="http", wire="http")

_CORE = web.AppKey("inferway_core", ServingCore)
AsyncInfer = Callable[[web.Request], Awaitable[web.StreamResponse | None]]
ASYNC_INFER: web.AppKey[AsyncInfer] = web.AppKey("inferway_async_infer")
"""Set by the jobs (jobs/http_routes.py): takes an infer request that prefers to be answered
asynchronously (its answer, a 202), or returns None to have it served here."""


def envoy_timeout_s(raw: str | None) -> float | None:
    """The deadline Envoy's timeout header names, in seconds (None: none, or 0)."""
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise InferInputError(
            f"header {ENVOY_TIMEOUT_HEADER} must be a number of milliseconds, got {raw!r}"
        ) from None
    return ms / 1000 if ms > 0 else None


def _error(failure: Failure) -> web.Response:
    resp = web.json_response({"error": failure.message}, status=failure.http_status)
    if failure.retry_after_s is not None:
        # Retry-After counts whole seconds (RFC 9110); round up so clients never retry early.
        resp.headers["Retry-After"] = str(max(1, int(-(-failure.retry_after_s // 1))))
    if failure.http_status == 408:  # a body that never came whole: the connection ends
        resp.force_close()
    return resp


@web.middleware
async def _guard(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn anything a handler raises into a JSON answer and stamp the ORCA load report."""
    try:
        resp = await handler(request)
    except web.HTTPException as exc:
        resp = web.json_response(
            {"error": exc.reason if exc.text is None else exc.text}, status=exc.status
        )
    except Exception as exc:
        resp = _error(
            classify_error(exc, request_id=request.headers.get(tracing.REQUEST_ID_HEADER))
        )
    report = request.app[_CORE].load_report()
    if report is not None:
        resp.headers[orca.ORCA_HEADER] = report
    request_id = request.headers.get(tracing.REQUEST_ID_HEADER)
    if request_id:
        resp.headers[tracing.REQUEST_ID_HEADER] = request_id
    return resp


async def _server_metadata(request: web.Request) -> web.Response:
    return web.json_response(
        {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}
    )


async def _live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def _ready(request: web.Request) -> web.Response:
    ready = request.app[_CORE].ready
    return web.json_response({"ready": ready}, status=200 if ready else 503)


def _model(request: web.Request) -> ServedModel:
    return request.app[_CORE].model(request.match_info["model"], request.match_info.get("version"))


def _tensor_meta(spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


async def _model_metadata(request: web.Request) -> web.Response:
    model = _model(request)
    versions = request.app[_CORE].versions(model.name)
    return web.json_response(
        {
            "name": model.name,
            "versions": versions,
            "platform": model.platform,
            "inputs": [_tensor_meta(s) for s in model.inputs],
            "outputs": [_tensor_meta(s) for s in model.outputs],
        }
    )


async def _model_ready(request: web.Request) -> web.Response:
    model = _model(request)
    return web.json_response({"name": model.name, "version": str(model.version), "ready": True})


async def _model_config(request: web.Request) -> web.Response:
    return web.json_response(model_config_json(_model(request)))


async def _model_stats(request: web.Request) -> web.Response:
    name = request.match_info.get("model", "")
    stats = request.app[_CORE].statistics(name, request.match_info.get("version", ""))
    return web.json_response({"model_stats": stats})


async def _json_object(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body; an empty body is ``{}`` (tritonclient sends none)."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise UnsupportedRequestError(f"{request.path}: body is not JSON: {exc}") from None
    except RecursionError:  # the parser recurses per level: a bomb of nested lists
        raise UnsupportedRequestError(f"{request.path}: body is nested too deeply") from None
    if not isinstance(body, dict):
        raise UnsupportedRequestError(f"{request.path}: body must be a JSON object")
    return body


def _parameter_names(body: dict[str, Any], path: str) -> list[str]:
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise UnsupportedRequestError(f"{path}: parameters must be a JSON object")
    return list(parameters)


async def _repository_index(request: web.Request) -> web.Response:
    ready = (await _json_object(request)).get("ready", False)
    if not isinstance(ready, bool):
        raise UnsupportedRequestError(f"{request.path}: ready must be true or false")
    core = request.app[_CORE]
    return web.json_response(core.index(request.match_info.get("repository", ""), ready))


async def _repository_load(request: web.Request) -> web.Response:
    names = _parameter_names(await _json_object(request), request.path)
    core = request.app[_CORE]
    await core.load(request.match_info.get("repository", ""), request.match_info["model"], names)
    return web.json_response({})


async def _repository_unload(request: web.Request) -> web.Response:
    names = _parameter_names(await _json_object(request), request.path)
    core = request.app[_CORE]
    await core.unload(request.match_info.get("repository", ""), request.match_info["model"], names)
    return web.json_response({})


async def _outputs(request: web.Request) -> web.Response:
    """Recorded answer digests after ``?since=SEQ`` (default 0), at most ``?limit=N``
    (default 1000): ``{"records": [...], "next": SEQ, "evicted": N, "epoch": ID}`` (a new
    epoch: the process restarted, sequence numbers began again). 404 when off."""
    recorder = request.app[_CORE].outputs
    if recorder is None:
        raise web.HTTPNotFound(
            text="not recording outputs: start the backend with --record-outputs N"
        )
    try:
        since = int(request.query.get("since", "0"))
        limit = int(request.query.get("limit", "1000"))
    except ValueError:
        raise web.HTTPBadRequest(text="since and limit must be whole numbers") from None
    if since < 0 or not 1 <= limit <= 10_000:
        raise web.HTTPBadRequest(text="since must be >= 0 and limit between 1 and 10000")
    records, next_seq = recorder.since(since, limit)
    return web.json_response(
        {
            "records": [r.to_json() for r in records],
            "next": next_seq,
            "evicted": recorder.evicted,
            "epoch": recorder.epoch,
        }
    )


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[_CORE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


class _HttpCall:
    """One POST .../infer as the serving core sees it (see InferCall)."""

    __slots__ = ("body", "model_name", "model_version", "request")
    needs_read = True

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.model_name: str = request.match_info["model"]
        self.model_version: str | None = request.match_info.get("version")
        self.body = b""

    def body_size(self) -> int | None:
        return self.request.content_length

    async def read_body(self, limit: int, model: str) -> None:
        chunks: list[bytes] = []
        total = 0
        seconds = self.request.app[_CORE].settings.body_timeout_s
        try:
            async with asyncio.timeout(seconds):
                async for chunk in self.request.content.iter_chunked(1 << 20):
                    total += len(chunk)
                    if total > limit:
                        raise PayloadTooLargeError(None, limit, model)
                    chunks.append(chunk)
        except TimeoutError:
            raise BodyTimeoutError(seconds) from None
        self.body = b"".join(chunks)

    def decode(self, model: ServedModel) -> DecodedRequest:
        head, binary = split_binary_body(self.body, self.request.headers.get(BINARY_HEADER))
        return decode_json_request(parse_json_header(head), binary, model.inputs)

    def transport_timeout_s(self) -> float | None:
        return envoy_timeout_s(self.request.headers.get(ENVOY_TIMEOUT_HEADER))

    def encode(self, model: ServedModel, decoded: DecodedRequest, outputs: Chosen) -> web.Response:
        payload, head_len = encode_json_response(
            model_name=model.name,
            model_version=str(model.version),
            request_id=decoded.id,
            outputs=outputs,
            binary_default=decoded.binary_output,
        )
        if head_len is None:
            return web.Response(body=payload, content_type="application/json")
        resp = web.Response(body=payload, content_type="application/octet-stream")
        resp.headers[BINARY_HEADER] = str(head_len)
        return resp


async def _infer(request: web.Request) -> web.StreamResponse:
    submit_async = request.app.get(ASYNC_INFER)
    if submit_async is not None and (accepted := await submit_async(request)) is not None:
        return accepted
    core = request.app[_CORE]
    parent = tracing.extract_context(request.headers) if tracing.is_tracing(core.tracer) else None
    response, failure = await core.infer(
        _HttpCall(request),
        HTTP,
        parent=parent,
        request_id=request.headers.get(tracing.REQUEST_ID_HEADER),
    )
    if failure is not None:
        return _error(failure)
    assert response is not None
    return response


def build_http_app(core: ServingCore) -> web.Application:
    """The aiohttp application in front of ``core``: OIP routes, health, metadata,
    /metrics and the recorded answer digests (/v2/debug/outputs). x-request-id is echoed
    back; every answer carries the ORCA load report."""
    install_bad_http_filter()  # a client's malformed HTTP is a 400, not a logged traceback
    # Inference bodies are streamed under the core's limit; client_max_size bounds the rest.
    app = web.Application(middlewares=[_guard], client_max_size=core.settings.max_body_bytes)
    app[_CORE] = core
    base = "/v2/models/{model}"
    app.router.add_get("/v2", _server_metadata)
    app.router.add_get("/v2/health/live", _live)
    app.router.add_get("/v2/health/ready", _ready)
    app.router.add_get("/metrics", _metrics)
    # Triton's statistics, model configuration and model repository extensions; the
    # all-models statistics route comes before the model routes it would otherwise match.
    app.router.add_get("/v2/models/stats", _model_stats)
    for repo in ("/v2/repository", "/v2/repository/{repository}"):
        app.router.add_post(repo + "/index", _repository_index)
        app.router.add_post(repo + "/models/{model}/load", _repository_load)
        app.router.add_post(repo + "/models/{model}/unload", _repository_unload)
    app.router.add_get("/v2/debug/outputs", _outputs)
    for prefix in (base, base + "/versions/{version}"):
        app.router.add_get(prefix, _model_metadata)
        app.router.add_get(prefix + "/ready", _model_ready)
        app.router.add_get(prefix + "/config", _model_config)
        app.router.add_get(prefix + "/stats", _model_stats)
        app.router.add_post(prefix + "/infer", _infer)
    return app
