"""Write mypy-protobuf ``.pyi`` stubs beside generated ``_pb2`` modules (the private Envoy API
copy ``inferway/_xds_protos/``, the OIP modules ``inferway/backends/protocol/_generated/``).

Why: a generated ``_pb2`` module creates its message classes at import time
(``_builder.BuildTopDescriptorsAndMessages``), so a type checker finds no message, field or
enum in it and every proto would be ``Any``. mypy-protobuf (a pinned build requirement, never
a runtime one) writes stubs that also type ``HasField``/``ClearField``/``WhichOneof`` with the
field names as literals and each enum's ``ValueType``. Its output is a function of the
descriptors and its version only.

No ``.proto`` source is needed: each ``_pb2`` module carries its file's serialized
``FileDescriptorProto`` (the ``AddSerializedFile(b'...')`` literal; xds-protos ships no
sources). The descriptors go to grpcio-tools' protoc as one ``FileDescriptorSet``
(``--descriptor_set_in``, the well-known types from its bundled ``google/protobuf/*.proto``),
which checks them and writes them back with their imports in dependency order: the
``CodeGeneratorRequest`` that mypy-protobuf, run as a protoc plugin (stdin -> stdout) in a
child of this interpreter, answers.

Each descriptor of a folder is renamed after the module that holds it
(``inferway/_xds_protos/envoy/.../cluster.proto`` for ``.../cluster_pb2.py``), so the stubs
import their dependencies from where the modules really are, while the dependencies left to
runtime distributions (``google.api``, ``google.rpc``, ``opentelemetry.proto``, protobuf's
own) keep their names, as the modules import them. Only descriptor *file* names change, and
only in the stubs' input: message names, and so type URLs, are untouched.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # protobuf is a build requirement (grpcio-tools'), imported when generating
    from google.protobuf.descriptor_pb2 import FileDescriptorProto

__all__ = ["distribution_modules", "write_stubs"]

_SERIALIZED = re.compile(r"\.AddSerializedFile\((b'.*')\)\s*$", re.MULTILINE)
_PLUGIN = "from mypy_protobuf.main import main; main()"


def _serialized(module: Path) -> bytes | None:
    """The ``FileDescriptorProto`` a generated module registers (None: not a ``_pb2`` one)."""
    found = _SERIALIZED.findall(module.read_text(encoding="utf-8"))
    if len(found) > 1:
        raise RuntimeError(f"{module}: {len(found)} serialized descriptors, expected one")
    if not found:
        return None
    literal = ast.literal_eval(found[0])
    if not isinstance(literal, bytes):
        raise RuntimeError(f"{module}: the serialized descriptor is not a bytes literal")
    return literal


def distribution_modules(name: str) -> Iterator[Path]:
    """Every ``_pb2.py`` an installed distribution holds (its RECORD), as dependency sources."""
    dist = importlib.metadata.distribution(name)
    for entry in dist.files or ():
        if entry.name.endswith("_pb2.py"):
            yield Path(str(dist.locate_file(entry)))


def _descriptors(modules: Iterable[Path]) -> dict[Path, FileDescriptorProto]:
    from google.protobuf import descriptor_pb2

    found = {}
    for module in modules:
        data = _serialized(module)
        if data is not None:
            found[module] = descriptor_pb2.FileDescriptorProto.FromString(data)
    return found


def _protoc_closure(
    pool: Iterable[FileDescriptorProto], names: list[str], tmp: Path
) -> list[FileDescriptorProto]:
    """``names`` and everything they import, dependencies first, as protoc resolved them."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    given, closure = tmp / "given.pb", tmp / "closure.pb"
    pool_set = descriptor_pb2.FileDescriptorSet(file=sorted(pool, key=lambda f: f.name))
    given.write_bytes(pool_set.SerializeToString(deterministic=True))
    include = Path(protoc.__file__).resolve().parent / "_proto"  # the well-known types
    args = ["grpc_tools.protoc", f"-I{include}", f"--descriptor_set_in={given}"]
    code = protoc.main([*args, f"--descriptor_set_out={closure}", "--include_imports", *names])
    if code != 0:
        raise RuntimeError(f"grpc_tools.protoc failed (exit {code}) resolving {names[:3]}...")
    return list(descriptor_pb2.FileDescriptorSet.FromString(closure.read_bytes()).file)


def _mypy_protobuf(files: list[FileDescriptorProto], names: list[str]) -> dict[str, str]:
    from google.protobuf.compiler import plugin_pb2

    request = plugin_pb2.CodeGeneratorRequest(
        file_to_generate=names, parameter="quiet", proto_file=files
    )
    run = subprocess.run(
        [sys.executable, "-c", _PLUGIN],
        input=request.SerializeToString(),
        capture_output=True,
        check=False,
    )
    if run.returncode != 0:
        stderr = run.stderr.decode(errors="replace").strip()
        raise RuntimeError(f"mypy-protobuf failed (exit {run.returncode}): {stderr}")
    response = plugin_pb2.CodeGeneratorResponse.FromString(run.stdout)
    if response.error:
        raise RuntimeError(f"mypy-protobuf: {response.error}")
    return {file.name: file.content for file in response.file}


def write_stubs(root: Path, folder: Path, dependencies: Iterable[Path] = ()) -> list[Path]:
    """Write ``<module>.pyi`` beside every ``_pb2.py`` under ``folder`` (inside ``root``, the
    folder that holds the ``inferway`` package); ``dependencies`` are ``_pb2.py`` modules
    elsewhere whose descriptors those import (the well-known types need none). Returns the
    stubs written."""
    own = _descriptors(sorted(folder.rglob("*_pb2.py")))
    if not own:
        raise RuntimeError(f"no generated module with a serialized descriptor under {folder}")
    renamed = {
        descriptor.name: module.relative_to(root).as_posix().removesuffix("_pb2.py") + ".proto"
        for module, descriptor in own.items()
    }
    pool = {d.name: d for d in _descriptors(dependencies).values()}
    pool.update((d.name, d) for d in own.values())
    for descriptor in pool.values():
        descriptor.name = renamed.get(descriptor.name, descriptor.name)
        imports = [renamed.get(name, name) for name in descriptor.dependency]
        del descriptor.dependency[:]
        descriptor.dependency.extend(imports)
    names = sorted(renamed.values())
    with tempfile.TemporaryDirectory(prefix="inferway-stubs-") as tmp:
        stubs = _mypy_protobuf(_protoc_closure(pool.values(), names, Path(tmp)), names)
    written = []
    for name, content in sorted(stubs.items()):
        stub = root / name
        if not stub.with_suffix(".py").is_file():
            raise RuntimeError(f"mypy-protobuf wrote {name}, which stubs no generated module")
        stub.write_text(content, encoding="utf-8")
        written.append(stub)
    if len(written) != len(own):
        raise RuntimeError(f"{len(written)} stubs for the {len(own)} modules under {folder}")
    return written
