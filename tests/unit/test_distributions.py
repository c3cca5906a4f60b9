"""The project's distributions (build_support/dists.py, docs/install.md): inferway-core holds
the code, the meta-distributions under packaging/ hold one pin on the same release. Checked
without building anything; tests/wheel_install builds and installs them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from build_support.dists import CORE, check, distributions
from inferway.cli.conventions import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[2]


def test_the_checkout_is_consistent() -> None:
    assert check(ROOT) == []


def test_the_code_distribution_and_the_four_meta_distributions() -> None:
    found = {d.name: d for d in distributions(ROOT)}
    assert set(found) == {CORE, "inferway", "inferway-gateway", "inferway-backend", "inferway-gpu"}
    assert len({d.version for d in found.values()}) == 1
    assert DISTRIBUTION == CORE, "--version reads the code distribution's metadata"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "packaging", tmp_path / "packaging")
    return tmp_path


def _edit(tree: Path, dist: str, old: str, new: str) -> Path:
    path = tree / "packaging" / dist / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def _line(path: Path, needle: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


def test_a_version_other_than_the_cores_is_reported_at_its_line(tree: Path) -> None:
    path = _edit(tree, "inferway-gateway", 'version = "0.1.0"', 'version = "0.2.0"')
    (error,) = check(tree)
    assert error.startswith(f"{path}:{_line(path, 'version =')}: inferway-gateway is version")


def test_a_pin_on_another_core_release_is_reported(tree: Path) -> None:
    path = _edit(tree, "inferway", "[gateway,backend]==0.1.0", "[gateway,backend]>=0.1")
    (error,) = check(tree)
    assert error.startswith(f"{path}:{_line(path, '>=0.1')}: 'inferway-core[gateway,backend]>=0.1'")


def test_gpu_beside_the_cpu_backend_is_refused(tree: Path) -> None:
    path = _edit(tree, "inferway-gpu", "[gateway,gpu]", "[gateway,gpu,backend]")
    (error,) = check(tree)
    assert error.startswith(f"{path}:{_line(path, 'dependencies')}: inferway-gpu would install")
    assert "onnxruntime-gpu and onnxruntime overwrite each other" in error


def test_an_inferway_gpu_extra_is_refused_as_it_would_co_install(tree: Path) -> None:
    """What docs/install.md says: ``inferway[gpu]`` would bring onnxruntime-gpu beside the CPU
    onnxruntime that ``inferway`` requires."""
    path = _edit(tree, "inferway", "\nhsm = [", '\ngpu = ["inferway-core[gpu]==0.1.0"]\nhsm = [')
    (error,) = check(tree)
    assert error.startswith(f"{path}:{_line(path, 'gpu =')}: inferway[gpu] would install")


def test_an_extra_forwards_the_cores_extra_of_its_name(tree: Path) -> None:
    path = _edit(tree, "inferway-gpu", "inferway-core[tensorrt]", "inferway-core[hsm]")
    (error,) = check(tree)
    where = f"{path}:{_line(path, 'tensorrt = [')}"
    assert error == (f"{where}: extra 'tensorrt' forwards inferway-core[tensorrt] and nothing else")


def test_an_unknown_core_extra_and_a_foreign_requirement_are_refused(tree: Path) -> None:
    _edit(tree, "inferway-backend", "[backend]", "[backnd]")
    _edit(tree, "inferway", 'dependencies = ["', 'dependencies = ["numpy", "')
    errors = check(tree)
    assert any("inferway-core has no extra ['backnd']" in e for e in errors), errors
    assert any("'numpy': a meta-distribution requires only" in e for e in errors), errors


def test_a_meta_distribution_that_ships_code_is_refused(tree: Path) -> None:
    path = _edit(tree, "inferway", "bypass-selection = true", 'packages = ["inferway"]')
    (error,) = check(tree)
    assert error.startswith(f"{path}: [tool.hatch.build.targets.wheel] needs bypass-selection")
