"""Image tests: slow (an engine to install and start, an image to build), so marked ``image`` and
run by .ci/run as their own step (``pytest -m image tests/image``), not by ``make test``'s
default selection. The engine and the image are made once per session; everything these tests
create carries the label :data:`LABEL` and is removed afterwards (also what an interrupted run
left), except the base image, kept in the engine's store for the next run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.image.engine import LABEL, ROOT, Engine, start_engine

_BUILD_TIMEOUT_S = 900


@dataclass(frozen=True)
class BuiltImage:
    """The CPU image these tests built, and what it took."""

    tag: str
    base: str
    base_s: float
    build_s: float
    size_bytes: int


def remove_leftovers(engine: Engine) -> None:
    """Containers, networks and images carrying :data:`LABEL`."""
    for listing, removal in (
        (["ps", "-aq"], ["rm", "-f"]),
        (["network", "ls", "-q"], ["network", "rm"]),
        (["images", "-q"], ["rmi", "-f"]),
    ):
        ids = engine.run(*listing, "--filter", f"label={LABEL}").stdout.split()
        if ids:
            engine.run(*removal, *sorted(set(ids)), check=False)


def pip_ca_bundle() -> Path | None:
    """The CA bundle this machine's pip trusts (``PIP_CERT``, else pip's configured ``cert``,
    else the system bundle): the build stage's pip needs it where a TLS-intercepting proxy
    stands between it and PyPI. Passed as a build secret, never copied into the image."""
    candidates = [os.environ.get("PIP_CERT", "")]
    configured = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.cert"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if configured.returncode == 0:
        candidates.append(configured.stdout.strip())
    candidates.append("/etc/ssl/certs/ca-certificates.crt")
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    started = start_engine(tmp_path_factory.mktemp("dockerd") / "dockerd.log")
    try:
        remove_leftovers(started)
        yield started
        remove_leftovers(started)
    finally:
        started.stop()


@pytest.fixture(scope="session")
def image(engine: Engine) -> Iterator[BuiltImage]:
    """The base from Debian's packages (made, or reused by its tag), then the CPU image built
    from it with BuildKit, as docs/kubernetes.md says."""
    began = time.monotonic()
    base = subprocess.run(
        [str(ROOT / "deploy" / "base" / "build-base.sh")],
        env={**os.environ, "DOCKER": engine.docker},
        capture_output=True,
        text=True,
        timeout=_BUILD_TIMEOUT_S,
        check=False,
    )
    assert base.returncode == 0, f"build-base.sh failed:\n{base.stdout}\n{base.stderr}"
    base_tag = base.stdout.split()[-1]
    base_s = time.monotonic() - began
    tag = f"inferway-test:{uuid.uuid4().hex[:12]}"
    argv = ["build", "-f", str(ROOT / "deploy" / "Dockerfile"), "-t", tag, "--label", LABEL]
    argv += ["--build-arg", f"PYTHON_IMAGE={base_tag}"]
    bundle = pip_ca_bundle()
    if bundle is not None:
        argv += ["--secret", f"id=pip-ca-bundle,src={bundle}"]
    began = time.monotonic()
    try:
        engine.run(*argv, str(ROOT), timeout=_BUILD_TIMEOUT_S, env={"DOCKER_BUILDKIT": "1"})
        build_s = time.monotonic() - began
        size = int(engine.run("image", "inspect", "--format", "{{.Size}}", tag).stdout)
        yield BuiltImage(tag, base_tag, base_s, build_s, size)
    finally:
        engine.run("rmi", "-f", tag, check=False)
        # BuildKit's cache speeds up a rerun of the same tree; kept, but bounded
        engine.run("builder", "prune", "-f", "--keep-storage", "3gb", check=False)
