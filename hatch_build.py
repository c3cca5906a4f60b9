"""Wheel build hook: compile the Open Inference Protocol proto into the package.

An installed inferway then never writes into its own folder at import time (site-packages
may be read-only). It loads ``inferway/backends/protocol/compile.py`` by path, because
inferway's runtime dependencies are not installed in the build environment.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

_COMPILER = Path(__file__).parent / "inferway" / "backends" / "protocol" / "compile.py"


class ProtoBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        spec = importlib.util.spec_from_file_location("_inferway_proto_compile", _COMPILER)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        generated = module.build_generated(force=True)
        # git-ignored files are left out of a wheel unless named as artifacts
        build_data["artifacts"].append(generated.relative_to(Path(self.root)).as_posix() + "/")
