"""A hung replica (SIGSTOPped: it accepts connections and never answers) costs a request one
per-try timeout, not the client's patience: routes have a default retry with a per-try timeout
(half the route timeout) that hedges to a healthy replica. Real Envoy, replicas as real
processes on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from tests.traffic_harness import TrafficGateway, poll_until

pytestmark = pytest.mark.integration

REPLICA = """
import asyncio, sys
from aiohttp import web

async def main():
    name = sys.argv[1]

    async def answer(request):
        return web.json_response({"backend": name})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""

POLICY = """\
version: 1
listeners:
  - name: edge
    port: {listener_port}
services:
  - name: model
    endpoints: ["127.0.0.1:{a}", "127.0.0.1:{b}"]
routes:
  - name: models
    timeout: 2s
    backends:
      - service: model
"""


class ProcessReplica:
    """A replica in its own process, so it can be stopped (SIGSTOP) like a hung server."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> ProcessReplica:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", REPLICA, self.name, stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 20)
        self.port = int(line)
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()  # SIGKILL also ends a stopped process
            await self.proc.wait()


async def test_requests_to_a_hung_replica_succeed_via_the_healthy_one() -> None:
    hung, healthy = ProcessReplica("a"), ProcessReplica("b")
    for replica in (hung, healthy):
        await replica.start()
    async with TrafficGateway(POLICY, [hung, healthy]) as gw:  # type: ignore[list-item]

        async def both_answer() -> bool:
            seen = {r.backend for r in await gw.send(20, concurrency=4)}
            return seen == {"a", "b"}

        await poll_until(both_answer, timeout=15, what="both replicas to take traffic")
        hung.signal(signal.SIGSTOP)
        try:
            results = await gw.load(duration=3.0, rate=40.0, concurrency=8)
        finally:
            hung.signal(signal.SIGCONT)
        assert len(results) >= 60
        failed = [r for r in results if r.status != 200]
        assert not failed, f"{len(failed)} of {len(results)} failed: {failed[:3]}"
        assert {r.backend for r in results} == {"b"}
        # Some requests did reach the hung replica, and were answered by a second try.
        retried = await gw.stats(r"^cluster\.model\.upstream_rq_retry$")
        assert retried.get("cluster.model.upstream_rq_retry", 0) >= 1, retried
