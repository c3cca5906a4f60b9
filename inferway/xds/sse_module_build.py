"""Builds inferway's SSE reader for Envoy (``sse_module/``: a dynamic module, a C shared
object with Envoy 1.40's module ABI) with the host's C compiler, once per source version.

Envoy loads it as ``lib<name>.so`` from ``ENVOY_DYNAMIC_MODULES_SEARCH_PATH``; inferway sets
that variable for every Envoy it starts and says so in the Envoy's node metadata
(:data:`MODULES_METADATA_KEY`), so the control plane gives only those Envoys the native filter
(``xds/node_groups.py``); every other Envoy reads streams with the Lua filter. The object is
cached under ``$XDG_CACHE_HOME/inferway/envoy-modules/<sources hash>-<compiler hash>/``
(``INFERWAY_ENVOY_MODULES_DIR`` overrides the root); concurrent builds each write a
temporary file and rename it, so a reader never sees half an object. Each use marks its
folder (its modification time); a new build removes the other builds no inferway has used for
:data:`KEEP_UNUSED_S` (an upgrade's new sources leave the old object behind). Without a compiler
(``CC``, else ``cc``, ``gcc``, ``clang`` on ``PATH``) a build of the same sources already in
the root is used (the container image builds one in its build stage and has no compiler);
with neither, :func:`build_sse_module` raises :class:`ModuleUnavailable` with the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path

__all__ = [
    "KEEP_UNUSED_S",
    "MODULES_METADATA_KEY",
    "SEARCH_PATH_ENV",
    "SSE_MODULE",
    "ModuleUnavailable",
    "build_sse_module",
    "c_compiler",
    "module_sources",
]

SSE_MODULE = "inferway_sse"
"""The module's name: Envoy loads ``libinferway_sse.so``."""
SEARCH_PATH_ENV = "ENVOY_DYNAMIC_MODULES_SEARCH_PATH"
MODULES_METADATA_KEY = "INFERWAY_ENVOY_MODULES"
"""Node metadata: the inferway modules an Envoy can load (a list, or a comma-separated
string)."""
CACHE_ENV = "INFERWAY_ENVOY_MODULES_DIR"
_SOURCES = ("sse_core.h", "sse_core.c", "envoy_abi.h", "sse_filter.c")
_COMPILED = ("sse_core.c", "sse_filter.c")
_FLAGS = ("-O2", "-std=c11", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall")
_TIMEOUT_S = 120.0
KEEP_UNUSED_S = 30 * 24 * 3600.0
"""A build no inferway has used for this long is removed when another is built."""
_BUILD_FOLDER = re.compile(r"[0-9a-f]{16}-[0-9a-f]{8}")


class ModuleUnavailable(RuntimeError):
    """The module cannot be built here; the message says why."""


def module_sources() -> Path:
    """The folder of the module's C sources (package data)."""
    return Path(str(resources.files("inferway.xds").joinpath("sse_module")))


def c_compiler() -> str | None:
    """``CC`` when set (a path or a name on ``PATH``), else the first of cc, gcc, clang."""
    named = os.environ.get("CC", "").strip()
    for name in [named] if named else ["cc", "gcc", "clang"]:
        found = shutil.which(name)
        if found:
            return found
    return None


def _cache_root() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferway" / "envoy-modules"


def _sources_digest(sources: Path) -> str:
    digest = hashlib.sha256(" ".join(_FLAGS).encode())
    for name in _SOURCES:
        digest.update(name.encode() + b"\0" + (sources / name).read_bytes())
    return digest.hexdigest()[:16]


def build_sse_module(cache: Path | None = None) -> Path:
    """The folder holding ``libinferway_sse.so`` (Envoy's module search path), built now
    unless a build of the same sources by the same compiler is cached; without a compiler,
    a build of the same sources by any compiler."""
    root = cache or _cache_root()
    sources = module_sources()
    built = _sources_digest(sources)
    compiler = c_compiler()
    if compiler is None:
        found = sorted(
            root.glob(f"{built}-*/lib{SSE_MODULE}.so"), key=lambda p: p.stat().st_mtime_ns
        )
        if found:
            return _used(found[-1].parent)
        raise ModuleUnavailable(
            f"no C compiler found (set CC, or install cc, gcc or clang) and no build of "
            f"these sources under {root}"
        )
    folder = root / f"{built}-{hashlib.sha256(compiler.encode()).hexdigest()[:8]}"
    target = folder / f"lib{SSE_MODULE}.so"
    if target.is_file():
        return _used(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ModuleUnavailable(f"cannot create {folder}: {error.strerror}") from error
    handle, partial = tempfile.mkstemp(dir=folder, prefix=".building-", suffix=".so")
    os.close(handle)
    command = [compiler, *_FLAGS, "-o", partial, *(str(sources / n) for n in _COMPILED)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise ModuleUnavailable(f"{Path(compiler).name} failed ({done.returncode}): {last}")
        os.chmod(partial, 0o755)  # mkstemp made it 0600: others load it too (the image)
        os.replace(partial, target)
    except subprocess.TimeoutExpired as error:
        raise ModuleUnavailable(f"{compiler} ran over {_TIMEOUT_S:.0f} s") from error
    except OSError as error:
        raise ModuleUnavailable(f"building {target} failed: {error}") from error
    finally:
        Path(partial).unlink(missing_ok=True)
    _remove_unused(root, keep=folder)
    return folder


def _used(folder: Path) -> Path:
    """Mark ``folder`` as used now (its modification time; not the object's, which says when
    it was built). A cache nobody may write (the image's) stays as it is."""
    with contextlib.suppress(OSError):
        os.utime(folder)
    return folder


def _remove_unused(root: Path, *, keep: Path) -> None:
    """Remove the builds under ``root`` other than ``keep`` that nobody used for
    ``KEEP_UNUSED_S``; only folders named as builds are touched, and a failure leaves the rest
    (an Envoy that loaded an object keeps its mapping when the file goes)."""
    oldest = time.time() - KEEP_UNUSED_S
    with contextlib.suppress(OSError):
        for child in root.iterdir():
            if child == keep or not _BUILD_FOLDER.fullmatch(child.name):
                continue
            with contextlib.suppress(OSError):
                if child.is_dir() and child.stat().st_mtime < oldest:
                    shutil.rmtree(child, ignore_errors=True)
