"""Wheel build hook (also run by editable installs): generate the git-ignored modules.

``build_support/`` writes ``inferway/backends/protocol/_generated`` (the OIP gRPC code, with
the pinned grpcio-tools) and ``inferway/_xds_protos`` (a private copy of the Envoy API modules
of the pinned xds-protos, see build_support/xds_protos_copy.py), and ``.pyi`` stubs beside
both (mypy-protobuf, build_support/proto_stubs.py). These tools are build requirements only;
inferway's runtime dependencies are not installed in the build environment.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

_GENERATE = Path(__file__).parent / "build_support" / "generate.py"


class GenerateBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        spec = importlib.util.spec_from_file_location("_inferway_build_generate", _GENERATE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        for folder in module.generate(Path(self.root)):
            # git-ignored files are left out of a wheel unless named as artifacts
            build_data["artifacts"].append(folder.as_posix() + "/")
