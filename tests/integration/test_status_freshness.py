"""What ``status`` says stays true: a gone Envoy is shown with its last-seen time and then
expires, a missing policy file is shown (not only logged), and reverting a refused edit does
not make the live policy look newly applied. Real Envoy, real ``inferway run``, loopback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from inferway.gateway.admin import build_status
from inferway.gateway.control_plane import ControlPlane
from inferway.policies import load_policy_text
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.server import start_xds_server
from tests.envoy_process import EnvoyProcess, free_port
from tests.helpers import poll_until, write_atomically

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

POLICY = """\
version: 1
listeners:
  - name: edge
    port: {port}
services:
  - name: model
    endpoints: ["127.0.0.1:9"]
routes:
  - name: models
    backends:
      - service: model
        weight: {weight}
"""


async def test_a_disconnected_envoy_shows_its_last_seen_time_then_expires() -> None:
    cache = SnapshotCache(disconnected_node_ttl=1.0)
    plane = ControlPlane(cache)
    plane.apply_policy(load_policy_text(POLICY.format(port=free_port(), weight=100)), "<test>")
    server = await start_xds_server(cache, port=0)
    try:
        bootstrap = build_bootstrap(node_id="gone-envoy", xds_port=server.port, admin_port=0)
        envoy = await EnvoyProcess(bootstrap).start(wait="ready", timeout=20.0)
        try:
            assert await cache.wait_for_acks(plane.version or "", timeout=10)
            (node,) = build_status(plane)["nodes"]
            assert node["connected"] and node["last_seen"] is not None
        finally:
            envoy.stop()
        stopped_at = time.time()

        def shown_disconnected() -> dict | None:
            nodes = build_status(plane)["nodes"]
            return nodes[0] if nodes and not nodes[0]["connected"] else None

        gone = await poll_until(shown_disconnected, timeout=10, what="the node shown as gone")
        assert gone["node_id"] == "gone-envoy"
        assert stopped_at - 1.0 <= gone["last_seen"] <= time.time()
        await poll_until(
            lambda: build_status(plane)["nodes"] == [], timeout=10, what="the node to expire"
        )
    finally:
        await server.stop(grace=0.2)


def _status(admin: str) -> dict | None:
    try:
        response = httpx.get(f"{admin}/status", timeout=2)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def _wait(predicate, what: str, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_status_shows_a_missing_policy_file_and_keeps_the_age_of_a_reverted_edit(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.yaml"
    good = POLICY.format(port=free_port(), weight=100)
    policy.write_text(good)
    admin_port = free_port()
    admin = f"http://127.0.0.1:{admin_port}"
    command = [
        *(sys.executable, "-m", "inferway.cli.main", "run", "-f", str(policy), "--no-envoy"),
        *("--xds-port", "0", "--admin-port", str(admin_port), "--workdir", str(tmp_path / "wd")),
    ]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        first = _wait(lambda: _status(admin), "the admin API")
        applied_at = first["policy"]["applied_at"]
        assert first["file_problems"] == []

        write_atomically(policy, good.replace("weight: 100", "weight: -1"))
        _wait(lambda: (_status(admin) or {}).get("last_refused"), "the bad edit to be refused")
        time.sleep(1.1)  # so a reset age would show
        write_atomically(policy, good)  # reverted: the live policy never changed
        reverted = _wait(
            lambda: (s := _status(admin)) and not s["last_refused"]["pending"] and s,
            "the revert to be read",
        )
        assert reverted["policy"]["applied_at"] == applied_at
        assert reverted["policy"]["version"] == first["policy"]["version"]

        policy.unlink()
        missing = _wait(lambda: (_status(admin) or {}).get("file_problems"), "the missing file")
        assert [(p["file"], p["kind"]) for p in missing] == [(str(policy), "policy")]
        assert "missing" in missing[0]["message"]
        shown = subprocess.run(
            [sys.executable, "-m", "inferway.cli.main", "status", "--admin", admin],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert "watched file unreadable" in shown.stdout and "missing" in shown.stdout
        write_atomically(policy, good)
        _wait(lambda: (s := _status(admin)) and s["file_problems"] == [], "the problem to clear")
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
