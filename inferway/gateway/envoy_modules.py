"""inferway's modules for an Envoy this process starts (the native SSE reader,
``inferway/xds/sse_module_build.py``): built once per source version, found by Envoy through
its module search path, and announced in the node's metadata so the control plane gives
the native filter to this Envoy only. Without a C compiler (and no build of the same sources
in the module folder, as the container image carries) Envoy starts without them and reads LLM
streams with the Lua filter; that is said once, at INFO."""

from __future__ import annotations

import logging
from typing import Any

from inferway.xds.sse_module_build import (
    MODULES_METADATA_KEY,
    SEARCH_PATH_ENV,
    SSE_MODULE,
    ModuleUnavailable,
    build_sse_module,
)

__all__ = ["provide_envoy_modules"]

log = logging.getLogger(__name__)
_said: set[str] = set()


def provide_envoy_modules(bootstrap: dict[str, Any]) -> dict[str, str]:
    """The environment Envoy needs to load inferway's modules, with ``bootstrap``'s node
    metadata saying it can; ``{}`` (the bootstrap untouched) when they cannot be built."""
    try:
        folder = build_sse_module()
    except ModuleUnavailable as error:
        if str(error) not in _said:
            _said.add(str(error))
            log.info(
                "Envoy's native SSE reader is not available (%s): LLM streams are read by "
                "the Lua filter",
                error,
            )
        return {}
    metadata = bootstrap.setdefault("node", {}).setdefault("metadata", {})
    metadata[MODULES_METADATA_KEY] = SSE_MODULE
    return {SEARCH_PATH_ENV: str(folder)}
