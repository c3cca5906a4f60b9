"""Processes of ``peers.py``'s peer servers: their own venvs (so Mosec's and PyTriton's
dependencies never meet inferway's), PyTriton's and granian's command lines, and a server command
run in a session of its own so that stopping it reaches its children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
import venv
from collections.abc import Sequence
from pathlib import Path

from _common import free_port

__all__ = [
    "GRANIAN_PACKAGES",
    "PeerProcess",
    "ensure_venv",
    "granian_command",
    "pytriton_command",
    "versions",
    "wait_http",
]

HERE = Path(__file__).resolve().parent
GRANIAN_PACKAGES = ["granian[uvloop]", "numpy"]


def ensure_venv(root: Path, packages: Sequence[str]) -> Path:
    """A venv at ``root`` with ``packages`` (created and installed once); its python."""
    python = root / "bin" / "python"
    marker = root / ".installed"
    if not marker.exists():
        print(f"installing {' '.join(packages)} into {root} (once)...", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(root)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
        marker.write_text(" ".join(packages) + "\n")
    return python


def versions(python: Path, names: Sequence[str]) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready at {url} after {timeout_s:.0f} s")
        time.sleep(0.2)


def granian_command(python: Path, port: int) -> list[str]:
    """granian (a Rust HTTP server) running ``peer_servers/granian_static.py``'s fixed answer
    in ``python``'s venv (GRANIAN_PACKAGES): one worker, one runtime thread, uvloop."""
    command = [str(python), "-m", "granian", "--interface", "rsgi", "--workers", "1"]
    command += ["--runtime-threads", "1", "--loop", "uvloop", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--working-dir", str(HERE / "peer_servers")]
    return [*command, "granian_static:app"]


def pytriton_command(
    python: Path, env: dict[str, str], http_port: int, grpc_port: int
) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``peer_servers/pytriton_mlp.py`` in PyTriton's
    venv (``env`` holds PEER_MODEL and the batching limits)."""
    env = dict(env, PEER_HTTP_PORT=str(http_port), PEER_GRPC_PORT=str(grpc_port))
    # Triton's Python-backend stub links libpython3.X.so: make it the venv interpreter's
    # own (a distribution's older libpython beside a newer stdlib breaks multiprocessing)
    libdir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (libdir, env.get("LD_LIBRARY_PATH")) if p)
    env["PEER_METRICS_PORT"] = str(free_port())
    return [str(python), str(HERE / "peer_servers" / "pytriton_mlp.py")], env


class PeerProcess:
    """A server command in a session of its own (so ``stop`` reaches its children), its output
    in ``log``; ``cpus``: the CPUs it (and what it starts) may run on."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str] | None,
        log: Path,
        cpus: set[int] | None = None,
    ) -> None:
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            command,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if cpus is None else (lambda: os.sched_setaffinity(0, cpus)),
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()
