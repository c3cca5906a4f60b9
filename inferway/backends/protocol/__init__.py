"""The Open Inference Protocol's gRPC messages, compiled from ``grpc_predict_v2.proto``.

The generated modules are build output (git-ignored), written by the wheel build and by
editable installs (``hatch_build.py`` -> ``build_support/oip_protos.py``); an installed
package never compiles or writes into itself. Their messages live in a private descriptor
pool, so tritonclient's or kserve's copy of the same protocol can be imported beside them.
The same build writes ``.pyi`` stubs beside them (``build_support/proto_stubs.py``): imported
by name, not through a ``ModuleType``, ``pb2``'s messages are typed for mypy.
"""

from __future__ import annotations

__all__ = ["pb2", "pb2_grpc"]

try:
    from ._generated import grpc_predict_v2_pb2 as pb2
    from ._generated import grpc_predict_v2_pb2_grpc as pb2_grpc
except ModuleNotFoundError as exc:
    raise ImportError(
        "inferway's generated gRPC modules are missing (inferway/backends/protocol/"
        "_generated): they are built by the package build; in a source checkout run "
        "`python -m build_support` or reinstall with `pip install -e .`"
    ) from exc
