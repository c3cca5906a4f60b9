"""A real LLM engine for tests: llama-cpp-python's OpenAI-compatible server (llama.cpp inside)
on the tiny random-weight model that inferway/devtools/tiny_gguf.py writes, on a free
loopback port, polled until ``/v1/models`` answers, stopped by its own pid (docs/llm.md).

    require_llm_engine()                       # skip, or fail under CI=true, when not installed
    model = write_test_model(tmp_path)         # ~0.5 MB, the same bytes every time
    with start_llm_engine(model, n_ctx=8192) as engine:
        engine.url                             # http://127.0.0.1:<port>; OpenAI routes under /v1
        engine.model                           # the `model` requests name ("tiny" by default)

Several at once are fine (each its own port and process; keep ``n_threads=1`` on 2 cores).
``start_llm_engine`` blocks for about a second: from an async test, call it through
``asyncio.to_thread``. What the server does and does not support (no ``include_usage``, no
metrics endpoint, one request at a time) is listed in docs/llm.md.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from inferway.devtools.tiny_gguf import TinyLlama, write_tiny_gguf
from tests.components import unavailable
from tests.envoy_process import free_port

__all__ = [
    "ENGINE",
    "INSTALL_COMMAND",
    "LLMEngine",
    "require_llm_engine",
    "start_llm_engine",
    "write_test_model",
]

ENGINE = "llama-cpp-python"
"""The component's name in tests/components.py (CI must have it)."""

INSTALL_COMMAND = "python scripts/build_llm_engine.py (make test runs it)"


def require_llm_engine() -> None:
    """Skip the test (fail it under CI=true) unless llama-cpp-python's server is importable
    here, with the command that installs it in the reason."""
    missing = [m for m in ("llama_cpp", "fastapi", "uvicorn") if not importlib.util.find_spec(m)]
    if missing:
        unavailable(
            ENGINE,
            f"{ENGINE}[server] is not installed ({', '.join(missing)} missing): "
            f"{INSTALL_COMMAND}; needed for a real LLM engine",
        )


def write_test_model(directory: Path, *, seed: int = 0, context_length: int = 32768) -> Path:
    """The tiny model as ``directory/tiny-<seed>.gguf`` (written once per directory)."""
    path = directory / f"tiny-{seed}.gguf"
    if not path.exists():
        write_tiny_gguf(path, TinyLlama(seed=seed, context_length=context_length))
    return path


@dataclass
class LLMEngine:
    """One running server; ``stop()`` ends its process only (idempotent)."""

    url: str
    port: int
    pid: int
    model: str
    model_path: Path
    n_ctx: int
    log: Path
    started_in: float
    """Seconds from spawning the process to the first answer of ``/v1/models``."""
    _process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def version(self) -> str:
        return importlib.metadata.version(ENGINE)

    def running(self) -> bool:
        return self._process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        if self._process.poll() is not None:
            return
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=timeout)

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _flag(value: bool) -> str:
    return "True" if value else "False"


def start_llm_engine(
    model_path: Path,
    *,
    port: int | None = None,
    model: str = "tiny",
    n_ctx: int = 4096,
    n_threads: int = 1,
    cache: bool = False,
    cache_size: int = 256 << 20,
    embedding: bool = False,
    interrupt_requests: bool = False,
    verbose: bool = True,
    extra_args: Sequence[str] = (),
    log_dir: Path | None = None,
    timeout: float = 60.0,
) -> LLMEngine:
    """Start ``python -m llama_cpp.server`` on 127.0.0.1 and wait until it answers.

    ``port``: None picks a free one (and retries on a lost race); ``model``: the alias requests
    name in ``model`` (the server answers any name while it serves one model); ``n_ctx``: the
    context in tokens (prompt + completion); ``cache``: llama-cpp-python's prompt cache (KV
    states of earlier prompts in RAM, reused by the longest common prefix; the last prompt's
    prefix is reused even without it); ``embedding``: serve ``/v1/embeddings`` (then chat and
    completions are not served well: start a second engine for those); ``interrupt_requests``:
    the server's own default (True) ends a running stream when another request arrives, so it
    is off here; ``extra_args``: more ``--name value`` options of llama_cpp.server (``--help``).
    The log (llama.cpp's load and timing lines, uvicorn's access log) goes to
    ``log_dir/llm-engine-<port>.log`` (default: the model's directory).
    """
    require_llm_engine()
    for attempt in range(3):
        chosen = port or free_port()
        log = (log_dir or model_path.parent) / f"llm-engine-{chosen}.log"
        command = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(model_path), "--model_alias", model,
            "--host", "127.0.0.1", "--port", str(chosen),
            "--n_ctx", str(n_ctx), "--n_batch", "512",
            "--n_threads", str(n_threads), "--n_threads_batch", str(n_threads),
            "--cache", _flag(cache), "--cache_size", str(cache_size),
            "--embedding", _flag(embedding),
            # mean pooling: one vector per input (the model's own default is one per token)
            *(["--kv_overrides", "llama.pooling_type=int:1"] if embedding else []),
            "--interrupt_requests", _flag(interrupt_requests),
            "--verbose", _flag(verbose),
            *extra_args,
        ]  # fmt: skip
        started = time.monotonic()
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"NO_PROXY": "*"}
            )
        engine = LLMEngine(
            url=f"http://127.0.0.1:{chosen}",
            port=chosen,
            pid=process.pid,
            model=model,
            model_path=model_path,
            n_ctx=n_ctx,
            log=log,
            started_in=0.0,
            _process=process,
        )
        try:
            engine.started_in = _wait_ready(engine, started, timeout)
            return engine
        except _PortTaken:
            engine.stop()
            if port is not None or attempt == 2:
                raise RuntimeError(
                    f"llm engine: port {chosen} taken: {engine.log_tail()}"
                ) from None
        except BaseException:
            engine.stop()
            raise
    raise AssertionError("unreachable: the loop returns or raises")


class _PortTaken(Exception):
    pass


def _wait_ready(engine: LLMEngine, started: float, timeout: float) -> float:
    deadline = started + timeout
    with httpx.Client(trust_env=False, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not engine.running():
                tail = engine.log_tail()
                if "address already in use" in tail.lower():
                    raise _PortTaken
                raise RuntimeError(
                    f"llm engine on {engine.model_path} exited with {engine._process.returncode} "
                    f"before answering; its log ({engine.log}):\n{tail}"
                )
            try:
                if client.get(f"{engine.url}/v1/models").status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    raise RuntimeError(
        f"llm engine on port {engine.port} not ready after {timeout} s; its log:\n"
        f"{engine.log_tail()}"
    )
