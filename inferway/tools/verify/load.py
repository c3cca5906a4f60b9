"""The load part: a bounded, headless locust run against the gateway (the real locust
package, in its own process: locust_run.py), judged against the p99 SLA and an error bar.

Load is aimed only at loopback addresses unless the operator says ``--allow-remote``: a
load test pointed at someone else's service by a typo is an attack, not a test.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inferway.tools.verify.expect import Probe

__all__ = ["LoadError", "LoadReport", "LoadSettings", "is_loopback", "run_load"]

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_loopback(url: str) -> bool:
    """Whether ``url`` names this host (127.0.0.0/8, ::1 or localhost)."""
    host = urlsplit(url).hostname or ""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class LoadSettings:
    users: int
    duration_s: float
    spawn_rate: float
    think_time_s: float = 0.0
    sla_p99_ms: float = 50.0
    max_error_percent: float = 0.5
    steady_only: bool = False
    """Judge only answers to requests sent once every user has started (the ramp apart)."""
    cpus: tuple[int, ...] = ()
    """CPUs the locust process may use (empty: any), to keep it off the servers' cores."""
    freeze_heap: bool = True
    """Keep locust's start-up heap and its spawned users out of its collector's sight
    (generator_health.py); False only to measure what that changes."""
    defer_full_gc: bool = False
    """Keep locust's full collections out of the run (generator_health.defer_full_collections;
    what only they would reclaim waits for locust's exit): for A/B runs, no gain measured."""


@dataclass(frozen=True)
class LoadReport:
    settings: LoadSettings
    result: dict[str, Any]
    """locust_run's document: requests, failures, throughput_rps, latency_ms, timeline, ..."""

    @property
    def p99_ms(self) -> float | None:
        value = self.result["latency_ms"]["p99"]
        return None if value is None else float(value)

    @property
    def error_percent(self) -> float:
        n = int(self.result["requests"])
        return 100.0 * int(self.result["failures"]) / n if n else 100.0

    @property
    def ok(self) -> bool:
        p99 = self.p99_ms
        return (
            int(self.result["requests"]) > 0
            and p99 is not None
            and p99 <= self.settings.sla_p99_ms
            and self.error_percent <= self.settings.max_error_percent
        )


class LoadError(RuntimeError):
    """The locust process failed (its stderr tail is the message)."""


def run_load(gateway: str, probes: list[Probe], settings: LoadSettings) -> LoadReport:
    """Run locust for ``settings.duration_s`` with ``settings.users`` users cycling through
    ``probes`` (the requests the policy routes to a pool)."""
    requests = [
        {
            "path": p.path,
            "headers": dict(p.headers),
            "body": base64.b64encode(p.body).decode("ascii"),
            "name": p.path,
        }
        for p in probes
    ]
    config = {
        "host": gateway,
        "users": settings.users,
        "spawn_rate": settings.spawn_rate,
        "duration_s": settings.duration_s,
        "think_time_s": settings.think_time_s,
        "requests": requests,
        "steady_only": settings.steady_only,
        "cpus": list(settings.cpus),
        "freeze_heap": settings.freeze_heap,
        "defer_full_gc": settings.defer_full_gc,
    }
    with tempfile.TemporaryDirectory(prefix="inferway-verify-") as tmp:
        config_path, out_path = Path(tmp) / "config.json", Path(tmp) / "result.json"
        config_path.write_text(json.dumps(config), encoding="utf-8")
        command = [sys.executable, "-m", "inferway.tools.verify.locust_run"]
        try:
            done = subprocess.run(
                [*command, str(config_path), str(out_path)],
                capture_output=True,
                text=True,
                timeout=settings.duration_s + 60.0,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise LoadError(f"locust did not finish within {settings.duration_s + 60:g}s") from None
        if done.returncode != 0 or not out_path.exists():
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise LoadError(f"locust exited {done.returncode}: {tail}")
        result: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8"))
    return LoadReport(settings, result)
