"""The gateway extra has no numpy, onnx or onnxruntime: the CLI's gateway commands must not
import them. The packaging tests prove it with a real ``[gateway]`` install (slow, CI only);
this catches a new top-level import in the normal suite, in seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import contextlib, io, json, sys
for name in ("numpy", "onnx", "onnxruntime"):
    sys.modules[name] = None  # any import of them raises ImportError
from inferway.cli.entry import main
results = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["inferway", *argv]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""
"""Runs each command line of its JSON argument in turn in one process with the numerics
blocked (one interpreter start, not one per command: an import of them fails whichever command
makes it); prints each one's exit code and output as JSON."""


def _inferway(*commands: list[str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(commands)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def test_validate_and_render_run_without_numpy_onnx_or_onnxruntime() -> None:
    examples = [
        str(ROOT / "examples" / name) for name in ("minimal.yaml", "rollout.yaml", "traffic.yaml")
    ]
    commands = [
        [command, "-f", policy] for policy in examples for command in ("validate", "render")
    ]
    results = _inferway(*commands)
    assert len(results) == len(commands)
    for command, result in zip(commands, results, strict=True):
        assert result["code"] == 0, (command, result["stderr"])
        if command[0] == "render":
            assert "clusters" in result["stdout"], (command, result["stdout"][-2000:])


def test_the_check_itself_catches_a_numpy_import() -> None:
    found = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace("from inferway.cli.entry", "import numpy\n#")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode != 0 and "numpy" in found.stderr
