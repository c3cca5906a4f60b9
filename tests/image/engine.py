"""The container engine tests/image uses: Debian's docker.io, dockerd 20.10 with BuildKit built in,
driven by its own client ``/usr/bin/docker`` (a newer client without buildx cannot use that
BuildKit: ``DOCKER_BUILDKIT=1`` with it asks for the buildx plugin). Installed with apt-get by
deploy/base/ci-engine.sh when missing, started when no daemon answers, and stopped afterwards
only if these tests started it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LABEL", "ROOT", "Engine", "start_engine"]

LABEL = "org.inferway.test=image"
"""Carried by every container, network and image the tests make: what they remove."""
ROOT = Path(__file__).resolve().parents[2]
_CLIENT = "/usr/bin/docker"
_DAEMON = "/usr/sbin/dockerd"
_START_TIMEOUT_S = 60.0


@dataclass
class Engine:
    """The client to run, and the daemon these tests started (None: one was running)."""

    docker: str
    daemon: subprocess.Popen[bytes] | None = None
    daemon_log: Path | None = None

    def run(
        self,
        *args: str,
        timeout: float = 120,
        check: bool = True,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``docker ARGS``; with ``check``, a failure raises with the command and its output."""
        done = subprocess.run(
            [self.docker, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=None if env is None else {**os.environ, **env},
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"docker {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
            )
        return done

    def answers(self) -> bool:
        done = subprocess.run(
            [self.docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        return done.returncode == 0

    def stop(self) -> None:
        """Stop the daemon if these tests started it (its containerd goes with it)."""
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait(timeout=10)


def _install() -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "deploy" / "base" / "ci-engine.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"deploy/base/ci-engine.sh failed:\n{done.stdout}\n{done.stderr}")


def start_engine(log: Path) -> Engine:
    """Debian's engine, installed and answering; ``log`` receives a started daemon's output."""
    if not (Path(_DAEMON).exists() and Path(_CLIENT).exists() and shutil.which("debootstrap")):
        _install()
    engine = Engine(_CLIENT)
    if engine.answers():
        return engine
    with log.open("wb") as out:
        engine.daemon = subprocess.Popen(
            [_DAEMON], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    engine.daemon_log = log
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not engine.answers():
        if engine.daemon.poll() is not None or time.monotonic() > deadline:
            engine.stop()
            raise AssertionError(f"dockerd did not start; its log:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)
    return engine
