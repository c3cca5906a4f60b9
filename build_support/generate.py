"""Every generation step of the build, in one call (used by hatch_build.py and ``-m``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["generate"]


def _load(name: str) -> ModuleType:
    """Load a sibling module by path: hatch_build.py runs without this folder on sys.path."""
    spec = importlib.util.spec_from_file_location(
        f"_inferway_build_{name}", Path(__file__).with_name(f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def generate(root: Path) -> list[Path]:
    """Write the git-ignored generated packages under ``root/inferway``; returns their folders
    (relative to ``root``), which the wheel must list as artifacts."""
    oip = _load("oip_protos").build_generated(root / "inferway" / "backends" / "protocol")
    xds = _load("xds_protos_copy").copy_xds_protos(root / "inferway" / "_xds_protos")
    # .pyi beside both, for mypy; the copy's modules import google.api, opentelemetry.proto...
    # whose descriptors xds-protos holds too
    stubs = _load("proto_stubs")
    stubs.write_stubs(root, oip)
    stubs.write_stubs(root, xds, stubs.distribution_modules("xds-protos"))
    return [p.relative_to(root) for p in (oip, xds)]
