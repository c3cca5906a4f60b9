"""Whether this install holds the backend's numerics (numpy, onnx, onnxruntime).

The gateway-only distribution (``inferway-gateway``) leaves them out on purpose
(docs/install.md), so ``inferway serve`` and ``inferway demo`` check first and name the
distribution that brings them, instead of failing on an import deep inside the backend.
``onnxruntime-gpu`` installs the same ``onnxruntime`` module, so the GPU install passes too.
"""

from __future__ import annotations

import importlib.util

__all__ = ["BACKEND_MODULES", "missing_backend_message", "missing_backend_modules"]

BACKEND_MODULES = ("numpy", "onnx", "onnxruntime")


def missing_backend_modules() -> list[str]:
    """The backend's modules this environment cannot import (found, not imported: cheap)."""
    return [name for name in BACKEND_MODULES if importlib.util.find_spec(name) is None]


def missing_backend_message(command: str, missing: list[str]) -> str:
    """What ``command`` says when ``missing`` is not empty."""
    verb = "is" if len(missing) == 1 else "are"
    return (
        f"inferway {command} needs the inference backend, and {', '.join(missing)} {verb} "
        "not installed here: `pip install inferway` (gateway and CPU backend), "
        "`pip install inferway-backend` (the backend alone) or `pip install inferway-gpu` "
        "(NVIDIA GPUs)"
    )
