"""Real LLM engines for tests: llama-cpp-python's OpenAI-compatible server (llama.cpp inside)
and llama.cpp's own C++ ``llama-server`` built from the same sdist, on the tiny random-weight
model that inferway/devtools/tiny_gguf.py writes, on a free loopback port, polled until they
answer, stopped by their own pid (docs/llm.md).

    require_llm_engine()                       # skip, or fail under CI=true, when not installed
    model = write_test_model(tmp_path)         # ~0.5 MB, the same bytes every time
    with start_llm_engine(model, n_ctx=8192) as engine:
        engine.url                             # http://127.0.0.1:<port>; OpenAI routes under /v1
        engine.model                           # the `model` requests name ("tiny" by default)

    require_llama_server()                     # the same, for the C++ server
    with start_llama_server(model, parallel=2) as engine:   # include_usage, /metrics, /slots

Several at once are fine (each its own port and process; keep one thread each on 2 cores).
Both block for about a second: from an async test, call them through ``asyncio.to_thread``.
What each server does and does not support (the Python one: no ``include_usage``, no metrics
endpoint, one request at a time) is listed in docs/llm.md.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType

import httpx

from inferway.devtools.tiny_gguf import TinyLlama, write_tiny_gguf
from tests.components import unavailable
from tests.envoy_process import free_port

__all__ = [
    "ENGINE",
    "INSTALL_COMMAND",
    "LLAMA_SERVER",
    "LLMEngine",
    "llama_server_binary",
    "require_llama_server",
    "require_llm_engine",
    "start_llama_server",
    "start_llm_engine",
    "write_test_model",
]

ENGINE = "llama-cpp-python"
"""The component's name in tests/components.py (CI must have it)."""

LLAMA_SERVER = "llama-server"
"""llama.cpp's C++ server, built by scripts/build_llm_engine.py (tests/components.py)."""

INSTALL_COMMAND = "python scripts/build_llm_engine.py (make test runs it)"
BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_llm_engine.py"


@functools.cache
def _build_script() -> ModuleType:
    """scripts/build_llm_engine.py, which knows the pinned version and the cache layout."""
    spec = importlib.util.spec_from_file_location("build_llm_engine", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None, BUILD_SCRIPT
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def llama_server_binary() -> Path:
    """Where scripts/build_llm_engine.py keeps llama-server for the pinned version (it may not
    exist yet)."""
    script = _build_script()
    path: Path = script.server_binary(script.pinned_version(script.extra_requirements()))
    return path


def require_llama_server() -> Path:
    """The llama-server binary; skips the test (fails it under CI=true) when it was not built,
    with the command that builds it in the reason."""
    binary = llama_server_binary()
    if not os.access(binary, os.X_OK):
        unavailable(
            LLAMA_SERVER,
            f"{binary} is not built: {INSTALL_COMMAND}; needed for llama.cpp's C++ server "
            "(include_usage, /metrics, slots)",
        )
    return binary


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
    """Seconds from spawning the process to its first ready answer."""
    _process: subprocess.Popen[bytes] = field(repr=False)
    kind: str = ENGINE
    """ENGINE (llama-cpp-python's server) or LLAMA_SERVER (llama.cpp's C++ server)."""

    @property
    def version(self) -> str:
        """The llama-cpp-python version (llama-server is built from that version's sdist)."""
        if self.kind == LLAMA_SERVER:
            script = _build_script()
            version: str = script.pinned_version(script.extra_requirements())
            return version
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

    def command(chosen: int) -> list[str]:
        return [
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

    return _spawn(command, ENGINE, "/v1/models", model, model_path, n_ctx, port, log_dir, timeout)


def start_llama_server(
    model_path: Path,
    *,
    port: int | None = None,
    model: str = "tiny",
    n_ctx: int = 4096,
    parallel: int = 1,
    threads: int = 1,
    metrics: bool = True,
    cache_reuse: int = 0,
    extra_args: Sequence[str] = (),
    log_dir: Path | None = None,
    timeout: float = 60.0,
) -> LLMEngine:
    """Start llama.cpp's ``llama-server`` on 127.0.0.1 and wait until ``/health`` answers 200.

    ``n_ctx``: the whole context, split evenly between the ``parallel`` slots (each request
    runs in one slot; ``parallel`` requests decode at once, more wait: the
    ``llamacpp:requests_deferred`` gauge); ``metrics``: serve Prometheus text at ``/metrics``
    (``llamacpp:*``); ``/slots`` is always served; prompt caching is on (a request reusing a
    slot's prefix reports ``usage.prompt_tokens_details.cached_tokens``); ``cache_reuse``:
    the minimum chunk reused by KV shifting (0: off); ``extra_args``: more options
    (``llama-server --help``). Chat templates go through its Jinja engine (``--jinja``). The
    log goes to ``log_dir/llama-server-<port>.log`` (default: the model's directory).
    """
    binary = require_llama_server()

    def command(chosen: int) -> list[str]:
        return [
            str(binary), "--model", str(model_path), "--alias", model,
            "--host", "127.0.0.1", "--port", str(chosen),
            "--ctx-size", str(n_ctx), "--parallel", str(parallel),
            "--threads", str(threads), "--threads-batch", str(threads),
            "--threads-http", str(max(2, parallel + 1)),
            "--cache-reuse", str(cache_reuse), "--jinja", "--no-webui", "--slots",
            *(["--metrics"] if metrics else []),
            *extra_args,
        ]  # fmt: skip

    return _spawn(
        command, LLAMA_SERVER, "/health", model, model_path, n_ctx, port, log_dir, timeout
    )


def _spawn(
    command: Callable[[int], list[str]],
    kind: str,
    ready_path: str,
    model: str,
    model_path: Path,
    n_ctx: int,
    port: int | None,
    log_dir: Path | None,
    timeout: float,
) -> LLMEngine:
    """Run ``command(port)`` until it answers ``ready_path``, picking another free port when
    it loses the race for one (three tries; a port the caller chose is not retried)."""
    for attempt in range(3):
        chosen = port or free_port()
        name = "llm-engine" if kind == ENGINE else kind
        log = (log_dir or model_path.parent) / f"{name}-{chosen}.log"
        started = time.monotonic()
        with log.open("wb") as out:
            process = subprocess.Popen(
                command(chosen),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=os.environ | {"NO_PROXY": "*"},
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
            kind=kind,
        )
        try:
            engine.started_in = _wait_ready(engine, ready_path, started, timeout)
            return engine
        except _PortTaken:
            engine.stop()
            if port is not None or attempt == 2:
                raise RuntimeError(f"{kind}: port {chosen} taken: {engine.log_tail()}") from None
        except BaseException:
            engine.stop()
            raise
    raise AssertionError("unreachable: the loop returns or raises")


class _PortTaken(Exception):
    pass


def _wait_ready(engine: LLMEngine, path: str, started: float, timeout: float) -> float:
    deadline = started + timeout
    with httpx.Client(trust_env=False, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not engine.running():
                tail = engine.log_tail()
                if "address already in use" in tail.lower() or "couldn't bind" in tail:
                    raise _PortTaken
                raise RuntimeError(
                    f"{engine.kind} on {engine.model_path} exited with "
                    f"{engine._process.returncode} before answering; its log ({engine.log}):\n"
                    + tail
                )
            try:
                if client.get(f"{engine.url}{path}").status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    raise RuntimeError(
        f"{engine.kind} on port {engine.port} not ready after {timeout} s; its log:\n"
        f"{engine.log_tail()}"
    )
