"""The gRPC clients of ``loadgen.py``: unary ModelInfer and ModelStreamInfer, each spread
over several channels (TCP connections)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from loadgen_spec import REQUEST_TIMEOUT_S, LoadSpec, Send

__all__ = ["grpc_client", "grpc_stream_client"]

GRPC_CHANNELS = 4


async def grpc_client(
    spec: LoadSpec, row: np.ndarray
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import grpc

    from inferway.backends.protocol import pb2, pb2_grpc

    request = pb2.ModelInferRequest(model_name=spec.model)
    request.inputs.add(name="x", datatype="FP32", shape=list(row.shape))
    request.raw_input_contents.append(row.tobytes())
    # Separate TCP connections: one HTTP/2 connection would serialize on one socket.
    channels = [
        grpc.aio.insecure_channel(
            f"{spec.host}:{spec.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(GRPC_CHANNELS)
    ]
    stubs = [pb2_grpc.GRPCInferenceServiceStub(c) for c in channels]
    counter = [0]

    async def send() -> bool:
        counter[0] += 1
        stub = stubs[counter[0] % len(stubs)]
        await stub.ModelInfer(request, timeout=REQUEST_TIMEOUT_S)
        return True

    async def close() -> None:
        await asyncio.gather(*(c.close() for c in channels))

    return send, close


async def grpc_stream_client(
    spec: LoadSpec, row: np.ndarray
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    """ModelStreamInfer: one long-lived stream per channel; each request is one message with
    its own id, and a reader per stream resolves the sender's future by that id."""
    import grpc

    from inferway.backends.protocol import pb2

    template = pb2.ModelInferRequest(model_name=spec.model)
    template.inputs.add(name="x", datatype="FP32", shape=list(row.shape))
    template.raw_input_contents.append(row.tobytes())
    base = template.SerializeToString()
    waiting: dict[str, asyncio.Future[bool]] = {}
    channels, calls, outboxes, tasks = [], [], [], []

    def with_id(rid: str) -> bytes:
        # Protobuf merges concatenated messages: appending field 3 (id) sets the id.
        raw = rid.encode()
        assert len(raw) < 128  # a one-byte length
        return base + b"\x1a" + bytes([len(raw)]) + raw

    async def read(call: Any) -> None:
        async for answer in call:
            fut = waiting.pop(answer.infer_response.id, None)
            if fut is not None and not fut.done():
                fut.set_result(answer.error_message == "")

    async def write(call: Any, outbox: asyncio.Queue[bytes]) -> None:
        while True:
            await call.write(await outbox.get())

    for _ in range(GRPC_CHANNELS):
        channel = grpc.aio.insecure_channel(
            f"{spec.host}:{spec.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        method = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda b: b,
            response_deserializer=pb2.ModelStreamInferResponse.FromString,
        )
        call = method()
        outbox: asyncio.Queue[bytes] = asyncio.Queue()
        channels.append(channel)
        calls.append(call)
        outboxes.append(outbox)
        tasks += [asyncio.create_task(read(call)), asyncio.create_task(write(call, outbox))]
    counter = itertools.count()
    loop = asyncio.get_running_loop()

    async def send() -> bool:
        n = next(counter)
        rid = str(n)
        fut = loop.create_future()
        waiting[rid] = fut
        outboxes[n % len(outboxes)].put_nowait(with_id(rid))
        try:
            return await asyncio.wait_for(fut, REQUEST_TIMEOUT_S)
        finally:
            waiting.pop(rid, None)

    async def close() -> None:
        for task in tasks:
            task.cancel()
        for call in calls:
            call.cancel()
        await asyncio.gather(*(c.close() for c in channels))

    return send, close
