"""Open Inference Protocol (KServe v2) over gRPC: ``inference.GRPCInferenceService``.

Every answer carries the ORCA load report in its trailing metadata (Envoy's router reads a
report from the response headers or, failing that, the trailers: sending it once, at the end,
saves a metadata frame per call and reports the load after the work); failures map to
gRPC status codes (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED,
UNAVAILABLE, INTERNAL) with a message saying what was wrong. The client's deadline bounds
the request's time in the batching queue. ``ModelStreamInfer`` (Triton's streaming
extension) carries many requests per call, which costs a fraction of a unary call's CPU.
Triton's model configuration, statistics and repository RPCs answer from the same core as
the HTTP routes, so tritonclient and perf_analyzer see one server on either wire.
The request lifecycle itself is the serving core's; this module adapts the wire.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import json_format
from opentelemetry.context import Context

from inferway.backends.batching.client_gone import client_gone_check
from inferway.backends.models.served_model import ModelNotFoundError
from inferway.backends.protocol import pb2, pb2_grpc
from inferway.backends.protocol.grpc_codec import decode_grpc_request, encode_grpc_response
from inferway.backends.protocol.server_info import EXTENSIONS, SERVER_NAME, SERVER_VERSION
from inferway.backends.protocol.triton_config import model_config_json
from inferway.backends.serving.core import Chosen, ServingCore, Transport
from inferway.backends.serving.failures import Failure, classify_error
from inferway.backends.serving.request import DecodedRequest
from inferway.backends.telemetry import orca, tracing

if TYPE_CHECKING:
    from inferway.backends.models.served_model import ServedModel

__all__ = [
    "GRPC",
    "GRPC_STREAM",
    "RETRY_PUSHBACK_KEY",
    "STREAM_PROTOCOL",
    "InferenceServicer",
    "start_grpc_server",
]

log = logging.getLogger("inferway.backends.grpc")

RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
"""gRPC's standard server pushback: how long the client should wait before retrying."""
STREAM_PROTOCOL = "grpc_stream"
"""The ``protocol`` label of requests that came over ModelStreamInfer."""
GRPC = Transport(protocol="grpc", wire="grpc")
GRPC_STREAM = Transport(protocol=STREAM_PROTOCOL, wire="grpc", call_request_ids=False)
_END_OF_STREAM = object()


