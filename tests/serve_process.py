"""``inferway serve`` as a subprocess, waited for on its readiness endpoint, for the tests that
run the command as a user does."""

from __future__ import annotations

import subprocess
import time

import httpx

__all__ = ["wait_serve_ready"]


def wait_serve_ready(proc: subprocess.Popen[str], base: str, timeout_s: float = 60.0) -> None:
    """Until ``base``/v2/health/ready answers 200; fails with the server's output if it
    exits first, or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            if httpx.get(f"{base}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "inferway serve never became ready"
        time.sleep(0.1)
