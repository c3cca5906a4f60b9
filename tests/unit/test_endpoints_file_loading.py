"""The endpoints file: loading with located errors, the policy's ``endpoints_file`` path, and
the watcher's reload (valid edits become ClusterLoadAssignments; bad ones are refused and the
last good endpoints stay)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_pb2
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.endpoints_watcher import EndpointsWatcher, load_initial_endpoints
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.endpoints import endpoints_file_path, load_endpoints_text
from inferway.state import State
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache

POLICY = """\
version: 1
endpoints_file: endpoints.yaml
listeners:
  - {name: edge, port: 10080}
services:
  - name: llama
  - name: embedder
    endpoints: ["127.0.0.1:9100"]
routes:
  - name: chat
    match: {path: {prefix: /chat}}
    backends: [{service: llama}]
  - name: embed
    backends: [{service: embedder}]
"""

ENDPOINTS = """\
services:
  llama:
    - 127.0.0.1:9001
    - {address: 127.0.0.1:9002, weight: 3}
"""


def issues(error: pytest.ExceptionInfo[PolicyError]) -> list[str]:
    return [str(issue) for issue in error.value.issues]


def test_loads_address_strings_and_objects_sorted_by_service() -> None:
    loaded = load_endpoints_text(ENDPOINTS + "  embedder: []\n", "eps.yaml")
    assert list(loaded) == ["embedder", "llama"]
    assert [(e.host, e.port, e.weight) for e in loaded["llama"]] == [
        ("127.0.0.1", 9001, 1),
        ("127.0.0.1", 9002, 3),
    ]
    assert loaded["embedder"] == ()
    assert dict(load_endpoints_text("", "empty.yaml")) == {}


def test_errors_are_located_and_all_reported() -> None:
    text = (
        "services:\n  llama:\n    - 127.0.0.1:9001\n    - nope\n"
        "    - {address: 1.2.3.4:5, zone: [x]}\n"
    )
    with pytest.raises(PolicyError) as error:
        load_endpoints_text(text, "eps.yaml")
    found = issues(error)
    assert found[0].startswith("eps.yaml:4:7: services.llama[1]: expected 'host:port'")
    assert found[1].startswith("eps.yaml:5:") and "services.llama[2].zone" in found[1]
    with pytest.raises(PolicyError) as error:
        load_endpoints_text("servces: {}\n", "eps.yaml")
    assert issues(error) == [
        "eps.yaml:1:1: servces: unknown key 'servces' (did you mean 'services'?)"
    ]
    with pytest.raises(PolicyError) as error:
        load_endpoints_text("services: {a: [\n", "eps.yaml")
    assert issues(error)[0].startswith("eps.yaml:")


def test_a_service_not_in_the_policy_is_an_error_at_its_key() -> None:
    text = "services:\n  llama: []\n  lama2: [127.0.0.1:1]\n  other: []\n"
    with pytest.raises(PolicyError) as error:
        load_endpoints_text(text, "eps.yaml", services=["llama", "llama2"])
    assert issues(error) == [
        "eps.yaml:3:3: services.lama2: service 'lama2' is not in the policy "
        "(did you mean 'llama2'?)",
        "eps.yaml:4:3: services.other: service 'other' is not in the policy; the policy's "
        "services: llama, llama2",
    ]


def test_duplicate_endpoints_are_refused() -> None:
    with pytest.raises(PolicyError) as error:
        load_endpoints_text("services:\n  a: [127.0.0.1:1, 127.0.0.1:1]\n", "eps.yaml")
    assert issues(error) == [
        "eps.yaml:2:20: services.a[1]: duplicate endpoint 127.0.0.1:1 (also [0])"
    ]


def test_endpoints_file_path_is_relative_to_the_policy(tmp_path: Path) -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    assert endpoints_file_path(policy, tmp_path / "conf" / "p.yaml") == (
        tmp_path / "conf" / "endpoints.yaml"
    )
    absolute = load_policy_text(POLICY.replace("endpoints.yaml", "/etc/eps.yaml"), "p.yaml")
    assert endpoints_file_path(absolute, tmp_path / "p.yaml") == Path("/etc/eps.yaml")
    inline = load_policy_text(
        POLICY.replace("endpoints_file: endpoints.yaml\n", "").replace(
            "  - name: llama\n", '  - name: llama\n    endpoints: ["127.0.0.1:1"]\n'
        ),
        "p.yaml",
    )
    assert endpoints_file_path(inline, tmp_path / "p.yaml") is None


def test_a_policy_with_an_endpoints_file_may_leave_services_without_inline_endpoints() -> None:
    without = POLICY.replace("endpoints_file: endpoints.yaml\n", "")
    with pytest.raises(PolicyError, match="has no endpoints"):
        load_policy_text(without, "p.yaml")
    assert load_policy_text(POLICY, "p.yaml").endpoints_file == "endpoints.yaml"


# -- the watcher --------------------------------------------------------------------------------


def assignment(cache: SnapshotCache, name: str) -> list[int]:
    snapshot = cache.get_snapshot()
    assert snapshot is not None
    cla = snapshot.resources_of(type_urls.ENDPOINT)[name]
    assert isinstance(cla, endpoint_pb2.ClusterLoadAssignment)
    return sorted(
        lb.endpoint.address.socket_address.port_value
        for locality in cla.endpoints
        for lb in locality.lb_endpoints
    )


def started_plane(tmp_path: Path) -> tuple[ControlPlane, SnapshotCache, Path]:
    (tmp_path / "policy.yaml").write_text(POLICY)
    path = tmp_path / "endpoints.yaml"
    path.write_text(ENDPOINTS)
    policy = load_policy_text(POLICY, str(tmp_path / "policy.yaml"))
    cache = SnapshotCache()
    _, endpoints = load_initial_endpoints(path, [s.name for s in policy.services])
    plane = ControlPlane(cache, state=State(endpoints=endpoints))
    plane.apply_policy(policy, "policy.yaml")
    return plane, cache, path


def test_reload_applies_a_valid_edit_and_refuses_a_bad_one_keeping_the_last_good(
    tmp_path: Path,
) -> None:
    plane, cache, path = started_plane(tmp_path)
    assert assignment(cache, "llama") == [9001, 9002]
    assert assignment(cache, "embedder") == [9100]  # not in the file: inline endpoints stay
    watcher = EndpointsWatcher(path, plane)
    watcher.mark_loaded(ENDPOINTS)
    assert watcher.reload() is None  # unchanged content

    before_clusters = cache.get_snapshot().versions[type_urls.CLUSTER]  # type: ignore[union-attr]
    path.write_text("services:\n  llama: [127.0.0.1:9001, 127.0.0.1:9003]\n")
    result = watcher.reload()
    assert result is not None and result.version == plane.version
    assert assignment(cache, "llama") == [9001, 9003]
    snapshot = cache.get_snapshot()
    assert snapshot is not None and snapshot.versions[type_urls.CLUSTER] == before_clusters

    good = plane.version
    path.write_text("services:\n  llama: [127.0.0.1:9001]\n  ghost: [127.0.0.1:1]\n")
    refused = watcher.reload()
    assert refused is not None and refused.refusal is not None
    assert refused.refusal.lines() == [
        f"{path}:3:3: services.ghost: service 'ghost' is not in the policy; the policy's "
        "services: embedder, llama"
    ]
    assert plane.version == good and assignment(cache, "llama") == [9001, 9003]
    assert plane.refusal_pending

    path.write_bytes(b"\xff\xfe")
    refused = watcher.reload()
    assert refused is not None and refused.refusal is not None
    assert "cannot read file" in refused.refusal.lines()[0]
    assert plane.version == good


def test_a_bad_file_at_start_is_refused_with_its_location(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text("services:\n  llama: [127.0.0.1:0]\n")
    with pytest.raises(PolicyError) as error:
        load_initial_endpoints(path, ["llama"])
    assert issues(error)[0].startswith(f"{path}:2:")
    with pytest.raises(PolicyError, match="cannot read file"):
        load_initial_endpoints(tmp_path / "missing.yaml", ["llama"])


async def test_the_watcher_picks_up_an_atomic_rewrite(tmp_path: Path) -> None:
    plane, cache, path = started_plane(tmp_path)
    watcher = EndpointsWatcher(path, plane, debounce_ms=10)
    watcher.mark_loaded(ENDPOINTS)
    await watcher.start()
    try:
        temp = tmp_path / ".endpoints.tmp"
        temp.write_text("services:\n  llama: [127.0.0.1:9009]\n")
        os.replace(temp, path)
        deadline = time.monotonic() + 5
        while assignment(cache, "llama") != [9009]:
            assert time.monotonic() < deadline, "the rewrite was not applied within 5 s"
            await asyncio.sleep(0.02)
        assert watcher.reloads == 1
    finally:
        await watcher.stop()
