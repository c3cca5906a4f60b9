"""The HTTP lane that ``picker_transport.py`` measures against the ext_proc gRPC stream: the
same pick (inferway's Picker, the same pool settings and prompt parsing) answered to Envoy's
``ext_authz`` HTTP service, one plain HTTP/1.1 request per pick over keep-alive connections.

It is a measuring prototype, not a serving path: Envoy's ext_authz sends no end-of-request
signal, so the pick is counted as finished as soon as it is answered (the queue scorer then
sees only the scrapes). Run as ``python bench/_picker_http_lane.py PORT ENDPOINT...``: prints
``ready``, serves until stdin closes, then prints the picks per endpoint as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys

import httptools
import uvloop

from inferway.gateway.picker.core.picker import Picker
from inferway.gateway.picker.pools import picker_config
from inferway.gateway.picker.server import _parse
from inferway.policies.picker import Picker as PickerPolicy

__all__ = ["main"]

HEADER = b"x-gateway-destination-endpoint"


def _protocol(picker: Picker) -> type[asyncio.Protocol]:
    class Lane(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                if self.transport is not None:
                    self.transport.close()

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            text, model = _parse(b"".join(self.body))
            self.body = []
            pick = picker.pick(picker.blocks(text), lora=model)
            picker.finish(pick.ticket)
            if self.transport is None:
                return
            if pick.status != 200:
                self.transport.write(
                    b"HTTP/1.1 %d Picked\r\ncontent-length: 0\r\n\r\n" % pick.status
                )
                return
            value = ",".join(pick.endpoints).encode()
            self.transport.write(
                b"HTTP/1.1 200 OK\r\n" + HEADER + b": " + value + b"\r\ncontent-length: 0\r\n\r\n"
            )

    return Lane


async def _serve(port: int, endpoints: list[str]) -> None:
    picker = Picker(picker_config(PickerPolicy.model_validate({"metrics_path": None})))
    picker.set_endpoints(endpoints)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_protocol(picker), "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()
    print(json.dumps({e: int(s["picks"] or 0) for e, s in picker.stats().items()}), flush=True)


def main() -> int:
    uvloop.run(_serve(int(sys.argv[1]), sys.argv[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
