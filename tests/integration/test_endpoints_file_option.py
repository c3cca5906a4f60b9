"""``inferway run --endpoints-file F`` with a policy that has no ``endpoints_file`` key and
services without inline endpoints: the endpoints come from F, so the "service has no
endpoints" check must not refuse the start, nor a later edit of the policy. Without F the
same policy is still refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_pb2
from inferway.gateway.runtime import GatewayOptions, start_gateway
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.checks import check_policy
from inferway.xds import type_urls

pytestmark = pytest.mark.integration

POLICY = """\
listeners: [{{name: edge, port: 10080}}]
services: [{{name: llama}}]
routes: [{{name: chat, timeout: {timeout}, backends: [{{service: llama}}]}}]
"""


def ports(gateway, name: str) -> list[int]:  # type: ignore[no-untyped-def]
    snapshot = gateway.cache.get_snapshot()
    cla = snapshot.resources_of(type_urls.ENDPOINT)[name]
    assert isinstance(cla, endpoint_pb2.ClusterLoadAssignment)
    return [
        lb.endpoint.address.socket_address.port_value
        for g in cla.endpoints
        for lb in g.lb_endpoints
    ]


def test_the_check_knows_about_an_endpoints_file_given_elsewhere() -> None:
    text = POLICY.format(timeout="15s")
    with pytest.raises(PolicyError, match="service 'llama' has no endpoints"):
        load_policy_text(text, "p.yaml")
    policy = load_policy_text(text, "p.yaml", external_endpoints=True)
    assert policy.endpoints_file is None
    assert check_policy(policy, external_endpoints=True) == []
    assert any("has no endpoints" in message for _, message in check_policy(policy))


async def test_run_with_endpoints_file_option_starts_and_accepts_edits(tmp_path: Path) -> None:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICY.format(timeout="15s"))
    endpoints_path = tmp_path / "replicas.yaml"
    endpoints_path.write_text("services:\n  llama: [127.0.0.1:9101, 127.0.0.1:9102]\n")
    options = GatewayOptions(
        policy_path=policy_path,
        xds_port=0,
        admin_port=0,
        with_envoy=False,
        workdir=tmp_path / "work",
    )
    with pytest.raises(PolicyError, match="has no endpoints"):  # without the option: refused
        await start_gateway(options)

    gateway = await start_gateway(
        GatewayOptions(**{**vars(options), "endpoints_file": endpoints_path})
    )
    try:
        assert ports(gateway, "llama") == [9101, 9102]
        before = gateway.control_plane.version
        policy_path.write_text(POLICY.format(timeout="30s"))  # still no inline endpoints
        deadline = time.monotonic() + 10
        while gateway.control_plane.version == before:
            assert gateway.control_plane.last_refused is None, gateway.control_plane.last_refused
            assert time.monotonic() < deadline, "the edit was never applied"
            await asyncio.sleep(0.02)
        assert gateway.control_plane.last_refused is None
        assert ports(gateway, "llama") == [9101, 9102]
    finally:
        await gateway.stop()
