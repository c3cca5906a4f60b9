"""Build inferway's wheel once and install it into fresh virtual environments, as a user would.

Real pip against the real registries (its download cache makes reruns fast). The wheel is built
from this checkout with build isolation, so it carries exactly what ``[build-system].requires``
generates (the pinned grpcio-tools' gencode, the pinned xds-protos' Envoy modules).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["ROOT", "Venv", "build_wheel", "dry_run", "record_overlaps"]

ROOT = Path(__file__).resolve().parents[2]


def _pip(python: str | Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def build_wheel(out: Path) -> Path:
    """The wheel of this checkout, built into ``out`` (emptied first)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("inferway-*.whl"):
        old.unlink()
    _pip(sys.executable, "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(ROOT))
    (wheel,) = out.glob("inferway-*.whl")
    return wheel


def dry_run(wheel: Path, extra: str) -> set[str]:
    """Names of every distribution pip would install for ``inferway[extra]`` into an empty
    environment (``--ignore-installed``: the whole tree, not the difference)."""
    spec = f"inferway[{extra}] @ {wheel.as_uri()}" if extra else f"inferway @ {wheel.as_uri()}"
    result = _pip(
        sys.executable,
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        "-",
        spec,
    )
    report: dict[str, Any] = json.loads(result.stdout)
    return {item["metadata"]["name"].lower().replace("_", "-") for item in report["install"]}


class Venv:
    """A fresh virtual environment under ``path``."""

    def __init__(self, path: Path) -> None:
        venv.create(path, with_pip=True, clear=True)
        self.path = path
        self.bin = path / "bin"
        self.python = self.bin / "python"
        # the venv's bundled pip is as old as the interpreter; older resolvers backtrack for
        # many minutes over bentoml's opentelemetry-instrumentation pins before they succeed
        _pip(self.python, "install", "--quiet", "--upgrade", "pip")

    def install(self, *requirements: str) -> None:
        _pip(self.python, "install", "--quiet", *requirements)

    def check(self) -> str:
        """``pip check``'s output; raises when it reports a broken requirement."""
        return _pip(self.python, "check").stdout

    def site_packages(self) -> Path:
        out = subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        )
        return Path(out.stdout.strip())

    def run(
        self,
        *args: str,
        timeout: float = 120,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
        env |= {"COLUMNS": "120", "PATH": f"{self.bin}{os.pathsep}{env.get('PATH', '')}"}
        return subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd or self.path,
        )


def record_overlaps(site_packages: Path) -> dict[str, list[str]]:
    """Installed path -> the distributions whose RECORD lists it, for paths listed by more than
    one (a file one distribution overwrote in another's tree). Byte-code caches are skipped."""
    owners: dict[str, set[str]] = defaultdict(set)
    for record in site_packages.glob("*.dist-info/RECORD"):
        dist = record.parent.name
        for line in record.read_text(encoding="utf-8").splitlines():
            path = line.rsplit(",", 2)[0]
            if not path or "__pycache__" in path or path.endswith(".pyc"):
                continue
            resolved = os.path.normpath(site_packages / path)
            owners[resolved].add(dist)
    return {p: sorted(d) for p, d in owners.items() if len(d) > 1}
