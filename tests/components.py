"""The real components the suite runs against (Prometheus, Redis, SoftHSM, etcd, ...) and the one
rule for a test that cannot have one here.

Outside CI such a test skips, saying what is missing and where it comes from. In CI
(``CI=true``) a component CI must have is a failure, never a skip, so CI cannot pass without
running the real thing. A component CI is not given (``kubectl``, which Debian does not ship
at the version the manifests need; network namespaces in a sandbox that forbids them) skips
with its stated reason everywhere.

CI must have every binary of ``scripts/test-deps.txt`` (``make test`` and ``.ci/run`` install
their Debian packages with ``scripts/install_test_deps.sh``) and the few that come with
``pip install -e '.[dev]'`` or any POSIX system (``CI_EXTRA``).

    path = require_binary("redis-server", "the jobs' Redis Streams store")  # test or fixture
    unavailable("network namespaces", "unshare: Operation not permitted")    # skip (CI: fail?)
    @pytest.mark.needs_binary("promtool", "checking the rules")  # require_binary at set-up

The ``needs_binary(name, why)`` marker (on a test, or a module's ``pytestmark``) is checked by
tests/conftest.py when each test is set up, with ``require_binary``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

__all__ = ["CI", "CI_COMPONENTS", "DEBIAN_PACKAGES", "require_binary", "unavailable"]

DEPS_LIST = Path(__file__).resolve().parents[1] / "scripts" / "test-deps.txt"


def _debian_packages(path: Path) -> dict[str, str]:
    """Binary -> Debian package, from the list the install script reads."""
    packages: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: expected 'binary package', got {line!r}")
        packages[fields[0]] = fields[1]
    return packages


DEBIAN_PACKAGES = _debian_packages(DEPS_LIST)

CI_EXTRA = {
    "python-pkcs11": "pip install -e '.[dev]' (the hsm extra)",
    "softhsm2 library": "Debian package softhsm2",
    "sh": "any POSIX system",
    "llama-cpp-python": "python scripts/build_llm_engine.py (make test runs it: the llm-engine "
    "extra, its wheel compiled once and cached)",
    "llama-server": "python scripts/build_llm_engine.py (make test runs it: llama.cpp's C++ "
    "server from the same sdist, compiled once and cached)",
}
"""Components CI must have that the Debian list does not install, and where each comes from."""

OTHER_SOURCES = {
    "kubectl": "Kubernetes' own apt repository; not one of scripts/test-deps.txt",
}
"""Where components that CI need not have come from, for the skip reason."""

CI_COMPONENTS = frozenset({*DEBIAN_PACKAGES, *CI_EXTRA})
"""Under ``CI=true`` a test missing one of these fails."""

CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(component: str, reason: str) -> NoReturn:
    """This test cannot run here: skip it with ``reason``; under ``CI=true`` fail it instead
    when ``component`` is one CI must have (``CI_COMPONENTS``)."""
    if CI and component in CI_COMPONENTS:
        pytest.fail(
            f"CI=true and {component} is missing: {reason}. CI must run this test against the "
            "real component (scripts/install_test_deps.sh installs the Debian ones)",
            pytrace=False,
        )
    # reported at the test's own line, as a skipif marker's skip is, not at this one
    raise pytest.skip.Exception(reason, _use_item_location=True)


def _source(name: str) -> str:
    if name in DEBIAN_PACKAGES:
        return f"Debian package {DEBIAN_PACKAGES[name]}; `make test` installs it when run as root"
    return CI_EXTRA.get(name) or OTHER_SOURCES.get(name) or "not a known component"


def require_binary(name: str, why: str) -> str:
    """The path of ``name`` on PATH, for a test that needs it for ``why``; missing, the test
    skips or (CI) fails through ``unavailable``."""
    path = shutil.which(name)
    if path is None:
        unavailable(name, f"{name} not found on PATH ({_source(name)}), needed for {why}")
    return path
