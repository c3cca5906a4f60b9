"""What each ``inferway`` command imports, in a fresh process as the console script runs it.

The CLI imports a command's module only when that command runs (``cli/lazy.py``), so
``--version`` and ``--help`` load no heavy library, the admin-API commands operators poll
(``status``, ``scale status``, ``rollout status``) load none of the gateway but its typed
documents, and the backend's ``serve`` holds no module of the gateway's schema (``policies``),
its xDS layer or the gateway itself (issue 30: the backend must not depend on the gateway).
Timing is the benchmark's job (bench/cli_startup.py); these tests pin the import graph.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.envoy_process import free_port

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import atexit, json, sys

def dump():
    with open(OUT, "w", encoding="utf-8") as stream:
        json.dump(sorted(sys.modules), stream)

atexit.register(dump)
sys.argv = ["inferway", *ARGS]
from inferway.cli.entry import main
main()
"""

HEAVY = ("grpc", "onnxruntime", "numpy", "aiohttp", "httpx", "opentelemetry", "yaml", "uvloop")
"""Libraries no fast-path command may load: the servers' and the models' stacks."""


def _modules_after(tmp_path: Path, *args: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """Every module in ``sys.modules`` when ``inferway ARGS`` exits (its exit status aside)."""
    out = tmp_path / "modules.json"
    script = f"OUT = {str(out)!r}\nARGS = {list(args)!r}\n" + PROBE
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.exists(), f"inferway {' '.join(args)} did not exit cleanly: {done.stderr}"
    return set(json.loads(out.read_text(encoding="utf-8"))), done


def _top(modules: set[str], *packages: str) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in packages)


def _inferway_layers(modules: set[str], *layers: str) -> list[str]:
    """inferway's modules of these layers (``policies`` -> ``inferway.policies.*``)."""
    found = []
    for module in modules:
        parts = module.split(".")
        if parts[0] == "inferway" and len(parts) > 1 and parts[1] in layers:
            found.append(module)
    return sorted(found)


@pytest.mark.parametrize("args", [("--version",), ("--help",)], ids=" ".join)
def test_version_and_help_import_no_heavy_module_and_no_command(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    modules, done = _modules_after(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert _top(modules, *HEAVY, "pydantic", "rich") == []
    loaded = sorted(m for m in modules if m.startswith("inferway."))
    assert set(loaded) <= {
        "inferway.cli",
        "inferway.cli.conventions",
        "inferway.cli.entry",
        "inferway.cli.lazy",
        "inferway.cli.main",
        "inferway.observability",
        "inferway.observability.log_format",
    }, loaded


@pytest.mark.parametrize(
    "args",
    [("status",), ("status", "-o", "json"), ("scale", "status"), ("rollout", "status")],
    ids=" ".join,
)
def test_admin_api_commands_load_only_the_gateways_documents(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    # no gateway listens there: the command runs its whole client path and exits 3
    admin = f"http://127.0.0.1:{free_port()}"
    modules, done = _modules_after(tmp_path, *args, "--admin", admin)
    assert done.returncode == 3, done.stderr
    assert "cannot reach the inferway admin API" in done.stderr
    assert _top(modules, *HEAVY) == []
    assert _inferway_layers(modules, "policies", "xds", "resolve", "state", "backends") == []
    gateway = _inferway_layers(modules, "gateway")
    assert gateway == ["inferway.gateway", "inferway.gateway.admin_documents"]


def test_serve_import_graph_holds_no_policies_xds_or_gateway_module(tmp_path: Path) -> None:
    """``inferway serve --help`` builds the serve command from its module, as running it
    does: everything ``serve`` imports at module level is loaded."""
    modules, done = _modules_after(tmp_path, "serve", "--help")
    assert done.returncode == 0, done.stderr
    assert "inferway.cli.serve" in modules
    assert _inferway_layers(modules, "policies", "xds", "gateway") == []


def test_the_probe_sees_a_command_modules_imports(tmp_path: Path) -> None:
    """The checks above can fail: ``validate --help`` loads the policy model and the gateway's
    plan (not its composition root: validating starts nothing)."""
    modules, done = _modules_after(tmp_path, "validate", "--help")
    assert done.returncode == 0, done.stderr
    assert "inferway.policies.model" in modules
    assert "inferway.gateway.gateway_plan" in modules
    assert "inferway.gateway.runtime" not in modules
