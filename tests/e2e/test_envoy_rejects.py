"""A config Envoy rejects never becomes live (issue 11, bug 1), with a real Envoy.

Validation refuses a bad regex up front now, so the rejected config is made by a translate
function injected into the ControlPlane: while ``rejecting`` is on, every route also matches a
header against the regex ``tr(ue``, which Envoy NACKs ("missing )"). The control plane must
record the refusal, go back to the last ACKed snapshot for the connected Envoy and for one that
connects afresh (kill -9 and restart), report itself degraded, keep traffic flowing, and apply
the next good edit normally.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway.gateway.admin import build_admin_app, build_status, start_admin_server
from inferway.gateway.control_plane import DEGRADED_REJECTED
from inferway.resolve import IR
from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.translate import translate
from tests.e2e.conftest import (
    CONCURRENCY,
    NODE_ID,
    ControlPlaneHarness,
    Gateway,
    poll_until,
    render_policy,
    start_envoy,
    write_atomically,
)
from tests.envoy_process import free_port

pytestmark = pytest.mark.integration


class RejectableTranslate:
    """translate, plus (while ``rejecting``) a header regex Envoy refuses."""

    def __init__(self) -> None:
        self.rejecting = False

    def __call__(self, resolved: IR) -> Resources:
        resources = translate(resolved)
        if not self.rejecting:
            return resources
        items = {t: list(resources.of_type(t).items()) for t in resources.type_urls()}
        routes = []
        for name, config in items[type_urls.ROUTE]:
            bad = route_pb2.RouteConfiguration()
            bad.CopyFrom(config)
            for host in bad.virtual_hosts:
                for route in host.routes:
                    matcher = route.match.headers.add(name="x-flag")
                    matcher.string_match.safe_regex.regex = "tr(ue"
            routes.append((name, bad))
        items[type_urls.ROUTE] = routes
        return Resources.build(items)


@pytest.fixture
async def rejecting_gateway(
    tmp_path: Path, backend_ports: dict[str, int]
) -> AsyncIterator[tuple[Gateway, RejectableTranslate]]:
    path = tmp_path / "policy.yaml"
    listener_port = free_port()
    path.write_text(
        render_policy(
            listener_port=listener_port,
            backend_ports=backend_ports,
            weights={"v1": 100.0, "v2": 0.0},
        )
    )
    translate = RejectableTranslate()
    harness = ControlPlaneHarness(path, listener_port, translate=translate)
    await harness.start()
    envoy = await start_envoy(harness.port)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10))
    gateway = Gateway(harness, envoy, listener_port, backend_ports, session)
    try:
        assert await harness.cache.wait_for_acks(harness.version, node_ids=[NODE_ID], timeout=10)
        yield gateway, translate
    finally:
        await session.close()
        gateway.envoy.stop()
        await harness.stop()


async def test_a_snapshot_envoy_rejects_is_refused_and_the_last_good_one_keeps_serving(
    rejecting_gateway: tuple[Gateway, RejectableTranslate],
) -> None:
    gateway, translate = rejecting_gateway
    cp, cache = gateway.cp.control_plane, gateway.cp.cache
    good = gateway.cp.version
    assert (await gateway.send(100)) == {"v1": 100}

    # An edit Envoy rejects: refused, the cache and the control plane go back to the good one.
    translate.rejecting = True
    write_atomically(gateway.cp.policy_path, gateway.policy_text({"v1": 0.0, "v2": 100.0}))
    await poll_until(lambda: cache.rejections(), timeout=10, what="Envoy to reject the edit")
    (rejection,) = cache.rejections()
    assert rejection.restored == good and rejection.nack.type_url == type_urls.ROUTE
    assert rejection.nack.resource_names == ("edge",)
    assert "missing )" in rejection.message, rejection.message
    served = cache.get_snapshot()
    assert served is not None and served.version == good
    assert cp.version == good
    refusal = cp.last_refused
    assert refusal is not None and refusal.file == str(gateway.cp.policy_path)
    assert refusal.rejected_by_envoy == rejection and cp.refusal_pending
    assert cp.degraded is not None and cp.degraded.startswith(DEGRADED_REJECTED)
    assert "missing )" in cp.degraded
    status = build_status(cp)
    assert status["health"]["status"] == DEGRADED_REJECTED and not status["health"]["ok"]
    assert status["last_refused"]["rejected_by_envoy"]["resource_names"] == ["edge"]
    admin = await start_admin_server(build_admin_app(cp), host="127.0.0.1", port=0)
    try:
        async with httpx.AsyncClient() as client:
            health = (await client.get(f"{admin.url}/healthz")).json()
    finally:
        await admin.stop()
    assert health["status"] == DEGRADED_REJECTED and "missing )" in health["reason"]
    assert health["policy_version"] == good
    assert await cache.wait_for_acks(good, node_ids=[NODE_ID], timeout=10)
    assert (await gateway.send(100)) == {"v1": 100}  # traffic keeps flowing, old weights

    # A further edit Envoy rejects is refused again, not "applied".
    write_atomically(gateway.cp.policy_path, gateway.policy_text({"v1": 50.0, "v2": 50.0}))
    await poll_until(lambda: len(cache.rejections()) == 2, timeout=10, what="a second rejection")
    served = cache.get_snapshot()
    assert cp.version == good and served is not None and served.version == good

    # kill -9 Envoy; the restarted one is sent the last good snapshot, not a rejected one.
    assert gateway.envoy.process is not None
    gateway.envoy.process.send_signal(signal.SIGKILL)
    gateway.envoy.process.wait(timeout=10)
    gateway.envoy.stop()
    gateway.envoy = await start_envoy(gateway.cp.port)
    assert await cache.wait_for_acks(good, node_ids=[NODE_ID], timeout=15)
    await poll_until(
        lambda: gateway.envoy_route_version(), timeout=10, what="the restarted Envoy's routes"
    )
    assert await gateway.envoy_route_version() == good_route_version(gateway)
    assert (await gateway.send(100)) == {"v1": 100}
    assert len(cache.rejections()) == 2  # the restarted Envoy rejected nothing

    # The next good edit applies normally and clears the degraded state.
    translate.rejecting = False
    write_atomically(gateway.cp.policy_path, gateway.policy_text({"v1": 0.0, "v2": 100.0}))
    await poll_until(lambda: cp.version != good, timeout=10, what="the good edit to apply")
    assert await cache.wait_for_acks(cp.version or "", node_ids=[NODE_ID], timeout=10)
    assert cp.degraded is None and not cp.refusal_pending
    assert build_status(cp)["health"] == {"ok": True, "status": "ok", "reason": None}
    assert (await gateway.send(100)) == {"v2": 100}


def good_route_version(gateway: Gateway) -> str:
    snapshot = gateway.cp.cache.get_snapshot()
    assert snapshot is not None
    return snapshot.versions[type_urls.ROUTE]
