"""A policy edit that moves, adds or drops ``endpoints_file`` moves the endpoints with it: the
new file is read (and checked) before the edit goes live, the watcher follows it, and the old
file stops mattering. A missing or bad new file refuses the edit."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_pb2
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.endpoints_follower import EndpointsFollower
from inferway.gateway.endpoints_watcher import load_initial_endpoints
from inferway.gateway.file_watch import ReloadResult
from inferway.gateway.watcher import PolicyWatcher
from inferway.policies import load_policy_text
from inferway.state import State
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache

POLICY = """\
version: 1
{endpoints_line}listeners: [{{name: edge, port: 10080}}]
services:
  - name: llama
{inline}routes: [{{name: chat, backends: [{{service: llama}}]}}]
"""


def policy_text(endpoints_file: str | None) -> str:
    if endpoints_file is None:
        return POLICY.format(endpoints_line="", inline='    endpoints: ["127.0.0.1:7000"]\n')
    return POLICY.format(endpoints_line=f"endpoints_file: {endpoints_file}\n", inline="")


def ports(cache: SnapshotCache) -> list[int]:
    snapshot = cache.get_snapshot()
    assert snapshot is not None
    cla = snapshot.resources_of(type_urls.ENDPOINT)["llama"]
    assert isinstance(cla, endpoint_pb2.ClusterLoadAssignment)
    return sorted(
        lb.endpoint.address.socket_address.port_value
        for locality in cla.endpoints
        for lb in locality.lb_endpoints
    )


async def eventually(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


async def test_an_edit_moves_the_endpoints_and_the_watcher_to_the_new_file(tmp_path: Path) -> None:
    policy_path = tmp_path / "policy.yaml"
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("services:\n  llama: [127.0.0.1:9001]\n")
    b.write_text("services:\n  llama: [127.0.0.1:9002]\n")
    policy = load_policy_text(policy_text("a.yaml"), str(policy_path))
    text, endpoints = load_initial_endpoints(a, ["llama"])
    cache = SnapshotCache()
    plane = ControlPlane(cache)
    follower = EndpointsFollower(plane, policy_path, a, debounce_ms=5)
    plane.add_observer(follower)
    plane.apply_policy(policy, "policy.yaml", state=State(endpoints=endpoints))
    await follower.start(text)
    # Edits arrive as the gateway's policy watcher applies them: sources read first.
    watcher = PolicyWatcher(policy_path, plane, sources=[follower.resolve_state])

    def edit(endpoints_file: str | None) -> ReloadResult | None:
        policy_path.write_text(policy_text(endpoints_file))
        return watcher.reload()

    try:
        assert ports(cache) == [9001]

        edit("b.yaml")
        assert ports(cache) == [9002]  # read before the edit went live
        await eventually(lambda: _watching(follower, b))
        a.write_text("services:\n  llama: [127.0.0.1:9011]\n")  # the old file: ignored
        b.write_text("services:\n  llama: [127.0.0.1:9012]\n")  # the new one: followed
        await eventually(lambda: _assert_ports(cache, [9012]))
        await asyncio.sleep(0.2)
        assert ports(cache) == [9012]

        good = plane.version
        refused = edit("missing.yaml")
        assert refused is not None and refused.refusal is not None
        assert "missing.yaml" in "\n".join(refused.refusal.lines())
        assert plane.version == good and follower.path == b

        edit(None)
        assert ports(cache) == [7000]  # back to the inline endpoints
        await eventually(lambda: _assert(follower.watcher is None))
        b.write_text("services:\n  llama: [127.0.0.1:9013]\n")
        await asyncio.sleep(0.2)
        assert ports(cache) == [7000]
    finally:
        await follower.stop()


def _watching(follower: EndpointsFollower, path: Path) -> None:
    assert follower.watcher is not None and follower.watcher.path == path


def _assert_ports(cache: SnapshotCache, expected: list[int]) -> None:
    assert ports(cache) == expected


def _assert(condition: bool) -> None:
    assert condition
