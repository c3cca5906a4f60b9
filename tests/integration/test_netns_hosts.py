"""The many-hosts harness (tests/netns.py) itself: each host binds its own port 10000, traffic
crosses real interfaces between namespaces, a cut link is silent (a timeout, not a refusal),
and everything it made is gone afterwards."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.netns import HostFleet, require_netns


@pytest.fixture(autouse=True)
def _namespaces() -> None:
    require_netns()


def _serve(fleet: HostFleet, host: str, root: Path) -> subprocess.Popen[bytes]:
    folder = root / host
    folder.mkdir()
    (folder / "who").write_text(host)
    return fleet.popen(
        host,
        [sys.executable, "-m", "http.server", "10000", "--bind", fleet.address(host)],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _get(url: str, deadline_s: float = 10.0) -> str:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return httpx.get(url, timeout=1.0).text
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_hosts_in_namespaces_each_bind_port_10000_and_a_cut_is_silent(tmp_path: Path) -> None:
    servers = []
    with HostFleet(["zone-a", "zone-b"]) as fleet:
        tag = fleet.namespace("zone-a").split("-")[0]
        try:
            servers = [_serve(fleet, host, tmp_path) for host in fleet.hosts]
            for host in fleet.hosts:
                assert _get(f"http://{fleet.address(host)}:10000/who") == host
            across = subprocess.run(
                ["ip", "netns", "exec", fleet.namespace("zone-a"), sys.executable, "-c",
                 f"import urllib.request as u; print(u.urlopen("
                 f"'http://{fleet.address('zone-b')}:10000/who', timeout=5).read().decode())"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            assert across.stdout.strip() == "zone-b"

            fleet.cut("zone-b")
            with pytest.raises(httpx.TimeoutException):
                httpx.get(f"http://{fleet.address('zone-b')}:10000/who", timeout=0.5)
            assert _get(f"http://{fleet.address('zone-a')}:10000/who") == "zone-a"
            fleet.restore("zone-b")
            assert _get(f"http://{fleet.address('zone-b')}:10000/who") == "zone-b"
        finally:
            for server in servers:
                server.kill()
                server.wait(timeout=10)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in left
    links = subprocess.run(["ip", "link", "show"], capture_output=True, text=True).stdout
    assert f"{tag}r" not in links
