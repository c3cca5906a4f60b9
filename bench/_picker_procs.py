"""The processes of ``picker_overhead.py``, each in its own process so none shares an event
loop (or a GIL) with another: the fast OpenAI-style upstreams, the gateway (control plane,
its pickers and the Envoy it supervises) and the open-loop load generator."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

__all__ = ["STORM_ENDPOINT", "backends_main", "chat_payloads", "gateway_main", "load_main"]

_ANSWER = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "chat.completion",
        "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 512, "completion_tokens": 1, "total_tokens": 513},
    }
).encode()
_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(_ANSWER)).encode()
    + b"\r\n\r\n"
    + _ANSWER
)


def backends_main(count: int, conn: Connection) -> None:
    """``count`` upstreams in one uvloop process, each answering a chat completion at once."""
    import httptools
    import uvloop

    class Answer(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                if self.transport is not None:
                    self.transport.close()

        def on_message_complete(self) -> None:
            if self.transport is not None:
                self.transport.write(_RESPONSE)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        servers = [
            await loop.create_server(Answer, "127.0.0.1", 0, backlog=4096) for _ in range(count)
        ]
        conn.send([s.sockets[0].getsockname()[1] for s in servers])
        await loop.run_in_executor(None, conn.recv)  # until told to stop

    uvloop.run(serve())


STORM_ENDPOINT = "127.0.0.2:9"
"""The policy's idle service's endpoint, which a reload storm moves back and forth."""


async def _storm(gw: Any, path: Path, policy: str, rate: float, applied: list[str]) -> None:
    """Policy edits applied ``rate`` times a second (a busy control plane): each resolves,
    translates and pushes a new snapshot, and the keeper follows it. ``applied`` gets the
    control plane's version after each edit."""
    moved = policy.replace(STORM_ENDPOINT, "127.0.0.3:9")
    flip = False
    while True:
        flip = not flip
        path.write_text(moved if flip else policy, encoding="utf-8")
        result = gw.watcher.reload()
        if result is not None and result.refusal is not None:
            raise RuntimeError(f"picker bench: a storm edit was refused: {result.refusal}")
        applied.append(str(gw.control_plane.version))
        await asyncio.sleep(1 / rate)


def gateway_main(policy: str, envoy_admin_port: int, conn: Connection) -> None:
    """The gateway as ``inferway run`` runs it (its Envoy supervised, one worker), from
    ``policy``; answers ``pids``, ``sidecars``, ``storm RATE`` (0: calm again; either way the
    edits the last storm applied and the distinct versions they made) and ``stop``."""
    import logging

    import uvloop

    from inferway.gateway.runtime import GatewayOptions, start_gateway

    logging.basicConfig(level=logging.WARNING)

    async def run() -> None:
        with tempfile.TemporaryDirectory(prefix="picker-bench-") as workdir:
            path = Path(workdir) / "policy.yaml"
            path.write_text(policy, encoding="utf-8")
            gw = await start_gateway(
                GatewayOptions(
                    policy_path=path,
                    xds_port=0,
                    admin_port=0,
                    envoy_admin_port=envoy_admin_port,
                    workdir=Path(workdir),
                    envoy_concurrency=1,
                )
            )
            try:
                assert gw.supervisor is not None
                if not await gw.supervisor.wait_ready(30):
                    raise RuntimeError("picker bench: Envoy not ready within 30 s")
                assert gw.pickers is not None
                for sidecar in gw.pickers.sidecars.values():
                    if not await sidecar.wait_serving(30):
                        raise RuntimeError(f"picker bench: sidecar {sidecar.port} not serving")
                loop = asyncio.get_running_loop()
                conn.send("ready")
                storm: asyncio.Task[None] | None = None
                applied: list[str] = []
                while (command := await loop.run_in_executor(None, conn.recv)) != "stop":
                    sidecars = {port: s.status() for (_, port), s in gw.pickers.sidecars.items()}
                    if command.startswith("storm "):
                        if storm is not None:
                            storm.cancel()
                            await asyncio.gather(storm, return_exceptions=True)
                            storm = None
                        conn.send({"edits": len(applied), "versions": len(set(applied))})
                        applied.clear()
                        if (rate := float(command.split()[1])) > 0:
                            storm = loop.create_task(_storm(gw, path, policy, rate, applied))
                    elif command == "pids":
                        conn.send(
                            {"gateway": os.getpid(), "envoy": gw.supervisor.pid, **{
                                f"sidecar:{p}": s["pid"] for p, s in sidecars.items()
                            }}
                        )  # fmt: skip
                    else:
                        conn.send(sidecars)
            finally:
                await gw.stop()

    uvloop.run(run())


def chat_payloads(port: int, path: str, tenants: int, prefix_chars: int) -> list[bytes]:
    """One whole HTTP/1.1 chat request per tenant: a long system prompt of its own (a shared
    prefix, so the prefix scorer works as in production) and a short question."""
    payloads = []
    for tenant in range(tenants):
        system = (f"You are the assistant of tenant {tenant}. " * 200)[:prefix_chars]
        body = json.dumps(
            {
                "model": "bench",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question for tenant {tenant}?"},
                ],
                "max_tokens": 1,
            }
        ).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        payloads.append(head.encode() + body)
    return payloads


def load_main(conn: Connection) -> None:
    """Open-loop Poisson arrivals (loadgen_loops.run_open_loop, latency from the scheduled
    send time) over keep-alive connections (loadgen_http's client), one point per message:
    ``(payloads, port, rate, duration_s, warmup_s, seed)``; None stops it."""
    import uvloop
    from loadgen_http import _HttpConnection
    from loadgen_loops import run_open_loop
    from loadgen_spec import REQUEST_TIMEOUT_S

    async def point(
        payloads: list[bytes], port: int, rate: float, duration: float, warmup: float, seed: int
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        idle: list[_HttpConnection] = []
        opened: list[_HttpConnection] = []
        statuses: dict[int, int] = {}
        count = 0

        async def send() -> bool:
            nonlocal count
            payload = payloads[count % len(payloads)]
            count += 1
            conn = idle.pop() if idle else None
            if conn is None:
                _, conn = await loop.create_connection(_HttpConnection, "127.0.0.1", port)
                opened.append(conn)
            try:
                status = await asyncio.wait_for(conn.request(payload), REQUEST_TIMEOUT_S)
            except BaseException:
                if conn.transport is not None:
                    conn.transport.close()
                raise
            statuses[status] = statuses.get(status, 0) + 1
            if conn.broken is None:
                idle.append(conn)
            return status == 200

        try:
            if warmup > 0:
                await run_open_loop(send, rate, warmup, seed + 1)
                statuses.clear()
            result = await run_open_loop(send, rate, duration, seed)
        finally:
            for opened_conn in opened:
                if opened_conn.transport is not None:
                    opened_conn.transport.close()
        result["statuses"] = {str(k): v for k, v in sorted(statuses.items())}
        return result

    while (spec := conn.recv()) is not None:
        conn.send(uvloop.run(point(*spec)))
