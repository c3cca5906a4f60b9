"""The jobs' HTTP API, added to the backend's OIP application.

``POST /v2/models/{m}[/versions/{v}]/infer`` with ``Prefer: respond-async`` (RFC 7240) is
validated like a synchronous request (model, body limit, tensors) and answered 202 with the job
document and ``Location: /v2/jobs/{id}``; ``Inferway-Callback: URL`` asks for the finished job
to be POSTed there. ``GET /v2/jobs/{id}`` polls, ``DELETE /v2/jobs/{id}`` cancels,
``GET /v2/jobs/{id}/result`` answers exactly what the synchronous request would have.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext

from aiohttp import web
from opentelemetry import propagate
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Tracer

from inferway.backends.jobs.call import decode_job_request
from inferway.backends.jobs.callbacks import check_callback_url
from inferway.backends.jobs.records import (
    JobConflictError,
    JobNotFoundError,
    JobState,
    describe,
)
from inferway.backends.jobs.service import JobService
from inferway.backends.jobs.store import JobStoreFullError, JobStoreUnavailableError
from inferway.backends.protocol.http_server import ASYNC_INFER, BINARY_HEADER
from inferway.backends.serving.failures import (
    NotReadyError,
    PayloadTooLargeError,
    UnsupportedRequestError,
    classify_error,
)
from inferway.backends.telemetry import tracing

__all__ = ["CALLBACK_HEADER", "add_job_routes", "prefers_async"]

CALLBACK_HEADER = "Inferway-Callback"
_SERVICE = web.AppKey("inferway_jobs", JobService)
_JOB_ID = re.compile(r"[0-9a-f]{32}")


def prefers_async(values: Iterable[str]) -> bool:
    """Whether ``Prefer`` header values ask for ``respond-async`` (tokens are case-insensitive
    and may carry ``=value`` and ``;parameters``, RFC 7240 section 2)."""
    for value in values:
        for preference in value.split(","):
            token = preference.split(";", 1)[0].split("=", 1)[0].strip().lower()
            if token == "respond-async":
                return True
    return False


def _json_error(status: int, message: str, retry_after_s: float | None = None) -> web.Response:
    resp = web.json_response({"error": message}, status=status)
    if retry_after_s is not None:
        resp.headers["Retry-After"] = str(max(1, int(-(-retry_after_s // 1))))
    return resp


def _store_error(exc: Exception) -> web.Response:
    if isinstance(exc, JobNotFoundError):
        return _json_error(404, str(exc))
    if isinstance(exc, JobConflictError):
        return _json_error(409, str(exc))
    if isinstance(exc, JobStoreFullError):
        return _json_error(429, str(exc), exc.retry_after_s)
    return _json_error(503, f"job store unavailable: {exc}")


_STORE_ERRORS = (JobNotFoundError, JobConflictError, JobStoreFullError, JobStoreUnavailableError)


def _job_id(request: web.Request) -> str:
    job_id = request.match_info["job"]
    if not _JOB_ID.fullmatch(job_id):
        raise JobNotFoundError(job_id)
    return job_id


async def _submit(request: web.Request) -> web.StreamResponse | None:
    """The ASYNC_INFER hook: None (serve synchronously) unless the request prefers async."""
    if not prefers_async(request.headers.getall("Prefer", ())):
        return None
    service = request.app[_SERVICE]
    core = service.core
    name = request.match_info["model"]
    version = request.match_info.get("version")
    request_id = request.headers.get(tracing.REQUEST_ID_HEADER)
    try:
        callback = request.headers.get(CALLBACK_HEADER)
        if callback is not None:
            try:
                check_callback_url(callback)
            except ValueError as exc:
                raise UnsupportedRequestError(f"header {CALLBACK_HEADER}: {exc}") from None
        if not core.repository.loaded:
            raise NotReadyError("the server is still loading its models")
        model = core.model(name, version)
        limit = core.settings.body_limit(model.config)
        if request.content_length is not None and request.content_length > limit:
            raise PayloadTooLargeError(request.content_length, limit, model.name)
        body = await request.read()
        if len(body) > limit:
            raise PayloadTooLargeError(len(body), limit, model.name)
        decode_job_request(model, body, request.headers.get(BINARY_HEADER))
    except Exception as exc:
        failure = classify_error(exc, request_id=request_id, model=name)
        return _json_error(failure.http_status, failure.message, failure.retry_after_s)
    trace: dict[str, str] = {}
    with _submit_span(core.tracer, name, request) as span:
        propagate.inject(trace)  # the submit span's context, for the job span's link
        try:
            job = await service.submit(
                model=name,
                version=version,
                body=body,
                binary_header=request.headers.get(BINARY_HEADER),
                request_id=request_id,
                callback_url=callback,
                trace=trace,
            )
        except _STORE_ERRORS as exc:
            span.set_attribute("inferway.error", str(exc))
            return _store_error(exc)
        span.set_attribute("inferway.job_id", job.id)
    resp = web.json_response(describe(job), status=202)
    resp.headers["Location"] = f"/v2/jobs/{job.id}"
    resp.headers["Preference-Applied"] = "respond-async"
    return resp


def _submit_span(tracer: Tracer, model: str, request: web.Request) -> AbstractContextManager[Span]:
    """A SERVER span "submit <model>" under the caller's trace (a no-op without an SDK)."""
    if not tracing.is_tracing(tracer):
        return nullcontext(INVALID_SPAN)
    return tracer.start_as_current_span(
        f"submit {model}",
        context=tracing.extract_context(request.headers),
        kind=SpanKind.SERVER,
        attributes={"inferway.model": model},
    )


async def _status(request: web.Request) -> web.Response:
    try:
        return web.json_response(await request.app[_SERVICE].document(_job_id(request)))
    except _STORE_ERRORS as exc:
        return _store_error(exc)


async def _cancel(request: web.Request) -> web.Response:
    try:
        return web.json_response(await request.app[_SERVICE].cancel(_job_id(request)))
    except _STORE_ERRORS as exc:
        return _store_error(exc)


async def _result(request: web.Request) -> web.Response:
    """The synchronous request's answer: its body (binary header included), or its error."""
    try:
        job, body = await request.app[_SERVICE].result(_job_id(request))
    except _STORE_ERRORS as exc:
        return _store_error(exc)
    if job.state is JobState.FAILED and job.error is not None:
        return _json_error(job.error.status, job.error.message)
    if body is None:
        return _json_error(409, f"job {job.id} is {job.state}: it has no result")
    if job.result_header is None:
        return web.Response(body=body, content_type="application/json")
    resp = web.Response(body=body, content_type="application/octet-stream")
    resp.headers[BINARY_HEADER] = str(job.result_header)
    return resp


def add_job_routes(app: web.Application, service: JobService) -> None:
    """Serve ``service``'s jobs on ``app`` (before it starts)."""
    app[_SERVICE] = service
    app[ASYNC_INFER] = _submit
    app.router.add_get("/v2/jobs/{job}", _status)
    app.router.add_delete("/v2/jobs/{job}", _cancel)
    app.router.add_get("/v2/jobs/{job}/result", _result)
