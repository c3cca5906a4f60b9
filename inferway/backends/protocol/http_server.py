"""Open Inference Protocol (KServe v2) over HTTP, with the binary tensor data extension.

Every response, errors included, carries the ORCA load header; every failure is a JSON
``{"error": "..."}`` with a 4xx/5xx status, never a dropped connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from inferway.backends.protocol.binary_codec import split_binary_body
from inferway.backends.protocol.json_codec import (
    decode_json_request,
    encode_json_response,
    parse_json_header,
)
from inferway.backends.serving.failures import (
    DEFAULT_MAX_BODY_BYTES,
    Failure,
    NotReadyError,
    PayloadTooLargeError,
    classify_error,
    resolve_timeout_param,
    run_inference,
)
from inferway.backends.serving.input_validation import InferInputError
from inferway.backends.serving.request import select_outputs
from inferway.backends.telemetry import orca, tracing
from inferway.backends.telemetry.metrics import CONTENT_TYPE, BackendMetrics

__all__ = [
    "BINARY_HEADER",
    "ENVOY_TIMEOUT_HEADER",
    "SERVER_NAME",
    "SERVER_VERSION",
    "build_http_app",
]

log = logging.getLogger("inferway.backends.http")

SERVER_NAME = "inferway"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data", "model_repository_metadata")
BINARY_HEADER = "Inference-Header-Content-Length"
UNKNOWN_MODEL = "_unknown"
ENVOY_TIMEOUT_HEADER = "x-envoy-expected-rq-timeout-ms"
"""Envoy tells the upstream how long the route waits; the backend treats it as a deadline."""


@dataclass
class _State:
    repository: Any
    metrics: BackendMetrics
    max_body_bytes: int
    orca: orca.LoadReporter
    tracer: Any = None


_STATE = web.AppKey("inferway_state", _State)


def _error(failure: Failure) -> web.Response:
    resp = web.json_response({"error": failure.message}, status=failure.http_status)
    if failure.retry_after_s is not None:
        # Retry-After counts whole seconds (RFC 9110); round up so clients never retry early.
        resp.headers["Retry-After"] = str(max(1, int(-(-failure.retry_after_s // 1))))
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
        resp = _error(classify_error(exc))
    try:
        resp.headers[orca.ORCA_HEADER] = request.app[_STATE].orca.header()
    except Exception:
        log.exception("could not compute the ORCA load report")
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
    ready = bool(request.app[_STATE].repository.ready)
    return web.json_response({"ready": ready}, status=200 if ready else 503)


def _model(request: web.Request) -> Any:
    state = request.app[_STATE]
    return state.repository.get(request.match_info["model"], request.match_info.get("version"))


def _tensor_meta(spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


async def _model_metadata(request: web.Request) -> web.Response:
    model = _model(request)
    versions = sorted(
        {str(m.version) for m in request.app[_STATE].repository.models() if m.name == model.name}
    )
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


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[_STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _read_body(request: web.Request, limit: int, model: str) -> bytes:
    size = request.content_length
    if size is not None and size > limit:
        raise PayloadTooLargeError(size, limit, model)
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.content.iter_chunked(1 << 20):
        total += len(chunk)
        if total > limit:
            raise PayloadTooLargeError(None, limit, model)
        chunks.append(chunk)
    return b"".join(chunks)


def _header_timeout(request: web.Request) -> float | None:
    raw = request.headers.get(ENVOY_TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise InferInputError(
            f"header {ENVOY_TIMEOUT_HEADER} must be a number of milliseconds, got {raw!r}"
        ) from None
    return ms / 1000 if ms > 0 else None


async def _infer_once(request: web.Request, span: Any, served: dict[str, str]) -> web.Response:
    """Decode, run and encode one request; notes the served version in ``served``."""
    state = request.app[_STATE]
    if not state.repository.ready:
        raise NotReadyError("the server is still loading its models")
    model = _model(request)
    served["model"] = model.name
    version = served["version"] = str(model.version)
    # The model's own limit (config.yaml max_input_bytes) wins over the server default.
    limit = int(getattr(model.config, "max_input_bytes", None) or state.max_body_bytes)
    body = await _read_body(request, limit, model.name)
    head, binary = split_binary_body(body, request.headers.get(BINARY_HEADER))
    decoded = decode_json_request(parse_json_header(head), binary, model.inputs)
    if decoded.id:
        span.set_attribute("inferway.request_id", decoded.id)
    output_names = [s.name for s in model.outputs]
    if decoded.outputs is not None:
        select_outputs({n: None for n in output_names}, decoded.outputs, output_names)
    timeouts = [
        t for t in (resolve_timeout_param(decoded.parameters), _header_timeout(request)) if t
    ]
    results = await run_inference(
        model.executor, decoded.inputs, timeout_s=min(timeouts) if timeouts else None
    )
    chosen = select_outputs(results, decoded.outputs, output_names)
    payload, head_len = encode_json_response(
        model_name=model.name,
        model_version=version,
        request_id=decoded.id,
        outputs=chosen,
        binary_default=decoded.binary_output,
    )
    if head_len is None:
        return web.Response(body=payload, content_type="application/json")
    resp = web.Response(body=payload, content_type="application/octet-stream")
    resp.headers[BINARY_HEADER] = str(head_len)
    return resp


async def _infer(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    started = time.perf_counter()
    name = request.match_info["model"]
    # Metric labels name only served models: client-chosen names must not grow the series.
    served = {"model": UNKNOWN_MODEL, "version": ""}
    tracer = state.tracer
    parent = tracing.extract_context(request.headers) if tracing.is_tracing(tracer) else None
    with tracing.request_span(
        name,
        protocol="http",
        parent=parent,
        request_id=request.headers.get(tracing.REQUEST_ID_HEADER),
        tracer=tracer,
    ) as span:
        error: str | None = None
        try:
            resp = await _infer_once(request, span, served)
        except Exception as exc:
            failure = classify_error(exc)
            resp = _error(failure)
            error = failure.message
        tracing.set_span_outcome(
            span, code=resp.status, version=served["version"], error=error, fault=resp.status >= 500
        )
    state.metrics.observe_request(
        model=served["model"],
        version=served["version"],
        protocol="http",
        code=resp.status,
        seconds=time.perf_counter() - started,
    )
    return resp


def build_http_app(
    repository: Any,
    *,
    metrics: BackendMetrics,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    tracer_provider: Any = None,
) -> web.Application:
    """The aiohttp application serving ``repository`` (a ModelRepository). Request spans go
    to ``tracer_provider`` (the global one when None); x-request-id is echoed back."""
    app = web.Application(middlewares=[_guard], client_max_size=max_body_bytes)
    app[_STATE] = _State(
        repository=repository,
        metrics=metrics,
        max_body_bytes=max_body_bytes,
        orca=orca.LoadReporter(repository.models),
        tracer=tracing.backend_tracer(tracer_provider),
    )
    base = "/v2/models/{model}"
    app.router.add_get("/v2", _server_metadata)
    app.router.add_get("/v2/health/live", _live)
    app.router.add_get("/v2/health/ready", _ready)
    app.router.add_get("/metrics", _metrics)
    for prefix in (base, base + "/versions/{version}"):
        app.router.add_get(prefix, _model_metadata)
        app.router.add_get(prefix + "/ready", _model_ready)
        app.router.add_post(prefix + "/infer", _infer)
    return app
