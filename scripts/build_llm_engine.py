#!/usr/bin/env python3
"""Installs the test LLM engines into a venv and a cache: llama-cpp-python's OpenAI-compatible
server, and llama.cpp's own C++ `llama-server` built from the same sdist's bundled llama.cpp,
each compiled only once per machine (docs/llm.md, "The test engine").

llama-cpp-python publishes no CPU wheel on PyPI, so `pip install` compiles llama.cpp: 10 to 15
minutes on 2 cores. This script builds the wheel once, CPU only and without
`-march=native` (CMAKE_ARGS below: it runs on any x86-64 machine), keeps it outside the clone
in ${INFERWAY_CACHE:-~/.cache/inferway}/wheels/<version>-<machine>-<hash of CMAKE_ARGS>/, and
installs it with its `server` extra and the rest of pyproject.toml's `llm-engine` extra, where
the version is pinned (the one place). Already installed at that version: returns at once.

The Python server ignores `stream_options.include_usage` and has no metrics or slots; the C++
`llama-server` has all three, so it is built too (10 to 25 minutes more on 2 cores, once): the
sdist is downloaded, its vendor/llama.cpp configured with SERVER_CMAKE_FLAGS and only the
`llama-server` target compiled (static, no web UI, no curl/OpenSSL), and the binary kept at
${INFERWAY_CACHE:-~/.cache/inferway}/bin/llama-server-<version>-<machine>-<hash of the flags>.

    python scripts/build_llm_engine.py [--python .venv/bin/python] [--strict]

It cannot install (no compiler, no network, a failed build): it says why and exits 0, and the
engine's tests skip saying so; in CI (CI=true, or --strict) it exits 1 instead, because there
they fail anyway (tests/components.py). INFERWAY_LLM_ENGINE=skip skips it outside CI.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRA = "llm-engine"
PACKAGE = "llama-cpp-python"
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
"""CPU only (no CUDA/Metal flags), portable: GGML_NATIVE=OFF compiles for baseline x86-64."""
SERVER_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
)  # fmt: skip
"""llama-server alone, statically linked (it runs from the cache with no libllama beside it),
portable as the wheel is, without the web UI or network clients the tests never use."""

_PIN = re.compile(r"^llama-cpp-python(?:\[(?P<extras>[^\]]*)\])?==(?P<version>[0-9][\w.]*)$")


class EngineError(RuntimeError):
    """The engine could not be installed; the message says why."""


def extra_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The `llm-engine` extra's requirements, exactly as pyproject.toml lists them."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = project.get("optional-dependencies", {}).get(EXTRA)
    if not requirements:
        raise EngineError(f"{pyproject}: no [project.optional-dependencies] {EXTRA}")
    return list(requirements)


def pinned_version(requirements: list[str]) -> str:
    """The llama-cpp-python version the extra pins with ``==``."""
    for requirement in requirements:
        match = _PIN.match(requirement.replace(" ", ""))
        if match:
            return match["version"]
    raise EngineError(f"the {EXTRA} extra must pin {PACKAGE}==<version>, has {requirements}")


def cache_base() -> Path:
    return Path(os.environ.get("INFERWAY_CACHE") or Path.home() / ".cache" / "inferway")


def cache_dir(version: str) -> Path:
    """Where the wheel for this version, machine and CMAKE_ARGS is kept."""
    key = hashlib.sha256(CMAKE_ARGS.encode()).hexdigest()[:12]
    return cache_base() / "wheels" / f"{PACKAGE}-{version}-{platform.machine()}-{key}"


def server_binary(version: str) -> Path:
    """Where llama-server built from this version's sdist, for this machine and
    SERVER_CMAKE_FLAGS, is kept (tests/llm_engine.py looks there)."""
    key = hashlib.sha256(" ".join(SERVER_CMAKE_FLAGS).encode()).hexdigest()[:12]
    return cache_base() / "bin" / f"llama-server-{version}-{platform.machine()}-{key}"


def installed_version(python: str) -> str | None:
    """llama-cpp-python's version in ``python``'s environment when it and gguf import."""
    probe = "import gguf, llama_cpp, llama_cpp.server; print(llama_cpp.__version__)"
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def cached_wheel(directory: Path) -> Path | None:
    wheels = sorted(directory.glob("llama_cpp_python-*.whl"))
    return wheels[-1] if wheels else None


def build_wheel(python: str, version: str, directory: Path) -> Path:
    """Compile the wheel from the sdist into ``directory`` (under a lock: one build at a time,
    a second caller waits and then finds the wheel)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f"{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheel = cached_wheel(directory)
        if wheel is not None:
            return wheel
        log = directory.parent / f"{directory.name}.log"
        print(
            f"llm engine: building {PACKAGE} {version} from its sdist, once (10 to 15 min on 2 "
            f"cores); log {log}",
            flush=True,
        )
        env = os.environ | {
            "CMAKE_ARGS": CMAKE_ARGS,
            "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1),
        }
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=directory.parent) as scratch, open(log, "w") as out:
            command = [
                python, "-m", "pip", "wheel", "--no-deps", "--no-binary", PACKAGE, "--no-cache-dir",
                "--wheel-dir", scratch, f"{PACKAGE}=={version}",
            ]  # fmt: skip
            result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
            if result.returncode != 0:
                tail = log.read_text(errors="replace").splitlines()[-15:]
                raise EngineError(
                    f"pip wheel {PACKAGE}=={version} failed (exit {result.returncode}); the end "
                    f"of {log}:\n" + "\n".join(tail)
                )
            built = next(Path(scratch).glob("*.whl"))
            staging = directory.with_name(directory.name + ".new")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            shutil.move(built, staging / built.name)
            staging.rename(directory)
        print(f"llm engine: built in {time.monotonic() - started:.0f} s", flush=True)
        wheel = cached_wheel(directory)
        assert wheel is not None
        return wheel


