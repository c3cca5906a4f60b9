"""Build the project's wheels once and install them into fresh virtual environments, as a
user would.

Real pip (and uv) against the real registries (their download caches make reruns fast). The
wheels come from ``build_support.dists`` (the command the docs give: inferway-core and the
meta-distributions, build isolation on, so the core carries exactly what
``[build-system].requires`` generates). The venvs are made without pip: this environment's
pip installs into them with ``--python``, which saves installing (and upgrading: the bundled
one is as old as the interpreter and backtracks for many minutes over bentoml's pins) a pip
into each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = [
    "ROOT",
    "Venv",
    "dry_run",
    "record_lines",
    "record_overlaps",
]

ROOT = Path(__file__).resolve().parents[2]


def _run(command: list[str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


def dry_run(requirement: str, find_links: Path) -> set[str]:
    """Names of every distribution pip would install for ``requirement`` into an empty
    environment (``--ignore-installed``: the whole tree, not the difference). pip reads the
    registry's separate metadata files, so nothing large (onnxruntime-gpu) is downloaded."""
    result = _run(
        _pip(
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--find-links",
            str(find_links),
            "--report",
            "-",
            requirement,
        )
    )
    report: dict[str, Any] = json.loads(result.stdout)
    return {item["metadata"]["name"].lower().replace("_", "-") for item in report["install"]}


def _uv() -> str:
    from uv import find_uv_bin  # the dev extra's uv

    return str(find_uv_bin())


class Venv:
    """A fresh virtual environment under ``path`` (no pip inside: see the module's doc)."""

    def __init__(self, path: Path) -> None:
        venv.create(path, with_pip=False, clear=True)
        self.path = path
        self.bin = path / "bin"
        self.python = self.bin / "python"

    def install(self, *requirements: str, find_links: Path) -> None:
        """One ``pip install`` (one resolution) of ``requirements``, the built wheels offered
        by ``--find-links`` beside the registry, as a user given the folder would."""
        # --no-compile: byte-compiling ray's or kserve's thousands of modules is most of an
        # install's CPU time, and Python compiles what it imports anyway
        args = ["install", "--quiet", "--no-compile", "--find-links", str(find_links)]
        args += requirements
        _run(_pip("--python", str(self.python), *args))

    def uv_install(self, *requirements: str, find_links: Path) -> None:
        """The same with ``uv pip install``. uv caches a wheel by name and version (a release is
        immutable on an index), so the folder's distributions are refreshed: a rebuilt wheel of
        the same version is taken, not the one cached from an earlier build."""
        command = [_uv(), "pip", "install", "--quiet", "--python", str(self.python)]  # no .pyc
        for wheel in sorted(find_links.glob("*.whl")):
            command += ["--refresh-package", wheel.name.split("-")[0].replace("_", "-")]
        _run([*command, "--find-links", str(find_links), *requirements])

    def check(self) -> str:
        """``pip check``'s output; raises when it reports a broken requirement."""
        return _run(_pip("--python", str(self.python), "check")).stdout

    def uv_check(self) -> str:
        return _run([_uv(), "pip", "check", "--python", str(self.python)]).stdout

    def installed(self) -> set[str]:
        """Normalized names of every distribution installed here."""
        return {
            info.name.split("-")[0].lower().replace("_", "-")  # "-" escaped as "_" in it
            for info in self.site_packages().glob("*.dist-info")
        }

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

    def inferway(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "inferway"), *args, timeout=timeout)


def record_lines(wheel: Path) -> set[str]:
    """The ``path,hash,size`` lines of a wheel's RECORD for its files outside ``.dist-info``:
    an installed RECORD holding all of them means these exact files came from this wheel."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
        lines = archive.read(name).decode("utf-8").splitlines()
    return {line for line in lines if line and ".dist-info/" not in line.split(",")[0]}


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
