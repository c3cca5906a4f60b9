"""What the server says about itself in OIP server metadata, on HTTP and gRPC alike."""

from __future__ import annotations

__all__ = ["EXTENSIONS", "SERVER_NAME", "SERVER_VERSION"]

SERVER_NAME = "inferway"
SERVER_VERSION = "0.1.0"
EXTENSIONS = (
    "binary_tensor_data",
    "model_repository_metadata",
    "model_repository",
    "model_configuration",
    "statistics",
)
"""Triton's names for the extensions served (its client tools look for them here)."""
