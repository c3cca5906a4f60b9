"""The gateway extra has no numpy, onnx or onnxruntime: the CLI's gateway commands must not
import them. The packaging tests prove it with a real ``[gateway]`` install (slow, CI only);
this catches a new top-level import in the normal suite, in seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
for name in ("numpy", "onnx", "onnxruntime"):
    sys.modules[name] = None  # any import of them raises ImportError
from inferway.cli.entry import main
sys.argv = ["inferway", *sys.argv[1:]]
main()
"""


def _inferway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_validate_and_render_run_without_numpy_onnx_or_onnxruntime() -> None:
    for example in ("minimal.yaml", "rollout.yaml", "traffic.yaml"):
        policy = str(ROOT / "examples" / example)
        validated = _inferway("validate", "-f", policy)
        assert validated.returncode == 0, validated.stderr
        rendered = _inferway("render", "-f", policy)
        assert rendered.returncode == 0 and "clusters" in rendered.stdout, rendered.stderr


def test_the_check_itself_catches_a_numpy_import() -> None:
    found = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace("from inferway.cli.entry", "import numpy\n#")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode != 0 and "numpy" in found.stderr
