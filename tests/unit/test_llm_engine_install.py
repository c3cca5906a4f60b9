"""scripts/build_llm_engine.py's pure parts: the one pin, the cache key, and the promise that
no other install compiles llama.cpp (the llm-engine extra stays out of every other extra)."""

from __future__ import annotations

import importlib.util
import platform
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_llm_engine", ROOT / "scripts" / "build_llm_engine.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_extra_pins_one_exact_version() -> None:
    script = _script()
    requirements = script.extra_requirements()
    assert script.pinned_version(requirements).count(".") == 2
    assert any(r.startswith("llama-cpp-python[server]==") for r in requirements)


def test_no_other_extra_pulls_the_engine_in() -> None:
    """`pip install -e '.[dev]'` and the product's extras never compile llama.cpp."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"dependencies": extras["dependencies"], **extras["optional-dependencies"]}
    for name, requirements in groups.items():
        if name == "llm-engine":
            continue
        for requirement in requirements:
            assert "llama-cpp-python" not in requirement, (name, requirement)
            assert "llm-engine" not in requirement, (name, requirement)


def test_a_pin_is_required() -> None:
    script = _script()
    with pytest.raises(script.EngineError, match="must pin"):
        script.pinned_version(["llama-cpp-python[server]>=0.3", "gguf>=0.17"])
    assert script.pinned_version(["llama-cpp-python == 0.3.36"]) == "0.3.36"


def test_the_cache_key_names_version_machine_and_build_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = _script()
    monkeypatch.setenv("INFERWAY_CACHE", str(tmp_path))
    first = script.cache_dir("0.3.36")
    assert first.parent == tmp_path / "wheels"
    assert first.name.startswith("llama-cpp-python-0.3.36-")
    monkeypatch.setattr(script, "CMAKE_ARGS", script.CMAKE_ARGS + " -DGGML_AVX2=ON")
    assert script.cache_dir("0.3.36") != first


def test_llama_servers_path_names_version_machine_and_its_own_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = _script()
    monkeypatch.setenv("INFERWAY_CACHE", str(tmp_path))
    first = script.server_binary("0.3.36")
    assert first.parent == tmp_path / "bin"
    assert first.name.startswith(f"llama-server-0.3.36-{platform.machine()}-")
    assert script.server_binary("0.3.37") != first
    monkeypatch.setattr(script, "CMAKE_ARGS", script.CMAKE_ARGS + " -DGGML_AVX2=ON")
    assert script.server_binary("0.3.36") == first  # the wheel's flags are not the server's
    monkeypatch.setattr(script, "SERVER_CMAKE_FLAGS", (*script.SERVER_CMAKE_FLAGS, "-DX=ON"))
    assert script.server_binary("0.3.36") != first
