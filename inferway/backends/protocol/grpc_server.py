"""Open Inference Protocol (KServe v2) over gRPC: ``inference.GRPCInferenceService``.

Every answer carries the ORCA load report in its trailing metadata (Envoy's router reads a
report from the response headers or, failing that, the trailers: sending it once, at the end,
saves a metadata frame per call and reports the load after the work); failures map to
gRPC status codes (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED,
UNAVAILABLE, INTERNAL) with a message saying what was wrong. The client's deadline bounds
the request's time in the batching queue. ``ModelStreamInfer`` (Triton's streaming
extension) carries many requests per call, which costs a fraction of a unary call's CPU.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from opentelemetry.trace import INVALID_SPAN, INVALID_SPAN_CONTEXT

from inferway.backends.batching.errors import DeadlineExceededError
from inferway.backends.models.served_model import ModelNotFoundError
from inferway.backends.protocol import pb2, pb2_grpc
from inferway.backends.protocol.grpc_codec import decode_grpc_request, encode_grpc_response
from inferway.backends.protocol.http_server import (
    EXTENSIONS,
    SERVER_NAME,
    SERVER_VERSION,
    UNKNOWN_MODEL,
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
from inferway.backends.serving.request import select_outputs
from inferway.backends.telemetry import orca, tracing
from inferway.backends.telemetry.metrics import BackendMetrics

__all__ = ["RETRY_PUSHBACK_KEY", "STREAM_PROTOCOL", "InferenceServicer", "start_grpc_server"]

log = logging.getLogger("inferway.backends.grpc")

RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
"""gRPC's standard server pushback: how long the client should wait before retrying."""


