"""The build's ``.pyi`` stubs of the generated protobuf modules (build_support/proto_stubs.py):
one beside every ``_pb2`` module, describing its real messages, importing the private Envoy
API copy, and read by mypy with the project's settings, so an Envoy or OIP proto is never
``Any`` (issue 30: mypy checks ``xds/translate/`` for real)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[2]
GENERATED = (ROOT / "inferway" / "_xds_protos", ROOT / "inferway" / "backends" / "protocol")
_PRIVATE_IMPORT = re.compile(
    r"^(?:from|import) (?:envoy|xds|udpa|validate|cel|opencensus|google\.api\.expr)\b",
    re.MULTILINE,
)


def _modules() -> list[Path]:
    return sorted(m for folder in GENERATED for m in folder.rglob("*_pb2.py"))


def test_every_generated_module_has_a_stub() -> None:
    modules = _modules()
    assert len(modules) > 100, "the generated modules are missing: reinstall (make)"
    missing = [str(m.relative_to(ROOT)) for m in modules if not m.with_suffix(".pyi").is_file()]
    assert not missing, missing
    orphans = [
        str(s.relative_to(ROOT))
        for folder in GENERATED
        for s in folder.rglob("*.pyi")
        if not s.with_suffix(".py").is_file()
    ]
    assert not orphans, orphans


def test_each_stub_declares_exactly_its_modules_messages_and_enums() -> None:
    wrong = {}
    for module_file in _modules():
        name = ".".join(module_file.relative_to(ROOT).with_suffix("").parts)
        descriptor = importlib.import_module(name).DESCRIPTOR
        real = set(descriptor.message_types_by_name) | set(descriptor.enum_types_by_name)
        tree = ast.parse(module_file.with_suffix(".pyi").read_text(encoding="utf-8"))
        stub = {
            node.name
            for node in tree.body
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
        }
        if stub != real:
            wrong[name] = sorted(stub ^ real)
    assert not wrong, wrong


def test_stubs_import_the_private_copy_never_the_top_level_packages() -> None:
    leaking = [
        str(stub.relative_to(ROOT))
        for stub in GENERATED[0].rglob("*.pyi")
        if _PRIVATE_IMPORT.search(stub.read_text(encoding="utf-8"))
    ]
    assert not leaking, leaking
    stub = GENERATED[0] / "envoy" / "config" / "cluster" / "v3" / "cluster_pb2.pyi"
    assert "from inferway._xds_protos.envoy.config.core.v3 import " in stub.read_text("utf-8")


def test_mypy_checks_proto_fields_with_the_project_settings(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2\n"
        "from inferway.backends.protocol import pb2\n"
        "cluster = cluster_pb2.Cluster(name=3)\n"
        'cluster.HasField("no_such_field")\n'
        'pb2.ModelInferRequest(model_nam="m")\n'
        "cluster.connect_timeout.seconds = 1\n",
        encoding="utf-8",
    )
    config = ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "c")]
    out, err, code = api.run([*config, "--no-error-summary", str(probe)])
    assert code == 1, (out, err)
    errors = [line for line in out.splitlines() if ": error: " in line]
    assert [line.split(":")[1] for line in errors] == ["3", "4", "5"], out
    assert 'Argument "name" to "Cluster" has incompatible type "int"' in errors[0]
    assert '"HasField" of "Cluster"' in errors[1]
    assert 'Unexpected keyword argument "model_nam" for "ModelInferRequest"' in errors[2]
