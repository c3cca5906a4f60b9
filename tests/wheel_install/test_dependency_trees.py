"""Each distribution's dependency tree, as pip resolves it from the built wheels
(docs/install.md): every role gets its half and nothing of the other. ``inferway`` and
``inferway-gateway`` are checked on their real installs (test_install.py) instead."""

from __future__ import annotations

import zipfile
from collections.abc import Set
from pathlib import Path

import pytest

from tests.wheel_install.trees import CPU, ENVOY, GPU, assert_tree
from tests.wheel_install.venvs import dry_run

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(600)]


@pytest.mark.parametrize(
    ("requirement", "present", "absent"),
    [
        ("inferway-backend", CPU | {"inferway-core"}, ENVOY | {"onnxruntime-gpu"}),
        ("inferway-gpu", ENVOY | GPU | {"inferway-core"}, {"onnxruntime"}),
        ("inferway-core", {"grpcio", "protobuf"}, CPU | GPU | ENVOY | {"inferway"}),
        ("inferway-core[all]", ENVOY | CPU, {"onnxruntime-gpu", "inferway"}),
    ],
)
def test_each_distribution_pulls_its_role_and_nothing_of_another(
    dist: Path, requirement: str, present: Set[str], absent: Set[str]
) -> None:
    assert_tree(dry_run(requirement, dist), present, absent)


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(name).decode("utf-8")
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def test_the_meta_distributions_hold_only_a_pin_on_the_same_core(wheels: dict[str, Path]) -> None:
    """No code (so no file shared with inferway-core), one exact pin, and each extra the core's
    extra of its name: ``inferway-gpu[tensorrt]`` (not resolved here: TensorRT's CUDA wheels
    are gigabytes) adds only the core's tensorrt."""
    version = wheels["inferway-core"].name.split("-")[1]
    bases = {}
    for name, wheel in wheels.items():
        if name == "inferway-core":
            continue
        with zipfile.ZipFile(wheel) as archive:
            files = [n for n in archive.namelist() if ".dist-info/" not in n]
        assert files == [], f"{name} ships code: {files}"
        base, *extras = _requires(wheel)
        bases[name] = base
        for requirement in extras:
            pin, marker = requirement.split("; ")
            extra = marker.removeprefix("extra == ").strip("'\"")
            assert pin == f"inferway-core[{extra}]=={version}", (name, requirement)
    assert bases == {
        "inferway": f"inferway-core[backend,gateway]=={version}",
        "inferway-gateway": f"inferway-core[gateway]=={version}",
        "inferway-backend": f"inferway-core[backend]=={version}",
        "inferway-gpu": f"inferway-core[gateway,gpu]=={version}",
    }
    assert f"inferway-core[tensorrt]=={version}; extra == 'tensorrt'" in _requires(
        wheels["inferway-gpu"]
    )
