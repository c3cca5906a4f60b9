"""The layering rule of docs/architecture.md, enforced on every module's imports.

Every ``import`` under ``inferway/`` is read from the source (module level, inside functions and
under ``TYPE_CHECKING`` alike: a lazy import is still a dependency), so an upward import cannot
hide in a function body, and no two modules may import each other, directly or round a loop.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "inferway"

BASE = {"pki", "parent_death", "free_ports", "exit_codes", "background", "_xds_protos"}
"""Below everything: certificates and keys, process helpers (parent death, free ports, exit
codes, background tasks), the generated Envoy API modules. They import nothing of inferway
but themselves."""

_BELOW_GATEWAY = BASE | {"observability", "policies", "state", "resolve", "xds", "controllers"}

MAY_IMPORT: dict[str, set[str]] = {
    "pki": BASE,
    "parent_death": BASE,
    "free_ports": BASE,
    "exit_codes": BASE,
    "background": BASE,
    "_xds_protos": BASE,
    "observability": BASE | {"observability"},
    "policies": BASE | {"observability", "policies"},
    "state": BASE | {"observability", "policies", "state"},
    "resolve": BASE | {"observability", "policies", "state", "resolve"},
    "xds": BASE | {"observability", "policies", "state", "resolve", "xds"},
    "controllers": BASE | {"controllers"},
    "console": BASE | {"observability", "policies", "console"},
    "backends": BASE | {"observability", "backends"},
    "gateway": _BELOW_GATEWAY | {"console", "backends", "gateway"},
    "tools": _BELOW_GATEWAY | {"console", "backends", "gateway", "tools"},
    "cli": _BELOW_GATEWAY | {"console", "backends", "gateway", "tools", "cli"},
    "devtools": _BELOW_GATEWAY | {"console", "backends", "gateway", "tools", "cli", "devtools"},
}
"""Each layer (top-level part of ``inferway``) -> the layers it may import. ``controllers``
are pure decision cores: the base layer only. ``cli`` is the top: nothing imports it (but
devtools, which nothing in the product imports)."""

DEVTOOLS_ENTRIES = {
    ("inferway.cli.demo", "demo", "inferway.devtools.demo"),
    ("inferway.cli.demo", "_llm_scene", "inferway.devtools.demo_llm"),
}
"""The only product imports of devtools: the gateway CLI's ``demo`` command imports the demo
runners (the main scene, and ``--llm``'s) lazily, inside its functions, so running the
product never loads devtools."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


GENERATED = (PACKAGE / "_xds_protos", PACKAGE / "backends" / "protocol" / "_generated")
"""Build output (git-ignored), not inferway's code: its imports are not checked."""


def _sources() -> list[Path]:
    return sorted(
        p for p in PACKAGE.rglob("*.py") if not any(p.is_relative_to(g) for g in GENERATED)
    )


_MODULES = {_module_name(p) for p in _sources()}


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """Parsed once per file: every test below reads the same tree."""
    return _parse_imports(path)


@functools.cache
def _parse_imports(path: Path) -> list[tuple[str, str | None]]:
    return list(_walk_imports(path))


def _walk_imports(path: Path) -> Iterator[tuple[str, str | None]]:
    """(imported inferway module, enclosing function name or None) for every import."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))

    def visit(node: ast.AST, function: str | None) -> Iterator[tuple[str, str | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(child, function or child.name)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "inferway":
                        yield alias.name, function
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".")
                    base = base[: len(base) - child.level + (1 if is_package else 0)]
                    target = ".".join([*base, child.module] if child.module else base)
                else:
                    target = child.module or ""
                if target.split(".")[0] == "inferway":
                    # "from inferway.x import y" names the submodule x.y when there is one
                    for alias in child.names:
                        submodule = f"{target}.{alias.name}"
                        yield (submodule if submodule in _MODULES else target), function
            yield from visit(child, function)

    yield from visit(tree, None)


@functools.cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _sources()}


def _layer(module: str) -> str:
    return module.split(".")[1]


def test_every_layer_is_known() -> None:
    layers = {_layer(name) for name in _modules() if name != "inferway"}
    assert layers <= set(MAY_IMPORT), f"add to the layering rule: {layers - set(MAY_IMPORT)}"


@pytest.mark.parametrize("module", sorted(_modules()), ids=str)
def test_no_module_imports_a_layer_it_may_not(module: str) -> None:
    if module == "inferway":
        return
    layer = _layer(module)
    wrong = []
    for target, function in _imports(_modules()[module]):
        if target == "inferway":
            wrong.append(f"{target} (import the module, not the package root)")
            continue
        other = _layer(target)
        if other in MAY_IMPORT[layer]:
            continue
        if (module, function, target) in DEVTOOLS_ENTRIES:
            continue
        wrong.append(f"{target}" + (f" (inside {function}())" if function else ""))
    assert not wrong, f"{module} ({layer}) imports above or across its layer: {wrong}"


def test_the_devtools_exception_is_a_lazy_import_in_the_demo_command() -> None:
    for module, function, target in sorted(DEVTOOLS_ENTRIES):
        found = {(t, f) for t, f in _imports(_modules()[module]) if _layer(t) == "devtools"}
        allowed = {(t, f) for m, f, t in DEVTOOLS_ENTRIES if m == module}
        assert found == allowed, f"{module} imports devtools only lazily, as listed: {found}"
        assert (target, function) in found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for target, _ in _imports(path):
            # "from inferway.x import y" may name a submodule y or a name in x
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_import_cycles_among_modules() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


_COMPOSITION_ROOT = (
    "inferway.gateway.runtime",
    "inferway.gateway.runtime_admin",
    "inferway.gateway.foreground",
    "inferway.gateway.control_plane_main",
    "inferway.gateway.control_plane_process",
    "inferway.gateway.keeper",
)

_CACHE_PARTS = (
    "cache",
    "config_watcher",
    "hooks",
    "node_records",
    "records",
    "rollback",
    "snapshot_store",
    "stats",
    "watches",
)
"""The snapshot cache and its parts (``xds/cache.py`` composes them)."""

INSIDE_RULES: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (
        ("inferway.controllers.rollout",),
        ("inferway.controllers.autoscale",),
        "the two decision cores stand apart",
    ),
    (
        ("inferway.controllers.autoscale",),
        ("inferway.controllers.rollout",),
        "the two decision cores stand apart",
    ),
    (
        ("inferway.gateway.picker.core",),
        ("inferway.gateway", "inferway.xds", "inferway.policies", "inferway.resolve"),
        "the picker's core is pure: the server, the benchmark and the tests drive it",
    ),
    (
        ("inferway.gateway.control_plane",),
        ("inferway.gateway",),
        "the control plane is the gateway's core: sources, watchers and drivers plug into it",
    ),
    (
        ("inferway.gateway",),
        _COMPOSITION_ROOT,
        "only the composition root (and the processes that run it) imports the composition root",
    ),
    (
        (
            "inferway.gateway.actuators",
            "inferway.gateway.rollouts",
            "inferway.gateway.features",
            "inferway.gateway.llm",
            "inferway.gateway.autoscaling",
            "inferway.gateway.autoscale_inputs",
            "inferway.gateway.autoscale_policy",
        ),
        ("inferway.gateway.admin", "inferway.gateway.runtime_admin", "inferway.gateway.profile_"),
        "drivers and actuators never reach into the admin API: it reads them",
    ),
    (
        tuple(
            f"inferway.gateway.llm.{m}"
            for m in ("sse", "accounting", "limits", "client_key", "request", "metrics")
        ),
        (
            "inferway.gateway.control_plane",
            "inferway.gateway.llm.processor",
            "inferway.gateway.llm.server",
            "grpc",
        ),
        "the LLM gateway's pure parts (SSE, tokens, limits) know nothing of gRPC or the gateway",
    ),
    (
        ("inferway.xds.translate",),
        tuple(f"inferway.xds.{m}" for m in (*_CACHE_PARTS, "server", "stream", "sotw", "delta")),
        "translation is pure: it knows resources, never the cache or the servers",
    ),
    (
        ("inferway.xds.snapshot", "inferway.xds.resources", "inferway.xds.type_urls"),
        tuple(f"inferway.xds.{m}" for m in ("cache", "server", "stream", "sotw", "delta")),
        "a snapshot is a value: it knows nothing of who serves it",
    ),
    (
        tuple(f"inferway.xds.{m}" for m in _CACHE_PARTS),
        tuple(f"inferway.xds.{m}" for m in ("server", "stream", "sotw", "delta")),
        "the cache answers watches; the protocol sits on top of it (go-control-plane's split)",
    ),
    (
        ("inferway.xds.stream", "inferway.xds.server"),
        ("inferway.xds.cache",),
        "streams see the cache only as a ConfigWatcher (xds/config_watcher.py)",
    ),
    (
        ("inferway.backends.runners", "inferway.backends.batching"),
        tuple(
            f"inferway.backends.{m}"
            for m in ("protocol", "app", "workers", "jobs", "serving", "pipelines")
        ),
        "runners and the batcher never know the front ends that feed them",
    ),
    (
        ("inferway.tools.verify",),
        ("inferway.tools.cost", "inferway.tools.optimize"),
        "the tools stand apart",
    ),
    (
        ("inferway.tools.cost",),
        ("inferway.tools.verify", "inferway.tools.optimize"),
        "the tools stand apart",
    ),
    (
        ("inferway.tools.optimize",),
        ("inferway.tools.verify", "inferway.tools.cost"),
        "the tools stand apart",
    ),
)
"""Rules inside a layer: (modules under these prefixes, may not import under these, why).
A module under its rule's own prefix may import that prefix (a package imports itself), and
the modules a rule protects are not held to it."""


def _under(module: str, prefixes: tuple[str, ...]) -> str | None:
    for prefix in prefixes:
        if (
            module == prefix
            or module.startswith(prefix + ".")
            or (prefix.endswith("_") and module.startswith(prefix))
        ):
            return prefix
    return None


def _inside_violations(module: str, targets: list[str]) -> list[str]:
    wrong = []
    for sources, forbidden, why in INSIDE_RULES:
        own = _under(module, sources)
        if own is None:
            continue
        held = _under(module, forbidden)
        if held and not own.startswith(held + "."):
            continue  # the module is one of those the rule protects
        for target in targets:
            hit = _under(target, forbidden)
            if hit and not (_under(target, (own,)) and not hit.startswith(own + ".")):
                wrong.append(f"{target} ({why})")
    return wrong


@pytest.mark.parametrize("module", sorted(_modules()), ids=str)
def test_no_module_breaks_a_rule_inside_its_layer(module: str) -> None:
    targets = [t for t, _ in _imports(_modules()[module])]
    wrong = _inside_violations(module, targets)
    assert not wrong, f"{module} imports {wrong}"


def test_the_inside_rules_catch_an_upward_import() -> None:
    assert _inside_violations("inferway.xds.translate.routes", ["inferway.xds.cache"])
    assert _inside_violations("inferway.gateway.watcher", ["inferway.gateway.runtime"])
    assert _inside_violations("inferway.gateway.picker.core.picker", ["inferway.gateway.picker"])
    assert not _inside_violations(
        "inferway.gateway.picker.core.picker", ["inferway.gateway.picker.core.prefix"]
    )
    assert not _inside_violations("inferway.gateway.keeper", ["inferway.gateway.foreground"])
    assert not _inside_violations("inferway.xds.cache", ["inferway.xds.snapshot"])
    assert _inside_violations("inferway.xds.stream", ["inferway.xds.cache"])
    assert _inside_violations("inferway.xds.rollback", ["inferway.xds.stream"])
    assert _inside_violations("inferway.gateway.control_plane", ["inferway.gateway.sources"])
    assert _inside_violations(
        "inferway.controllers.rollout.state", ["inferway.controllers.autoscale"]
    )


ARCHITECTURE_DOC = PACKAGE.parent / "docs" / "architecture.md"
_TABLE = re.compile(r"<!-- packages:begin -->\n(.*?)<!-- packages:end -->", re.S)


def _may_import_text(layer: str) -> str:
    allowed = MAY_IMPORT[layer] - {layer}
    return ", ".join((["base"] if allowed & BASE else []) + sorted(allowed - BASE))


def _package_lines(layer: str) -> int:
    path = PACKAGE / layer
    files = [path.with_suffix(".py")] if not path.is_dir() else path.rglob("*.py")
    return sum(
        len(f.read_text(encoding="utf-8").splitlines())
        for f in files
        if not any(f.is_relative_to(g) for g in GENERATED)
    )


def _doc_rows() -> dict[str, list[str]]:
    found = _TABLE.search(ARCHITECTURE_DOC.read_text(encoding="utf-8"))
    assert found, f"{ARCHITECTURE_DOC}: the packages table's markers are missing"
    rows = {}
    for line in found.group(1).splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`").removesuffix("/").removesuffix(".py")] = cells
    return rows


def test_the_architecture_doc_lists_every_layer_its_size_and_what_it_may_import() -> None:
    rows = _doc_rows()
    if os.environ.get("INFERWAY_UPDATE_GOLDEN") == "1":
        text = ARCHITECTURE_DOC.read_text(encoding="utf-8")
        for cells in rows.values():
            layer = cells[0].strip("`").removesuffix("/").removesuffix(".py")
            if layer in MAY_IMPORT:
                old = "| " + " | ".join(cells) + " |"
                cells[2] = f"{_package_lines(layer):,}"
                cells[3] = _may_import_text(layer)
                text = text.replace(old, "| " + " | ".join(cells) + " |")
        ARCHITECTURE_DOC.write_text(text, encoding="utf-8")
        rows = _doc_rows()
    assert set(rows) == set(MAY_IMPORT), (
        f"docs/architecture.md's packages table: add {sorted(set(MAY_IMPORT) - set(rows))}, "
        f"remove {sorted(set(rows) - set(MAY_IMPORT))}"
    )
    for layer, cells in rows.items():
        assert cells[3] == _may_import_text(layer), f"{layer}: may import {_may_import_text(layer)}"
        documented, actual = int(cells[2].replace(",", "")), _package_lines(layer)
        assert abs(documented - actual) <= max(50, 0.15 * actual), (
            f"{layer} has {actual} lines, the doc says {documented}: `make golden` updates it"
        )
