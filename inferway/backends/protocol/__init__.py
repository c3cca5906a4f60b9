"""The Open Inference Protocol's gRPC messages, compiled from ``grpc_predict_v2.proto``.

The generated modules are build output (git-ignored). The wheel build compiles them
(``hatch_build.py``), so an installed package never writes into itself; in a source tree they
are compiled on first import, and again whenever the ``.proto`` is newer than them.
"""

from __future__ import annotations

from types import ModuleType

from .compile import build_generated

__all__ = ["build_generated", "pb2", "pb2_grpc"]


def _load() -> tuple[ModuleType, ModuleType]:
    build_generated()
    from ._generated import grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc

    return grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc


pb2, pb2_grpc = _load()
