"""A client that sends requests on one keep-alive HTTP/1.1 connection until the server tells it
to go, as the tests of a draining gateway need: a ``Connection: close`` answer ends it (a
client with another gateway would go there), and anything but a 200 before that is a failure.
"""

from __future__ import annotations

import http.client
import threading
import time

__all__ = ["KeepAliveClient", "wait_until_flowing"]


class KeepAliveClient(threading.Thread):
    """``method path`` on one connection to ``host:port``, at most ``seconds`` or ``limit``
    requests or until ``stop()``; ``ok``, ``told_to_go`` and ``failures`` say how it went."""

    def __init__(
        self,
        port: int,
        path: str,
        *,
        method: str = "GET",
        body: str | None = None,
        headers: dict[str, str] | None = None,
        seconds: float = 60.0,
        limit: int = 5000,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(daemon=True)
        self.host = host
        self.port, self.path, self.method, self.body = port, path, method, body
        self.headers = headers or {}
        self.seconds, self.limit = seconds, limit
        self.ok = 0
        self.told_to_go = False
        self.failures: list[str] = []
        self._stopped = threading.Event()

    def stop(self) -> None:
        """Send no more requests (the one in flight completes)."""
        self._stopped.set()

    def run(self) -> None:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        deadline = time.monotonic() + self.seconds
        try:
            for _ in range(self.limit):
                if time.monotonic() > deadline or self._stopped.is_set():
                    return
                try:
                    connection.request(self.method, self.path, self.body, self.headers)
                    response = connection.getresponse()
                    response.read()
                except (OSError, http.client.HTTPException) as error:
                    self.failures.append(f"after {self.ok} ok: {error!r}")
                    return
                if response.status != 200:
                    self.failures.append(f"after {self.ok} ok: HTTP {response.status}")
                    return
                self.ok += 1
                if (response.getheader("connection") or "").lower() == "close":
                    self.told_to_go = True
                    return
        finally:
            connection.close()


def wait_until_flowing(clients: list[KeepAliveClient], at_least: int, timeout: float) -> None:
    """Until every client has ``at_least`` answers; fails with their failures otherwise."""
    deadline = time.monotonic() + timeout
    while not all(c.ok >= at_least for c in clients):
        failures = [f for c in clients for f in c.failures]
        assert not failures and time.monotonic() < deadline, failures or "clients too slow"
        time.sleep(0.05)
