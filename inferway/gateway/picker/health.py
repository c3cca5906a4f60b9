"""The gRPC Health Checking Protocol (``grpc.health.v1.Health/Check``) for the picker, as the
Endpoint Picker protocol asks: ``liveness`` (the process answers), ``readiness`` and
``envoy.service.ext_proc.v3.ExternalProcessor`` (it has a pool to pick from), and ``""``.

The two messages have one field each, so they are encoded here by hand (protobuf wire format:
field 1, a string in the request, an enum in the answer) rather than adding a dependency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

__all__ = ["HEALTH_METHOD", "NOT_SERVING", "SERVING", "add_health_service", "decode_service"]

HEALTH_METHOD = "/grpc.health.v1.Health/Check"
SERVING, NOT_SERVING = 1, 2
_READY_NAMES = ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "")


def decode_service(request: bytes) -> str:
    """``HealthCheckRequest.service`` (field 1, length-delimited); "" when absent."""
    index = 0
    while index < len(request):
        key = request[index]
        index += 1
        length, shift = 0, 0
        while True:  # a varint: the value (wire type 0) or the length (wire type 2)
            byte = request[index]
            index += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if key & 7 == 0:
            continue
        if key & 7 != 2:
            raise ValueError(f"health check request: wire type {key & 7} is not expected")
        if key >> 3 == 1:
            return request[index : index + length].decode("utf-8")
        index += length
    return ""


def _status(value: int) -> bytes:
    return bytes((0x08, value))  # field 1, varint


def add_health_service(server: grpc.aio.Server, ready: Callable[[], bool]) -> None:
    async def check(request: bytes, context: Any) -> bytes:
        try:
            service = decode_service(request)
        except (ValueError, IndexError, UnicodeDecodeError) as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        if service == "liveness":
            return _status(SERVING)
        if service in _READY_NAMES:
            return _status(SERVING if ready() else NOT_SERVING)
        await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {service!r}")
        raise AssertionError("abort raises")

    handler = grpc.unary_unary_rpc_method_handler(
        check, request_deserializer=lambda b: b, response_serializer=lambda b: b
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": handler}),)
    )