class InferenceServicer(pb2_grpc.GRPCInferenceServiceServicer):
    """The service over one ModelRepository."""

    def __init__(
        self, repository: Any, metrics: BackendMetrics, tracer_provider: Any = None
    ) -> None:
        self._repository = repository
        self._metrics = metrics
        self._tracer = tracing.backend_tracer(tracer_provider)
        self._orca = orca.LoadReporter(repository.models)

    def _load_metadata(self) -> tuple[tuple[str, str], ...]:
        try:
            return ((orca.ORCA_HEADER, self._orca.header()),)
        except Exception:
            log.exception("could not compute the ORCA load report")
            return ()

    def _answer(self, context: grpc.aio.ServicerContext, response: Any) -> Any:
        context.set_trailing_metadata(self._load_metadata())
        return response

    async def _fail(self, context: grpc.aio.ServicerContext, failure: Failure) -> None:
        md = list(self._load_metadata())
        message = failure.message
        if failure.retry_after_s is not None:
            md.append((RETRY_PUSHBACK_KEY, str(max(1, round(failure.retry_after_s * 1000)))))
        await context.abort(failure.grpc_code, message, trailing_metadata=tuple(md))

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self._answer(context, pb2.ServerLiveResponse(live=True))

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        ready = bool(self._repository.ready)
        return self._answer(context, pb2.ServerReadyResponse(ready=ready))

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = pb2.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=list(EXTENSIONS)
        )
        return self._answer(context, response)

    def _get(self, name: str, version: str) -> Any:
        return self._repository.get(name, version or None)

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            self._get(request.name, request.version)
        except ModelNotFoundError as exc:
            await self._fail(context, classify_error(exc))
        return self._answer(context, pb2.ModelReadyResponse(ready=True))

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            model = self._get(request.name, request.version)
        except ModelNotFoundError as exc:
            await self._fail(context, classify_error(exc))
        versions = sorted(
            {str(m.version) for m in self._repository.models() if m.name == model.name}
        )
        response = pb2.ModelMetadataResponse(
            name=model.name, versions=versions, platform=model.platform
        )
        for spec in model.inputs:
            response.inputs.add(name=spec.name, datatype=spec.datatype, shape=list(spec.shape))
        for spec in model.outputs:
            response.outputs.add(name=spec.name, datatype=spec.datatype, shape=list(spec.shape))
        return self._answer(context, response)

    def _prepare(
        self, request: Any, context: grpc.aio.ServicerContext, span: Any, served: dict[str, str]
    ) -> tuple[Any, Any, list[str], float | None]:
        """Everything before the model runs: (model, decoded request, output names, timeout)."""
        if not self._repository.ready:
            raise NotReadyError("the server is still loading its models")
        model = self._get(request.model_name, request.model_version)
        served["model"] = model.name
        served["version"] = str(model.version)
        limit = int(getattr(model.config, "max_input_bytes", None) or DEFAULT_MAX_BODY_BYTES)
        size = request.ByteSize()
        if size > limit:
            raise PayloadTooLargeError(size, limit, model.name)
        decoded = decode_grpc_request(request, model.inputs)
        if decoded.id:
            span.set_attribute("inferway.request_id", decoded.id)
        output_names = [s.name for s in model.outputs]
        if decoded.outputs is not None:
            select_outputs({n: None for n in output_names}, decoded.outputs, output_names)
        timeouts = [t for t in (resolve_timeout_param(decoded.parameters),) if t is not None]
        remaining = context.time_remaining()
        if remaining is not None:
            timeouts.append(max(0.0, remaining))
        return model, decoded, output_names, min(timeouts) if timeouts else None

    @staticmethod
    def _respond(model: Any, decoded: Any, output_names: list[str], results: Any) -> Any:
        chosen = select_outputs(results, decoded.outputs, output_names)
        return encode_grpc_response(
            model_name=model.name,
            model_version=str(model.version),
            request_id=decoded.id,
            outputs=chosen,
            raw=decoded.binary_output,
        )

    async def _infer_once(
        self, request: Any, context: grpc.aio.ServicerContext, span: Any, served: dict[str, str]
    ) -> Any:
        model, decoded, output_names, timeout_s = self._prepare(request, context, span, served)
        results = await run_inference(model.executor, decoded.inputs, timeout_s=timeout_s)
        return self._respond(model, decoded, output_names, results)

    async def _handle(
        self,
        request: Any,
        context: grpc.aio.ServicerContext,
        parent: Any,
        request_id: str | None,
        protocol: str,
    ) -> tuple[Any, Failure | None]:
        """One request, traced and counted: (response, None) or (None, failure)."""
        started = time.perf_counter()
        served = {"model": UNKNOWN_MODEL, "version": ""}
        failure: Failure | None = None
        response = None
        with tracing.request_span(
            request.model_name,
            protocol="grpc",
            parent=parent,
            request_id=request_id,
            tracer=self._tracer,
        ) as span:
            try:
                response = await self._infer_once(request, context, span, served)
            except Exception as exc:
                failure = classify_error(exc)
            code = failure.grpc_code if failure is not None else grpc.StatusCode.OK
            tracing.set_span_outcome(
                span,
                code=code.name,
                version=served["version"],
                error=failure.message if failure is not None else None,
                fault=failure is not None and failure.http_status >= 500,
            )
        self._count(served, code, started, protocol)
        return response, failure

    def _count(
        self, served: dict[str, str], code: grpc.StatusCode, started: float, protocol: str
    ) -> None:
        self._metrics.observe_request(
            model=served["model"],
            version=served["version"],
            protocol=protocol,
            code=code.name,
            seconds=time.perf_counter() - started,
        )

    def _caller(self, context: grpc.aio.ServicerContext) -> tuple[Any, str | None]:
        """The caller's trace context (when tracing) and x-request-id, from the metadata."""
        metadata = context.invocation_metadata() or ()
        parent = tracing.extract_context(metadata) if tracing.is_tracing(self._tracer) else None
        request_id = next(
            (
                v
                for k, v in metadata
                if k.lower() == tracing.REQUEST_ID_HEADER and isinstance(v, str)
            ),
            None,
        )
        return parent, request_id

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        parent, request_id = self._caller(context)
        response, failure = await self._handle(request, context, parent, request_id, "grpc")
        if failure is not None:
            await self._fail(context, failure)
        return self._answer(context, response)

    async def ModelStreamInfer(
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """Every request read from the stream is queued at once (so they batch together);
        each answer is written as soon as it is ready. A failed request is answered with
        ``error_message`` and the stream goes on. Half-closing the stream finishes the
        requests already read, then ends the call; the ORCA report rides on its trailers.
        Without tracing a request costs no coroutine: its future's callback answers it."""
        parent, request_id = self._caller(context)
        answers: asyncio.Queue[Any] = asyncio.Queue()
        waiting: set[asyncio.Future[Any]] = set()
        tracing_on = tracing.is_tracing(self._tracer)

        def answer(request: Any, response: Any, failure: Failure | None) -> None:
            if failure is None:
                answers.put_nowait(pb2.ModelStreamInferResponse(infer_response=response))
                return
            failed = pb2.ModelInferResponse(
                model_name=request.model_name, model_version=request.model_version, id=request.id
            )
            answers.put_nowait(
                pb2.ModelStreamInferResponse(
                    error_message=_stream_error(failure), infer_response=failed
                )
            )

        async def traced(request: Any) -> None:
            response, failure = await self._handle(
                request, context, parent, request_id, STREAM_PROTOCOL
            )
            answer(request, response, failure)

        def start(request: Any) -> None:
            started = time.perf_counter()
            served = {"model": UNKNOWN_MODEL, "version": ""}

            def finish(response: Any, failure: Failure | None) -> None:
                code = grpc.StatusCode.OK if failure is None else failure.grpc_code
                self._count(served, code, started, STREAM_PROTOCOL)
                answer(request, response, failure)

            try:
                model, decoded, names, timeout_s = self._prepare(
                    request, context, INVALID_SPAN, served
                )
                if timeout_s is not None and timeout_s <= 0:
                    raise DeadlineExceededError("the stream's deadline has passed")
                fut = model.executor.submit(
                    decoded.inputs, timeout=timeout_s, span_context=INVALID_SPAN_CONTEXT
                )
            except Exception as exc:
                finish(None, classify_error(exc))
                return

            def done(fut: asyncio.Future[Any]) -> None:
                waiting.discard(fut)
                if fut.cancelled():
                    return
                try:
                    response = self._respond(model, decoded, names, fut.result())
                except Exception as exc:
                    finish(None, classify_error(exc))
                else:
                    finish(response, None)

            waiting.add(fut)
            fut.add_done_callback(done)

        async def read() -> None:
            tasks: set[asyncio.Task[None]] = set()
            try:
                async for request in request_iterator:
                    if tracing_on:
                        task = asyncio.create_task(traced(request))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    else:
                        start(request)
                while tasks or waiting:
                    await asyncio.wait([*tasks, *waiting])
            finally:
                for pending in (*tasks, *waiting):
                    pending.cancel()  # a queued request of a broken stream is not computed
                answers.put_nowait(_END_OF_STREAM)

        reader = asyncio.create_task(read())
        try:
            while (item := await answers.get()) is not _END_OF_STREAM:
                yield item
            await reader  # re-raises a broken read (the client went away mid-stream)
            context.set_trailing_metadata(self._load_metadata())
        finally:
            reader.cancel()


STREAM_PROTOCOL = "grpc_stream"
"""The ``protocol`` label of requests that came over ModelStreamInfer."""
_END_OF_STREAM = object()


def _stream_error(failure: Failure) -> str:
    message = f"{failure.grpc_code.name}: {failure.message}"
    if failure.retry_after_s is not None:
        message += f" (retry after {max(1, round(failure.retry_after_s * 1000))} ms)"
    return message


async def start_grpc_server(
    repository: Any,
    *,
    metrics: BackendMetrics,
    host: str = "127.0.0.1",
    port: int = 0,
    max_message_bytes: int = DEFAULT_MAX_BODY_BYTES,
    tracer_provider: Any = None,
    credentials: grpc.ServerCredentials | None = None,
    reuse_port: bool = False,
) -> tuple[grpc.aio.Server, int]:
    """Start serving; returns the server and the port it bound. Request spans go to
    ``tracer_provider`` (the global one when None)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # gRPC sets SO_REUSEPORT unless told not to: a second server on a busy port
            # would silently share it. Only the workers of one `serve --workers` may.
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ]
    )
    pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        InferenceServicer(repository, metrics, tracer_provider), server
    )
    address = f"{host}:{port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:  # TLS, client certificates as the credentials say
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:  # grpcio raises where it used to return 0
        bound = 0
        reason = f": {exc}"
    else:
        reason = ""
    if bound == 0:
        raise OSError(f"gRPC server could not bind {host}:{port} (in use?){reason}")
    await server.start()
    return server, bound