def install(python: str) -> str:
    """Install the extra into ``python``'s environment; returns what it did, in words."""
    requirements = extra_requirements()
    version = pinned_version(requirements)
    if installed_version(python) == version:
        return f"{PACKAGE} {version} present"
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise EngineError("no C++ compiler on PATH (Debian: apt-get install g++ cmake)")
    directory = cache_dir(version)
    wheel = cached_wheel(directory) or build_wheel(python, version, directory)
    command = [
        python, "-m", "pip", "install", "--quiet", "--find-links", str(directory),
        "--only-binary", PACKAGE, *requirements,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise EngineError(f"pip install from {wheel} failed:\n{result.stderr[-2000:]}")
    if installed_version(python) != version:
        raise EngineError(f"installed {wheel.name}, but {python} cannot import llama_cpp.server")
    return f"{PACKAGE} {version} installed from {wheel}"


def _run_logged(
    command: list[str], log: Path, what: str, env: dict[str, str] | None = None
) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise EngineError(
            f"{what} failed (exit {result.returncode}); the end of {log}:\n" + "\n".join(tail)
        )


def fetch_sources(python: str, version: str, scratch: Path, log: Path) -> Path:
    """Download the pinned sdist (no wheel, no dependencies) into ``scratch`` and unpack it;
    returns its bundled llama.cpp source tree."""
    command = [
        python, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE,
        "--dest", str(scratch), f"{PACKAGE}=={version}",
    ]  # fmt: skip
    _run_logged(command, log, f"pip download {PACKAGE}=={version}")
    archives = sorted(scratch.glob("*.tar.gz"))
    if not archives:
        raise EngineError(f"pip download left no sdist in {scratch}: {sorted(scratch.iterdir())}")
    with tarfile.open(archives[0]) as archive:
        archive.extractall(scratch, filter="data")
    sources = next(scratch.glob("*/vendor/llama.cpp/CMakeLists.txt"), None)
    if sources is None:
        raise EngineError(f"{archives[0].name} has no vendor/llama.cpp/CMakeLists.txt")
    return sources.parent


def configure_server(sources: Path, build: Path, log: Path) -> None:
    command = ["cmake", "-S", str(sources), "-B", str(build), *SERVER_CMAKE_FLAGS]
    _run_logged(command, log, "cmake configure of llama.cpp")


def build_server(python: str, version: str, binary: Path) -> Path:
    """Compile llama-server into ``binary`` (under a lock, as the wheel)."""
    binary.parent.mkdir(parents=True, exist_ok=True)
    with open(binary.with_name(binary.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file():
            return binary
        log = binary.with_name(binary.name + ".log")
        log.write_text("")
        cores = str(os.cpu_count() or 1)
        print(
            f"llm engine: compiling llama-server {version} once, ~10-25 min on 2 cores "
            f"({cores} here); log {log}",
            flush=True,
        )
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=binary.parent) as scratch_name:
            scratch = Path(scratch_name)
            sources = fetch_sources(python, version, scratch, log)
            configure_server(sources, scratch / "build", log)
            command = ["cmake", "--build", str(scratch / "build"), "--target", "llama-server"]
            env = os.environ | {"CMAKE_BUILD_PARALLEL_LEVEL": cores}
            _run_logged(command, log, "compiling llama-server", env)
            built = scratch / "build" / "bin" / "llama-server"
            if not built.is_file():
                raise EngineError(f"the build finished without {built}; see {log}")
            staging = binary.with_name(binary.name + ".new")
            shutil.copy2(built, staging)
            staging.rename(binary)
        print(f"llm engine: llama-server built in {time.monotonic() - started:.0f} s", flush=True)
        return binary


def install_server(python: str) -> str:
    """Make sure the cached llama-server for the pinned version exists; returns what it did."""
    version = pinned_version(extra_requirements())
    binary = server_binary(version)
    if binary.is_file():
        return f"llama-server {version} present at {binary}"
    if shutil.which("cmake") is None:
        raise EngineError("no cmake on PATH (Debian: apt-get install cmake g++)")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise EngineError("no C++ compiler on PATH (Debian: apt-get install g++ cmake)")
    build_server(python, version, binary)
    return f"llama-server {version} built at {binary}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--strict", action="store_true", help="a failure exits 1 (as CI=true)")
    args = parser.parse_args()
    strict = args.strict or os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
    if not strict and os.environ.get("INFERWAY_LLM_ENGINE", "") == "skip":
        print("llm engine: INFERWAY_LLM_ENGINE=skip, not installed; its tests skip")
        return 0
    failed = False
    for step, needed_by in (
        (install, "tests/integration/test_llm_engine.py"),
        (install_server, "tests/integration/test_llama_server.py"),
    ):
        try:
            print(f"llm engine: {step(args.python)}", flush=True)
        except (EngineError, OSError, tomllib.TOMLDecodeError) as exc:
            failed = True
            print(f"llm engine: not installed: {exc}")
            print(f"llm engine: {needed_by} " + ("fails in CI" if strict else "skips, saying so"))
    return 1 if failed and strict else 0


if __name__ == "__main__":
    sys.exit(main())
