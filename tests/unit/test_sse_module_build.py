"""Building Envoy's native SSE reader (``inferway/xds/sse_module_build.py``) and handing it to
an Envoy inferway starts (``inferway/gateway/envoy_modules.py``): built once per source
version and compiler, found by Envoy through its module search path, announced in the node's
metadata; without a compiler, a clear reason and Envoy untouched."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from inferway.gateway.envoy_modules import provide_envoy_modules
from inferway.xds.sse_module_build import (
    KEEP_UNUSED_S,
    MODULES_METADATA_KEY,
    SEARCH_PATH_ENV,
    ModuleUnavailable,
    build_sse_module,
    c_compiler,
)
from tests.components import unavailable

HOOKS = [
    "envoy_dynamic_module_on_program_init",
    "envoy_dynamic_module_on_http_filter_config_new",
    "envoy_dynamic_module_on_http_filter_new",
    "envoy_dynamic_module_on_http_filter_response_body",
    "envoy_dynamic_module_on_http_filter_stream_complete",
    "envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark",
]


@pytest.fixture
def compiler() -> str:
    found = c_compiler()
    if found is None:
        unavailable("cc", "no C compiler (cc, gcc, clang or CC) to build the SSE reader")
    return found


def test_it_is_built_once_and_exports_envoys_hooks_only(compiler: str, tmp_path: Path) -> None:
    folder = build_sse_module(tmp_path)
    library = folder / "libinferway_sse.so"
    built = library.stat().st_mtime_ns
    assert build_sse_module(tmp_path) == folder and library.stat().st_mtime_ns == built
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in symbols.splitlines() if " T " in line}
    assert set(HOOKS) <= exported
    assert all(name.startswith("envoy_dynamic_module_on_") for name in exported), exported
    assert not list(folder.glob(".building-*"))
    assert library.stat().st_mode & 0o777 == 0o755  # loadable by other users (the image's)


def test_another_compiler_is_another_build(
    compiler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = build_sse_module(tmp_path)
    alias = tmp_path / "bin" / "mycc"
    alias.parent.mkdir()
    alias.symlink_to(compiler)
    monkeypatch.setenv("CC", str(alias))
    assert build_sse_module(tmp_path) != first


def _aged(folder: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(folder, (then, then))


def test_a_new_build_removes_builds_unused_for_a_month(compiler: str, tmp_path: Path) -> None:
    """An upgrade's new sources: the old object goes once nobody has used it for a month."""
    stale, recent, other = (
        tmp_path / "0123456789abcdef-01234567",
        tmp_path / "fedcba9876543210-76543210",
        tmp_path / "notes",
    )
    for folder in (stale, recent, other):
        folder.mkdir()
        (folder / "libinferway_sse.so").write_bytes(b"an older reader")
    _aged(stale, KEEP_UNUSED_S + 3600)
    _aged(recent, KEEP_UNUSED_S - 3600)
    _aged(other, KEEP_UNUSED_S + 3600)  # not named as a build: not ours to remove
    built = build_sse_module(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [built.name, recent.name, other.name]
    )


def test_using_a_build_keeps_it(
    compiler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = build_sse_module(tmp_path)
    library = (built / "libinferway_sse.so").stat().st_mtime_ns
    _aged(built, KEEP_UNUSED_S + 3600)
    assert build_sse_module(tmp_path) == built
    assert built.stat().st_mtime > time.time() - 60  # used now
    assert (built / "libinferway_sse.so").stat().st_mtime_ns == library  # not rebuilt
    _aged(built, KEEP_UNUSED_S + 3600)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))  # as in the image
    assert build_sse_module(tmp_path) == built
    assert built.stat().st_mtime > time.time() - 60


def test_without_a_compiler_it_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(ModuleUnavailable, match="no C compiler found"):
        build_sse_module(tmp_path)


def test_without_a_compiler_a_build_of_the_same_sources_is_used(
    compiler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in the container image: built in its build stage, used where no compiler is."""
    built = build_sse_module(tmp_path)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert build_sse_module(tmp_path) == built


def test_without_a_compiler_a_build_of_other_sources_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "0123456789abcdef-01234567"
    stale.mkdir()
    (stale / "libinferway_sse.so").write_bytes(b"an older reader")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(ModuleUnavailable, match="no build of these sources under"):
        build_sse_module(tmp_path)


def test_a_failing_compiler_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: fatal error: out of disk' >&2\nexit 4\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with pytest.raises(ModuleUnavailable, match=r"cc failed \(4\): cc: fatal error: out of disk"):
        build_sse_module(tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


def test_an_envoy_gets_the_search_path_and_says_it_can_load_the_module(
    compiler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERWAY_ENVOY_MODULES_DIR", str(tmp_path))
    bootstrap: dict[str, object] = {"node": {"id": "n", "metadata": {"OTHER": "x"}}}
    env = provide_envoy_modules(bootstrap)
    assert Path(env[SEARCH_PATH_ENV], "libinferway_sse.so").is_file()
    assert bootstrap["node"] == {
        "id": "n",
        "metadata": {"OTHER": "x", MODULES_METADATA_KEY: "inferway_sse"},
    }


def test_without_the_module_envoy_starts_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("INFERWAY_ENVOY_MODULES_DIR", str(tmp_path / "modules"))  # none built
    bootstrap: dict[str, object] = {"node": {"id": "n"}}
    with caplog.at_level("INFO"):
        assert provide_envoy_modules(bootstrap) == {}
    assert bootstrap == {"node": {"id": "n"}}
    assert "read by the Lua filter" in caplog.text
    assert os.environ.get(SEARCH_PATH_ENV) is None
