"""Packaging tests: slow (fresh virtual environments, registry downloads), so marked
``packaging`` and run by .ci/run as their own step (``pytest -m packaging tests/wheel_install``),
not by ``make test``'s default selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from build_support.dists import build_all
from tests.wheel_install.venvs import ROOT


@pytest.fixture(scope="session")
def wheels() -> dict[str, Path]:
    """Every distribution's wheel (inferway-core and the meta-distributions), built once into
    one folder, by the command the docs give (``python -m build_support.dists``)."""
    return build_all(ROOT / "build" / "packaging-dist")


@pytest.fixture(scope="session")
def dist(wheels: dict[str, Path]) -> Path:
    """The folder holding them: the ``--find-links`` of every install."""
    (folder,) = {wheel.parent for wheel in wheels.values()}
    return folder
