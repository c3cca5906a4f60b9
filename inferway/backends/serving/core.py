"""The serving core: one inference path for every front end.

A request goes through the same steps whichever wire it came on: readiness, model lookup, the
body limit, decoding, the deadline, the request span, the batcher, output selection, and one
count in the metrics with the status its wire reports. The HTTP and gRPC servers only adapt
their wire format to :class:`InferCall` (read, decode, encode) and map a :class:`Failure` to
their error answer; they hold no copy of the lifecycle, so they cannot drift apart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import numpy as np
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, INVALID_SPAN_CONTEXT, Span, TracerProvider

from inferway.backends.batching.errors import DeadlineExceededError
from inferway.backends.models.index import repository_index
from inferway.backends.serving.deadline import resolve_timeout_param, run_inference
from inferway.backends.serving.failures import (
    CLIENT_GONE,
    Failure,
    NotReadyError,
    PayloadTooLargeError,
    UnsupportedRequestError,
    classify_error,
)
from inferway.backends.serving.request import (
    DecodedRequest,
    check_requested_outputs,
    select_outputs,
)
from inferway.backends.serving.settings import ServingSettings
from inferway.backends.telemetry import orca, tracing
from inferway.backends.telemetry.metrics import BackendMetrics
from inferway.backends.telemetry.output_digest import OutputRecorder
from inferway.observability.masking import build_masker_from

if TYPE_CHECKING:
    from inferway.backends.models.repository import ModelRepository
    from inferway.backends.models.served_model import ServedModel

__all__ = ["UNKNOWN_MODEL", "Chosen", "InferCall", "ServingCore", "Transport"]

log = logging.getLogger("inferway.backends")

UNKNOWN_MODEL = "_unknown"
"""The metrics label of a request for no served model: client-chosen names must not grow the
series."""

ResponseT = TypeVar("ResponseT")
ResponseT_co = TypeVar("ResponseT_co", covariant=True)
Chosen = list[tuple[str, np.ndarray, bool | None]]
"""The outputs to send, in order: (name, rows, binary flag; None: the request's default)."""


class InferCall(Protocol[ResponseT_co]):
    """One request as its front end holds it; the core asks it for what only the wire knows."""

    model_name: str
    model_version: str | None
    needs_read: bool
    """True when the body still has to be read (``read_body``) before ``decode``."""

    def body_size(self) -> int | None:
        """The body's size when known before reading it (Content-Length, message size)."""

    async def read_body(self, limit: int, model: str) -> None:
        """Read the body, raising PayloadTooLargeError once it passes ``limit`` bytes."""

    def decode(self, model: ServedModel) -> DecodedRequest:
        """The request's tensors and options, validated against the model."""

    def transport_timeout_s(self) -> float | None:
        """The deadline the transport imposes, in seconds from now (None: none)."""

    def encode(self, model: ServedModel, decoded: DecodedRequest, outputs: Chosen) -> ResponseT_co:
        """The wire's answer carrying ``outputs``."""


@dataclass(frozen=True, slots=True)
class Transport:
    """How one front end is labelled: ``protocol`` in metrics (http, grpc, grpc_stream),
    ``wire`` for the status codes and span attributes it reports. ``call_request_ids``: the
    call's request id names one request (not a stream of many), so its answer's digest may be
    recorded under it."""

    protocol: str
    wire: Literal["http", "grpc"]
    call_request_ids: bool = True

    def code(self, failure: Failure | None) -> int | str:
        """The status label of an outcome on this wire (200 / OK on success)."""
        if failure is None:
            return 200 if self.wire == "http" else "OK"
        return failure.code(self.wire)


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~3x, per request
class _Prepared:
    decoded: DecodedRequest
    output_names: Sequence[str]
    timeout_s: float | None


class ServingCore:
    """Serves inference requests over one ModelRepository for any number of front ends."""

    def __init__(
        self,
        repository: ModelRepository,
        metrics: BackendMetrics,
        *,
        settings: ServingSettings | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.repository = repository
        self.metrics = metrics
        self.settings = settings if settings is not None else ServingSettings()
        self.tracer = tracing.backend_tracer(tracer_provider)
        self._orca = orca.LoadReporter(repository.models)
        self.masker = build_masker_from(self.settings.mask)
        self.outputs: OutputRecorder | None = (
            OutputRecorder(self.settings.record_outputs, masker=self.masker)
            if self.settings.record_outputs
            else None
        )
        """Digests of recent answers by request id (None: not recording)."""

    # -- what the non-inference endpoints ask ---------------------------------------------

    @property
    def ready(self) -> bool:
        """Health: loaded, and every model in the repository serving (see ModelRepository)."""
        return bool(self.repository.ready)

    def model(self, name: str, version: str | None) -> ServedModel:
        """The served model (raises ModelNotFoundError, which says what is served)."""
        return self.repository.get(name, version or None)

    def versions(self, name: str) -> list[str]:
        return sorted({str(m.version) for m in self.repository.models() if m.name == name})

    def load_report(self) -> str | None:
        """The ORCA header value for every answer; None (logged) if it cannot be computed."""
        try:
            return self._orca.header()
        except Exception:
            log.exception("could not compute the ORCA load report")
            return None

    # -- Triton's statistics and model repository extensions ------------------------------

    def statistics(self, name: str, version: str) -> list[dict[str, Any]]:
        """Triton's ``model_stats``: every served version, of ``name`` when given, only
        ``version`` when given too (raises ModelNotFoundError for one not served)."""
        if not name:
            if version:
                raise UnsupportedRequestError("statistics of a version need the model's name")
            models = self.repository.models()
        elif version:
            models = [self.model(name, version)]
        else:
            self.model(name, None)
            models = [m for m in self.repository.models() if m.name == name]
        book = self.metrics.statistics
        return [book.get(m.name, m.version).as_dict(m.name, m.version) for m in models]

    def index(self, repository_name: str, ready_only: bool) -> list[dict[str, str]]:
        """Triton's repository index entries (see models/index.py)."""
        self._check_repository(repository_name)
        return [e.as_dict() for e in repository_index(self.repository, ready_only=ready_only)]

    async def load(self, repository_name: str, name: str, parameters: Sequence[str]) -> None:
        """Load (or retry) one model on request; ``parameters`` are the request's names."""
        self._check_control(repository_name, parameters, "load")
        await self.repository.load_model(name)

    async def unload(self, repository_name: str, name: str, parameters: Sequence[str]) -> None:
        """Take one model out of service on request, until it is loaded again."""
        known = {"unload_dependents"}  # inferway's models have no dependents: nothing to do
        self._check_control(repository_name, [p for p in parameters if p not in known], "unload")
        await self.repository.unload_model(name)

    def _check_repository(self, repository_name: str) -> None:
        if repository_name and repository_name != self.repository.root.name:
            raise UnsupportedRequestError(
                f"unknown repository {repository_name!r}: this server serves one, "
                f"{self.repository.root.name!r} (an empty name means it too)"
            )

    def _check_control(self, repository_name: str, parameters: Sequence[str], what: str) -> None:
        self._check_repository(repository_name)
        if parameters:
            raise UnsupportedRequestError(
                f"{what} parameters {sorted(parameters)} are not supported: models load from "
                "their files in the repository (config.yaml beside model.onnx)"
            )
        if self.metrics.shared_dir is not None:
            raise UnsupportedRequestError(
                f"model {what} is not supported with --workers: it would reach only the "
                "worker that answered; edit the repository directory instead"
            )

    # -- inference -------------------------------------------------------------------------

    async def infer(
        self,
        call: InferCall[ResponseT],
        transport: Transport,
        *,
        parent: Context | None = None,
        request_id: str | None = None,
    ) -> tuple[ResponseT | None, Failure | None]:
        """Run one request end to end: (response, None) or (None, failure). Never raises
        for a bad request; every outcome is traced and counted once."""
        started = time.perf_counter()
        model: ServedModel | None = None
        response: ResponseT | None = None
        failure: Failure | None = None
        with tracing.request_span(
            call.model_name,
            protocol=transport.wire,
            parent=parent,
            request_id=request_id,
            tracer=self.tracer,
        ) as span:
            try:
                model = self._lookup(call)
                limit = self._check_size(call, model)
                if call.needs_read:
                    await call.read_body(limit, model.name)
                job = self._prepare(call, model, span)
                results = await run_inference(
                    model.executor, job.decoded.inputs, timeout_s=job.timeout_s
                )
                chosen = select_outputs(results, job.decoded.outputs, job.output_names)
                response = call.encode(model, job.decoded, chosen)
                if self.outputs is not None and request_id and transport.call_request_ids:
                    self.outputs.record(request_id, model.name, str(model.version), chosen)
            except asyncio.CancelledError:  # the caller went away (or the server is stopping)
                self._outcome(span, model, transport, started, CLIENT_GONE)
                raise
            except Exception as exc:
                failure = classify_error(exc, request_id=request_id, model=call.model_name)
            self._outcome(span, model, transport, started, failure)
        return response, failure

    def submit(
        self,
        call: InferCall[ResponseT],
        transport: Transport,
        finish: Callable[[ResponseT | None, Failure | None], None],
        request_id: str | None = None,
    ) -> asyncio.Future[dict[str, np.ndarray]] | None:
        """``infer`` without a coroutine or a span, for streams that carry many requests:
        ``finish`` gets the outcome from the batch's callback. Returns the queued future
        (cancel it to drop the request), or None when the request failed before queueing.
        The call's body must already be read (``needs_read`` False)."""
        started = time.perf_counter()
        model: ServedModel | None = None
        job: _Prepared | None = None

        def done(fut: asyncio.Future[dict[str, np.ndarray]]) -> None:
            assert model is not None and job is not None  # both set before the request queued
            if fut.cancelled():  # the stream broke: nobody is left to answer
                self._count(model, transport.protocol, transport.code(CLIENT_GONE), started)
                return
            response: ResponseT | None = None
            failure: Failure | None = None
            try:
                chosen = select_outputs(fut.result(), job.decoded.outputs, job.output_names)
                response = call.encode(model, job.decoded, chosen)
            except Exception as exc:
                failure = classify_error(exc, request_id=request_id, model=model.name)
            self._count(model, transport.protocol, transport.code(failure), started)
            finish(response, failure)

        try:
            model = self._lookup(call)
            self._check_size(call, model)
            job = self._prepare(call, model, INVALID_SPAN)
            if job.timeout_s is not None and job.timeout_s <= 0:
                raise DeadlineExceededError("the deadline had passed before the request was queued")
            return model.executor.submit(
                job.decoded.inputs,
                timeout=job.timeout_s,
                span_context=INVALID_SPAN_CONTEXT,
                on_done=done,
            )
        except Exception as exc:
            failure = classify_error(exc, request_id=request_id, model=call.model_name)
            self._count(model, transport.protocol, transport.code(failure), started)
            finish(None, failure)
            return None

    def _lookup(self, call: InferCall[ResponseT]) -> ServedModel:
        if not self.repository.loaded:  # not ``ready``: one unservable model spares the rest
            raise NotReadyError("the server is still loading its models")
        return self.repository.get(call.model_name, call.model_version or None)

    def _check_size(self, call: InferCall[ResponseT], model: ServedModel) -> int:
        """The body limit for ``model``, enforced here where the size is known up front."""
        limit = self.settings.body_limit(model.config)
        size = call.body_size()
        if size is not None and size > limit:
            raise PayloadTooLargeError(size, limit, model.name)
        return limit

    def _prepare(self, call: InferCall[ResponseT], model: ServedModel, span: Span) -> _Prepared:
        """Decode, check the requested outputs, and settle the deadline."""
        decoded = call.decode(model)
        if decoded.id:
            span.set_attribute("inferway.request_id", decoded.id)
        output_names = [s.name for s in model.outputs]
        if decoded.outputs is not None:  # unknown outputs are refused before computing
            check_requested_outputs(decoded.outputs, output_names)
        timeout_s = self.settings.timeout_s(
            resolve_timeout_param(decoded.parameters), call.transport_timeout_s()
        )
        return _Prepared(decoded, output_names, timeout_s)

    def _outcome(
        self,
        span: Span,
        model: ServedModel | None,
        transport: Transport,
        started: float,
        failure: Failure | None,
    ) -> None:
        """Record the answer on the request span and count it."""
        code = transport.code(failure)
        tracing.set_span_outcome(
            span,
            code=code,
            version=str(model.version) if model is not None else "",
            error=self.masker.text(failure.message) if failure is not None else None,
            fault=failure is not None and failure.http_status >= 500,
        )
        self._count(model, transport.protocol, code, started)

    def _count(
        self, model: ServedModel | None, protocol: str, code: int | str, started: float
    ) -> None:
        self.metrics.observe_request(
            model=model.name if model is not None else UNKNOWN_MODEL,
            version=str(model.version) if model is not None else "",
            protocol=protocol,
            code=code,
            seconds=time.perf_counter() - started,
        )
