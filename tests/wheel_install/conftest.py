"""Packaging tests: slow (fresh virtual environments, registry downloads), so marked
``packaging`` and run by .ci/run as their own step (``pytest -m packaging tests/wheel_install``),
not by ``make test``'s default selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.wheel_install.venvs import ROOT, build_wheel


@pytest.fixture(scope="session")
def wheel() -> Path:
    return build_wheel(ROOT / "build" / "packaging-wheel")
