"""LiteLLM's proxy for bench/llm_stream.py, in its own virtual environment: never a dependency
of inferway. The first run creates ``${INFERWAY_CACHE:-~/.cache/inferway}/bench/litellm-venv``
and installs ``litellm[proxy]`` there with pip (a few minutes, once); later runs reuse it.

The proxy is configured to the same engine as the other targets (one model, ``openai/``
provider, the engine's ``/v1`` as ``api_base``), started with a random master key (it refuses
to start without one), its model cost map read locally (no download at start) and its own
logging at ERROR, and stopped with its whole process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["LiteLLMProxy", "ensure_litellm", "venv_dir"]


def venv_dir() -> Path:
    cache = Path(os.environ.get("INFERWAY_CACHE", Path.home() / ".cache" / "inferway"))
    return cache / "bench" / "litellm-venv"


def ensure_litellm(spec: str = "litellm[proxy]") -> Path:
    """The ``litellm`` executable of the bench's own venv, installing it the first time."""
    venv = venv_dir()
    executable = venv / "bin" / "litellm"
    if executable.exists():
        return executable
    print(f"installing {spec} into {venv} (once; a few minutes)", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", spec], check=True, timeout=1800
    )
    if not executable.exists():
        raise RuntimeError(f"pip installed {spec} but {executable} is missing")
    return executable


def _version(executable: Path) -> str:
    done = subprocess.run(
        [str(executable.parent / "python"), "-c", "import importlib.metadata as m;"
         "print(m.version('litellm'))"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    return done.stdout.strip() or "unknown"


class LiteLLMProxy:
    """``async with LiteLLMProxy(exe, engine_v1, model, port, workdir) as proxy``: started and
    answering its liveliness probe inside, stopped after."""

    def __init__(
        self, executable: Path, api_base: str, model: str, port: int, workdir: Path, workers: int
    ) -> None:
        self.executable, self.api_base, self.model = executable, api_base, model
        self.port, self.workdir, self.workers = port, workdir, workers
        self.key = "sk-" + secrets.token_hex(24)
        self.version = _version(executable)
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config(self) -> Path:
        path = self.workdir / "litellm.yaml"
        path.write_text(
            "model_list:\n"
            f"  - model_name: {self.model}\n"
            "    litellm_params:\n"
            f"      model: openai/{self.model}\n"
            f"      api_base: {self.api_base}\n"
            "      api_key: none\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
        )
        return path

    async def __aenter__(self) -> LiteLLMProxy:
        import aiohttp

        env = {
            **os.environ,
            "LITELLM_MASTER_KEY": self.key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
            "NO_PROXY": "*",
        }
        log = (self.workdir / "litellm.log").open("wb")
        started = time.monotonic()
        self.process = subprocess.Popen(
            [str(self.executable), "--config", str(self._config()), "--host", "127.0.0.1",
             "--port", str(self.port), "--num_workers", str(self.workers)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        probe = f"{self.url}/health/liveliness"
        async with aiohttp.ClientSession(trust_env=False) as session:
            while True:
                if self.process.poll() is not None:
                    tail = (self.workdir / "litellm.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"LiteLLM's proxy exited at start:\n{tail}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(probe) as response:
                        if response.status == 200:
                            break
                if time.monotonic() - started > 180:
                    await self.__aexit__()
                    raise RuntimeError(f"LiteLLM's proxy did not answer {probe} in 180 s")
                await asyncio.sleep(0.5)
        self.startup_s = time.monotonic() - started
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            await asyncio.to_thread(self.process.wait, 10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            await asyncio.to_thread(self.process.wait, 5)
