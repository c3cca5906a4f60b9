"""The endpoints file through the production gateway (start_gateway: policy + endpoints
watchers, ADS server, supervised real Envoy): an edit reaches Envoy as endpoints only, a bad
file is refused with its location while the last good endpoints keep serving, and a bad file
at start refuses the start."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.policies import PolicyError
from inferway.xds import type_urls
from inferway.xds.stats import XdsStats
from tests.envoy_process import free_port
from tests.integration.endpoints_harness import (
    Backend,
    poll_until,
    render_policy,
    write_atomically,
)

pytestmark = pytest.mark.integration


class Setup:
    def __init__(self, directory: Path, backends: list[Backend]) -> None:
        self.directory = directory
        self.backends = backends
        self.listener_port = free_port()
        self.policy_path = directory / "policy.yaml"
        self.endpoints_path = directory / "endpoints.yaml"
        self.policy_path.write_text(render_policy(self.listener_port))

    def endpoints(self, alpha: list[int], beta: list[int]) -> str:
        def addresses(indexes: list[int]) -> str:
            return ", ".join(f"127.0.0.1:{self.backends[i].port}" for i in indexes)

        return f"services:\n  alpha: [{addresses(alpha)}]\n  beta: [{addresses(beta)}]\n"

    def options(self, mode: str) -> GatewayOptions:
        return GatewayOptions(
            policy_path=self.policy_path,
            xds_port=0,
            admin_port=0,
            envoy_admin_port=free_port(),
            node_id="endpoints-file-envoy",
            workdir=self.directory / "work",
            xds_protocol=mode,  # type: ignore[arg-type]
        )

    async def send(self, path: str, n: int) -> Counter[int | str]:
        counts: Counter[int | str] = Counter()
        url = f"http://127.0.0.1:{self.listener_port}{path}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            for _ in range(n):
                try:
                    async with session.get(url) as response:
                        if response.status == 200:
                            counts[int((await response.json())["port"])] += 1
                        else:
                            counts[f"status {response.status}"] += 1
                except aiohttp.ClientError as error:
                    counts[f"error {type(error).__name__}"] += 1
        return counts


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    backends = [Backend() for _ in range(3)]
    try:
        for backend in backends:
            await backend.start()
        yield Setup(tmp_path, backends)
    finally:
        for backend in backends:
            await backend.stop()


async def started(setup: Setup, mode: str) -> tuple[Gateway, XdsStats]:
    gateway = await start_gateway(setup.options(mode))
    stats = XdsStats()
    gateway.cache.add_hook(stats)
    assert gateway.supervisor is not None
    if not await gateway.supervisor.wait_ready(20):
        await gateway.stop()
        raise AssertionError("Envoy did not become ready")
    return gateway, stats


@pytest.mark.parametrize("mode", ["sotw", "delta"])
async def test_an_endpoints_file_edit_reaches_envoy_as_endpoints_only(
    setup: Setup, mode: str
) -> None:
    setup.endpoints_path.write_text(setup.endpoints(alpha=[0], beta=[2]))
    gateway, stats = await started(setup, mode)
    try:
        policy_version = gateway.control_plane.version
        assert gateway.endpoints_watcher is not None
        await poll_until(
            lambda: _serves(setup, "/alpha", {setup.backends[0].port}),
            timeout=10,
            what="Envoy to serve alpha from backend 0",
        )
        stats.reset()
        write_atomically(setup.endpoints_path, setup.endpoints(alpha=[1], beta=[2]))
        await poll_until(
            lambda: gateway.control_plane.version != policy_version,
            timeout=5,
            what="the endpoints edit to be applied",
        )
        version = gateway.control_plane.version
        assert version is not None
        assert await gateway.cache.wait_for_acks(version, timeout=10)
        assert gateway.control_plane.source == str(setup.endpoints_path)
        # only endpoints went out; delta sends only the assignment that changed
        assert set(stats.by_type()) == {type_urls.ENDPOINT}, list(stats)
        expected = 1 if mode == "delta" else 2
        assert stats.totals(protocol=mode).resources == expected, list(stats)
        # the removed replica leaves rotation at once although it still passes health checks
        # (ignore_health_on_host_removal); the new one takes all the traffic
        await poll_until(
            lambda: _serves(setup, "/alpha", {setup.backends[1].port}),
            timeout=3,
            what="traffic to move wholly to backend 1",
        )
        assert await setup.send("/alpha", 20) == Counter({setup.backends[1].port: 20})
    finally:
        await gateway.stop()


async def test_a_bad_endpoints_file_is_refused_and_the_last_good_keeps_serving(
    setup: Setup,
) -> None:
    setup.endpoints_path.write_text(setup.endpoints(alpha=[0], beta=[2]))
    gateway, stats = await started(setup, "delta")
    try:
        await poll_until(
            lambda: _serves(setup, "/alpha", {setup.backends[0].port}),
            timeout=10,
            what="Envoy to serve alpha",
        )
        good = gateway.control_plane.version
        stats.reset()
        bad = setup.endpoints(alpha=[0], beta=[2]) + "  gamma: [127.0.0.1:1]\n  beta2: nope\n"
        write_atomically(setup.endpoints_path, bad)
        await poll_until(
            lambda: gateway.control_plane.refusal_pending,
            timeout=5,
            what="the bad endpoints file to be refused",
        )
        refusal = gateway.control_plane.last_refused
        assert refusal is not None and refusal.file == str(setup.endpoints_path)
        assert refusal.lines() == [
            f"{setup.endpoints_path}:5:10: services.beta2: expected a list, got 'nope'"
        ]
        assert gateway.control_plane.version == good
        assert stats.totals().responses == 0
        assert await setup.send("/alpha", 10) == Counter({setup.backends[0].port: 10})
    finally:
        await gateway.stop()


async def test_a_bad_endpoints_file_at_start_refuses_the_start(setup: Setup) -> None:
    setup.endpoints_path.write_text("services:\n  alpha: [127.0.0.1:1]\n  ghost: []\n")
    with pytest.raises(PolicyError) as error:
        await start_gateway(setup.options("sotw"))
    assert [str(i) for i in error.value.issues] == [
        f"{setup.endpoints_path}:3:3: services.ghost: service 'ghost' is not in the policy; "
        "the policy's services: alpha, beta"
    ]


async def _serves(setup: Setup, path: str, ports: set[int], *, subset: bool = False) -> bool:
    counts = await setup.send(path, 6)
    seen = set(counts)
    return ports <= seen if subset else seen == ports
