"""The HTTP/1.1 client of ``loadgen.py``: KServe v2 JSON and binary-extension requests over a
hand-rolled keep-alive pool, so the load generator takes as little CPU from the server as it
can."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from loadgen_spec import PROTOCOLS, REQUEST_TIMEOUT_S, LoadSpec, Send

__all__ = ["http_client", "http_request_bytes"]

HTTP_POOL = 256


def http_request_bytes(spec: LoadSpec, row: np.ndarray) -> bytes:
    """One whole HTTP/1.1 request, encoded once and sent as is every time."""
    tensor: dict[str, Any] = {"name": "x", "datatype": "FP32", "shape": list(row.shape)}
    if spec.protocol == "http-json":
        tensor["data"] = row.reshape(-1).tolist()
        body = json.dumps({"inputs": [tensor]}).encode()
        extra = "Content-Type: application/json\r\n"
    elif spec.protocol == "http-binary":
        raw = row.tobytes()
        tensor["parameters"] = {"binary_data_size": len(raw)}
        head = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}})
        body = head.encode() + raw
        extra = (
            "Content-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(head.encode())}\r\n"
        )
    else:
        raise ValueError(f"unknown protocol {spec.protocol!r}; choose from {PROTOCOLS}")
    path = spec.path or f"/v2/models/{spec.model}/infer"
    if not spec.keepalive:
        extra += "Connection: close\r\n"
    start = (
        f"POST {path} HTTP/1.1\r\nHost: {spec.host}:{spec.http_port}\r\n"
        f"{extra}Content-Length: {len(body)}\r\n\r\n"
    )
    return start.encode() + body


class _HttpConnection(asyncio.Protocol):
    """One keep-alive connection that carries one request at a time. A hand-rolled client:
    it parses only the status line and Content-Length, so the load generator costs a few tens
    of microseconds of CPU per request instead of aiohttp's few hundred, which on 2 shared
    cores would otherwise be taken from the server under test."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[int] | None = None
        self.broken: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buf[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            self._finish(None, ValueError("response without Content-Length"))
            return
        line_end = head.find(b"\r\n", at + 2)
        length = int(head[at + 17 : line_end if line_end >= 0 else None])
        if len(buf) < end + 4 + length:
            return
        status = int(buf[9:12])
        del buf[: end + 4 + length]
        self._finish(status, None)

    def _finish(self, status: int | None, exc: BaseException | None) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            return
        if exc is not None:
            self.broken = exc
            waiter.set_exception(exc)
        else:
            waiter.set_result(status)  # type: ignore[arg-type]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.broken = exc or ConnectionResetError("server closed the connection")
        self._finish(None, self.broken)

    def request(self, payload: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self._waiter


async def http_client(
    spec: LoadSpec, row: np.ndarray
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    payload = http_request_bytes(spec, row)
    loop = asyncio.get_running_loop()
    idle: list[_HttpConnection] = []
    opened: list[_HttpConnection] = []

    async def send() -> bool:
        conn = idle.pop() if idle else None
        if conn is None:
            _, conn = await loop.create_connection(_HttpConnection, spec.host, spec.http_port)
            if spec.keepalive:  # else closed after its one answer, nothing to keep
                opened.append(conn)
        try:
            status = await asyncio.wait_for(conn.request(payload), REQUEST_TIMEOUT_S)
        except BaseException:
            if conn.transport is not None:
                conn.transport.close()  # its answer may still come: never reuse it
            raise
        if spec.keepalive and conn.broken is None and len(idle) < HTTP_POOL:
            idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()
        return status == 200

    async def close() -> None:
        for conn in opened:
            if conn.transport is not None:
                conn.transport.close()

    return send, close
