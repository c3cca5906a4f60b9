"""The Open Inference Protocol's gRPC messages, compiled from ``grpc_predict_v2.proto``.

The generated modules are build output (git-ignored), written by the wheel build and by
editable installs (``hatch_build.py`` -> ``build_support/oip_protos.py``); an installed
package never compiles or writes into itself. Their messages live in a private descriptor
pool, so tritonclient's or kserve's copy of the same protocol can be imported beside them.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["pb2", "pb2_grpc"]


def _load() -> tuple[ModuleType, ModuleType]:
    try:
        from ._generated import grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc
    except ModuleNotFoundError as exc:
        raise ImportError(
            "inferway's generated gRPC modules are missing (inferway/backends/protocol/"
            "_generated): they are built by the package build; in a source checkout run "
            "`python -m build_support` or reinstall with `pip install -e .`"
        ) from exc
    return grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc


pb2, pb2_grpc = _load()
