"""Many hosts on one machine: a Linux network namespace per "host", each with one veth link to
a bridge that lives in a namespace of its own (the switch), so every host binds its own port
10000 and traffic between hosts crosses real interfaces. The test process reaches the hosts
through one more veth from its own namespace into the switch, on a /24 it picks that nothing
outside these namespaces routes.

    with HostFleet(["cp", "zone-a", "zone-b"]) as fleet:
        fleet.address("zone-a")                          # 10.231.<n>.2
        process = fleet.popen("zone-a", ["envoy", ...])   # runs inside zone-a's namespace
        fleet.cut("zone-b")                              # link down: silent, no RST
        fleet.restore("zone-b")

Everything it makes is removed on exit (namespaces, links), also after a failure. Where
namespaces cannot be made, :func:`netns_unavailable` says why and :func:`require_netns` skips
the test with that reason, in CI too (no root, a sandbox that forbids them); only a missing
``ip`` (Debian's iproute2, which CI must have) fails it under CI=true.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from tests.components import require_binary, unavailable

__all__ = ["HostFleet", "netns_unavailable", "require_netns"]

IP = shutil.which("ip")


def _ip(*args: str, namespace: str | None = None) -> None:
    assert IP is not None
    argv = [IP, *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


@functools.cache
def netns_unavailable() -> str | None:
    """None where this process can make network namespaces; else the reason it cannot."""
    if IP is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"iwprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot make a network namespace: {exc}"
    _ip("netns", "del", probe)
    return None


def require_netns() -> None:
    """Skip this test, saying why, where network namespaces cannot be made; fail it under
    CI=true only when ``ip`` is what is missing (tests/components.py)."""
    require_binary("ip", "making network namespaces")
    reason = netns_unavailable()
    if reason is not None:
        unavailable("network namespaces", f"no network namespaces: {reason}")


class HostFleet:
    def __init__(self, hosts: Sequence[str], *, subnet_octet: int | None = None) -> None:
        if len(set(hosts)) != len(hosts) or not hosts or len(hosts) > 200:
            raise ValueError(f"hosts must be 1-200 distinct names, got {list(hosts)}")
        self.hosts = list(hosts)
        self._tag = f"iw{os.getpid() % 100000}"
        self._octet = subnet_octet
        self._net = ""
        self._switch = f"{self._tag}-sw"
        self._made: list[str] = []
        self._root_link = f"{self._tag}r"

    def namespace(self, host: str) -> str:
        return f"{self._tag}-{self.hosts.index(host)}"

    def address(self, host: str) -> str:
        return f"{self._net}.{self.hosts.index(host) + 2}"

    @property
    def gateway_address(self) -> str:
        """The test process's own address on the hosts' network."""
        return f"{self._net}.1"

    def _link(self, host: str) -> str:
        return f"{self._tag}s{self.hosts.index(host)}"

    def __enter__(self) -> HostFleet:
        remove_leftovers()
        if self._octet is None:
            self._octet = _free_octet(16 + os.getpid() % 200)
        self._net = f"10.231.{self._octet}"
        try:
            _ip("netns", "add", self._switch)
            self._made.append(self._switch)
            _ip("link", "add", "br0", "type", "bridge", namespace=self._switch)
            _ip("link", "set", "br0", "up", namespace=self._switch)
            _ip("link", "add", self._root_link, "type", "veth", "peer", "name", "root",
                "netns", self._switch)  # fmt: skip
            _ip("addr", "add", f"{self.gateway_address}/24", "dev", self._root_link)
            _ip("link", "set", self._root_link, "up")
            _ip("link", "set", "root", "master", "br0", "up", namespace=self._switch)
            for host in self.hosts:
                namespace, link = self.namespace(host), self._link(host)
                _ip("netns", "add", namespace)
                self._made.append(namespace)
                _ip("link", "add", link, "netns", self._switch, "type", "veth", "peer", "name",
                    "eth0", "netns", namespace)  # fmt: skip
                _ip("link", "set", link, "master", "br0", "up", namespace=self._switch)
                _ip("addr", "add", f"{self.address(host)}/24", "dev", "eth0", namespace=namespace)
                _ip("link", "set", "eth0", "up", namespace=namespace)
                _ip("link", "set", "lo", "up", namespace=namespace)
        except BaseException:
            self.close()
            raise
        return self

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """``argv`` started inside ``host``'s namespace (stop it by its pid)."""
        assert IP is not None
        return subprocess.Popen([IP, "netns", "exec", self.namespace(host), *argv], **kwargs)

    def cut(self, host: str) -> None:
        """The host's link goes down at the switch: its packets go nowhere and nothing answers
        (no reset, no ICMP), as when a zone's network fails silently."""
        _ip("link", "set", self._link(host), "down", namespace=self._switch)

    def restore(self, host: str) -> None:
        _ip("link", "set", self._link(host), "up", namespace=self._switch)

    def close(self) -> None:
        """Removes every namespace and link this fleet made (links go with their namespace)."""
        for namespace in reversed(self._made):
            subprocess.run(
                [IP or "ip", "netns", "del", namespace], capture_output=True, check=False
            )
        self._made.clear()
        subprocess.run(
            [IP or "ip", "link", "del", self._root_link], capture_output=True, check=False
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_LEFTOVER = re.compile(r"^iw(\d+)(?:-\S*|r)$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> None:
    """Namespaces and root links of fleets whose test process died without closing them
    (killed by a timeout, say): they would hold a subnet and names a new fleet may pick."""
    listed = subprocess.run([IP or "ip", "netns", "list"], capture_output=True, text=True)
    for line in listed.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        found = _LEFTOVER.match(name)
        if found and not _pid_alive(int(found.group(1))):
            subprocess.run([IP or "ip", "netns", "del", name], capture_output=True, check=False)
    links = subprocess.run([IP or "ip", "-o", "link"], capture_output=True, text=True)
    for line in links.stdout.splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        found = _LEFTOVER.match(name)
        if found and not _pid_alive(int(found.group(1))):
            subprocess.run([IP or "ip", "link", "del", name], capture_output=True, check=False)


def _free_octet(preferred: int) -> int:
    """``preferred``, or the next octet whose 10.231.<octet>.0/24 no interface here uses."""
    shown = subprocess.run([IP or "ip", "-o", "-4", "addr"], capture_output=True, text=True)
    used = {int(m) for m in re.findall(r"inet 10\.231\.(\d+)\.", shown.stdout)}
    for step in range(200):
        octet = 16 + (preferred - 16 + step) % 200
        if octet not in used:
            return octet
    raise RuntimeError("every 10.231.x.0/24 subnet for test hosts is in use")