class _GrpcCall:
    """One ModelInferRequest as the serving core sees it (see InferCall)."""

    __slots__ = ("context", "model_name", "model_version", "request")
    needs_read = False  # gRPC hands over the whole message

    def __init__(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.request = request
        self.context = context
        self.model_name: str = request.model_name
        self.model_version: str | None = request.model_version or None

    def body_size(self) -> int | None:
        return int(self.request.ByteSize())

    async def read_body(self, limit: int, model: str) -> None:
        return None

    def decode(self, model: ServedModel) -> DecodedRequest:
        return decode_grpc_request(self.request, model.inputs)

    def transport_timeout_s(self) -> float | None:
        remaining = self.context.time_remaining()
        return None if remaining is None else max(0.0, remaining)

    def encode(self, model: ServedModel, decoded: DecodedRequest, outputs: Chosen) -> Any:
        return encode_grpc_response(
            model_name=model.name,
            model_version=str(model.version),
            request_id=decoded.id,
            outputs=outputs,
            raw=decoded.binary_output,
        )


def _pushback_ms(failure: Failure) -> int:
    assert failure.retry_after_s is not None
    return max(1, round(failure.retry_after_s * 1000))


def _stream_error(failure: Failure) -> str:
    message = f"{failure.grpc_code.name}: {failure.message}"
    if failure.retry_after_s is not None:
        message += f" (retry after {_pushback_ms(failure)} ms)"
    return message


class InferenceServicer(pb2_grpc.GRPCInferenceServiceServicer):
    """The service in front of one ServingCore."""

    def __init__(self, core: ServingCore) -> None:
        self._core = core

    def _load_metadata(self) -> tuple[tuple[str, str], ...]:
        report = self._core.load_report()
        return () if report is None else ((orca.ORCA_HEADER, report),)

    def _answer(self, context: grpc.aio.ServicerContext, response: Any) -> Any:
        context.set_trailing_metadata(self._load_metadata())
        return response

    async def _fail(self, context: grpc.aio.ServicerContext, failure: Failure) -> None:
        md = list(self._load_metadata())
        if failure.retry_after_s is not None:
            md.append((RETRY_PUSHBACK_KEY, str(_pushback_ms(failure))))
        await context.abort(failure.grpc_code, failure.message, trailing_metadata=tuple(md))

    def _caller(self, context: grpc.aio.ServicerContext) -> tuple[Context | None, str | None]:
        """The caller's trace context (when tracing) and x-request-id, from the metadata."""
        metadata = context.invocation_metadata() or ()
        parent = (
            tracing.extract_context(metadata) if tracing.is_tracing(self._core.tracer) else None
        )
        request_id = next(
            (
                v
                for k, v in metadata
                if k.lower() == tracing.REQUEST_ID_HEADER and isinstance(v, str)
            ),
            None,
        )
        return parent, request_id

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self._answer(context, pb2.ServerLiveResponse(live=True))

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self._answer(context, pb2.ServerReadyResponse(ready=self._core.ready))

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = pb2.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=list(EXTENSIONS)
        )
        return self._answer(context, response)

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            self._core.model(request.name, request.version)
        except ModelNotFoundError as exc:
            await self._fail(context, classify_error(exc))
        return self._answer(context, pb2.ModelReadyResponse(ready=True))

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            model = self._core.model(request.name, request.version)
        except ModelNotFoundError as exc:
            await self._fail(context, classify_error(exc))
        response = pb2.ModelMetadataResponse(
            name=model.name, versions=self._core.versions(model.name), platform=model.platform
        )
        for spec in model.inputs:
            response.inputs.add(name=spec.name, datatype=spec.datatype, shape=list(spec.shape))
        for spec in model.outputs:
            response.outputs.add(name=spec.name, datatype=spec.datatype, shape=list(spec.shape))
        return self._answer(context, response)

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            config = model_config_json(self._core.model(request.name, request.version))
        except ModelNotFoundError as exc:
            await self._fail(context, classify_error(exc))
        response = pb2.ModelConfigResponse()
        json_format.ParseDict(config, response.config)
        return self._answer(context, response)

    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            stats = self._core.statistics(request.name, request.version)
        except Exception as exc:
            await self._fail(context, classify_error(exc))
        response = json_format.ParseDict({"model_stats": stats}, pb2.ModelStatisticsResponse())
        return self._answer(context, response)

    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            entries = self._core.index(request.repository_name, request.ready)
        except Exception as exc:
            await self._fail(context, classify_error(exc))
        response = pb2.RepositoryIndexResponse()
        for entry in entries:
            response.models.add(**entry)
        return self._answer(context, response)

    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            await self._core.load(
                request.repository_name, request.model_name, list(request.parameters)
            )
        except Exception as exc:
            await self._fail(context, classify_error(exc))
        return self._answer(context, pb2.RepositoryModelLoadResponse())

    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            await self._core.unload(
                request.repository_name, request.model_name, list(request.parameters)
            )
        except Exception as exc:
            await self._fail(context, classify_error(exc))
        return self._answer(context, pb2.RepositoryModelUnloadResponse())

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        parent, request_id = self._caller(context)
        client_gone_check.set(context.cancelled)  # this call's task only (client_gone.py)
        response, failure = await self._core.infer(
            _GrpcCall(request, context), GRPC, parent=parent, request_id=request_id
        )
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
        client_gone_check.set(context.cancelled)  # this call's tasks only (client_gone.py)
        core = self._core
        answers: asyncio.Queue[Any] = asyncio.Queue()
        waiting: set[asyncio.Future[Any]] = set()
        tracing_on = tracing.is_tracing(core.tracer)

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
            response, failure = await core.infer(
                _GrpcCall(request, context), GRPC_STREAM, parent=parent, request_id=request_id
            )
            answer(request, response, failure)

        def start(request: Any) -> None:
            def finish(response: Any, failure: Failure | None) -> None:
                answer(request, response, failure)

            fut = core.submit(_GrpcCall(request, context), GRPC_STREAM, finish, request_id)
            if fut is not None:
                waiting.add(fut)
                fut.add_done_callback(waiting.discard)

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


async def start_grpc_server(
    core: ServingCore,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    credentials: grpc.ServerCredentials | None = None,
    reuse_port: bool = False,
) -> tuple[grpc.aio.Server, int]:
    """Start serving ``core``; returns the server and the port it bound."""
    message_bytes = core.settings.grpc_max_message_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", message_bytes),
            ("grpc.max_send_message_length", message_bytes),
            # gRPC sets SO_REUSEPORT unless told not to: a second server on a busy port
            # would silently share it. Only the workers of one `serve --workers` may.
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ]
    )
    pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(core), server)
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
