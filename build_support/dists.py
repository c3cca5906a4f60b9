"""``python -m build_support.dists [OUT]``: every wheel of the project, into one folder.

inferway ships as one code distribution and four meta-distributions (docs/install.md):
``inferway-core`` (the root ``pyproject.toml``: the import package ``inferway``, its extras)
and, under ``packaging/<name>/``, ``inferway``, ``inferway-gateway``, ``inferway-backend`` and
``inferway-gpu``, which hold no code, only one requirement on ``inferway-core[<extras>]``
pinned to the same release. pip extras can only add requirements, so the plain install that
must work on its own (``pip install inferway``) and the role installs that must leave things
out (the gateway without numerics, the GPU backend without CPU onnxruntime) have to be
distinct distributions.

Before building, the meta-distributions are checked against the core (same version and
``requires-python``, every requirement ``inferway-core[...]==<version>`` naming extras the
core has, each extra of theirs forwarding the core's extra of the same name, never ``gpu``
together with ``backend``/``all``); a mismatch is reported as
``file:line: message`` and nothing is built. The folder then serves as pip's or uv's
``--find-links``: ``pip install inferway --find-links OUT``.

Standard library only: the Dockerfile's build stage runs it with nothing but pip installed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CORE", "ROOT", "Distribution", "build_all", "check", "distributions", "main"]

ROOT = Path(__file__).resolve().parents[1]
CORE = "inferway-core"
_PIN = re.compile(r"^inferway-core\[([a-z0-9][a-z0-9,\s-]*)\]==(\S+)$")
_CLASHING = ({"gpu"}, {"backend", "all"})
"""Extras that both install an ``onnxruntime`` package: onnxruntime-gpu and onnxruntime."""


@dataclass(frozen=True)
class Distribution:
    """One distribution of the project: its name, version and source folder."""

    name: str
    version: str
    folder: Path

    @property
    def wheel_prefix(self) -> str:
        """How its wheel's file name starts (PEP 427 escapes ``-`` as ``_``)."""
        return f"{self.name.replace('-', '_')}-{self.version}-"


def _project(pyproject: Path) -> dict[str, Any]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project")
    if not isinstance(project, dict):
        raise ValueError(f"{pyproject}: no [project] table")
    return project


def distributions(root: Path = ROOT) -> list[Distribution]:
    """The core first, then every ``packaging/<name>/`` meta-distribution, by name."""
    found = []
    for pyproject in [root / "pyproject.toml", *sorted(root.glob("packaging/*/pyproject.toml"))]:
        project = _project(pyproject)
        found.append(Distribution(str(project["name"]), str(project["version"]), pyproject.parent))
    return found


def _line(pyproject: Path, needle: str) -> str:
    """``file:line`` of the first line holding ``needle`` (the file itself when none does)."""
    lines = pyproject.read_text(encoding="utf-8").splitlines()
    found = (i for i, text in enumerate(lines, 1) if needle in text and not text.startswith("#"))
    number = next(found, None)
    return f"{pyproject}:{number}" if number else str(pyproject)


def _check_meta(pyproject: Path, core: dict[str, Any], core_extras: set[str]) -> list[str]:
    project = _project(pyproject)
    name, version = project.get("name"), core["version"]
    errors = []
    if project.get("version") != version:
        errors.append(
            f"{_line(pyproject, 'version =')}: {name} is version {project.get('version')!r}, "
            f"inferway-core {version!r}: a meta-distribution has the core's version"
        )
    if project.get("requires-python") != core["requires-python"]:
        errors.append(
            f"{_line(pyproject, 'requires-python =')}: requires-python "
            f"{project.get('requires-python')!r} differs from inferway-core's "
            f"{core['requires-python']!r}"
        )
    groups: dict[str, list[str]] = {"": list(project.get("dependencies") or [])}
    optional: dict[str, list[str]] = project.get("optional-dependencies") or {}
    groups |= {extra: list(reqs) for extra, reqs in optional.items()}
    if not groups[""]:
        errors.append(f"{pyproject}: no dependencies: a meta-distribution requires inferway-core")
    base: set[str] = set()
    for group, requirements in groups.items():
        extras: set[str] = set()
        for requirement in requirements:
            match = _PIN.match(requirement)
            where = _line(pyproject, requirement)
            if match is None:
                errors.append(
                    f"{where}: {requirement!r}: a meta-distribution requires only "
                    f"'inferway-core[<extras>]=={version}'"
                )
                continue
            if match[2] != version:
                errors.append(f"{where}: {requirement!r} pins {match[2]}, not {version}")
            named = {e.strip() for e in match[1].split(",") if e.strip()}
            if named - core_extras:
                errors.append(f"{where}: inferway-core has no extra {sorted(named - core_extras)}")
            if group and named != {group}:
                errors.append(
                    f"{where}: extra {group!r} forwards inferway-core[{group}] and nothing else"
                )
            extras |= named
        if group == "":
            base = extras
        together = base | extras
        clashed_before = group and all(base & side for side in _CLASHING)  # reported once
        if not clashed_before and all(together & side for side in _CLASHING):
            errors.append(
                f"{_line(pyproject, f'{group} =' if group else 'dependencies')}: {name}"
                f"{f'[{group}]' if group else ''} would install inferway-core"
                f"{sorted(together)}: onnxruntime-gpu and onnxruntime overwrite each other"
            )
    wheel = (
        tomllib.loads(pyproject.read_text(encoding="utf-8"))
        .get("tool", {})
        .get("hatch", {})
        .get("build", {})
        .get("targets", {})
        .get("wheel", {})
    )
    if wheel.get("bypass-selection") is not True or "packages" in wheel:
        errors.append(
            f"{pyproject}: [tool.hatch.build.targets.wheel] needs bypass-selection = true and no "
            "packages: the code is inferway-core's alone (two wheels owning `inferway/` would "
            "overwrite each other)"
        )
    return errors


def check(root: Path = ROOT) -> list[str]:
    """Every mismatch between the meta-distributions and the core, located; empty when none."""
    core = _project(root / "pyproject.toml")
    if core.get("name") != CORE:
        return [f"{_line(root / 'pyproject.toml', 'name =')}: the root project is {CORE}"]
    core_extras = set(core.get("optional-dependencies") or {})
    errors = []
    for pyproject in sorted(root.glob("packaging/*/pyproject.toml")):
        if pyproject.parent.name != _project(pyproject).get("name"):
            errors.append(f"{_line(pyproject, 'name =')}: the folder is named after the project")
        errors += _check_meta(pyproject, core, core_extras)
    return errors


def build_all(out: Path, root: Path = ROOT, python: str = sys.executable) -> dict[str, Path]:
    """Check, then build every distribution's wheel into ``out`` (older wheels of these
    distributions removed first, so the folder never offers two releases); returns name ->
    wheel. Raises ``ValueError`` listing the mismatches, ``RuntimeError`` when pip fails."""
    errors = check(root)
    if errors:
        raise ValueError("\n".join(errors))
    dists = distributions(root)
    out.mkdir(parents=True, exist_ok=True)
    for dist in dists:
        for old in out.glob(f"{dist.name.replace('-', '_')}-*.whl"):
            old.unlink()
    # one pip run, build isolation on: each wheel holds what its [build-system] makes
    command = [python, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check"]
    command += ["--wheel-dir", str(out), *(str(d.folder) for d in dists)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        raise RuntimeError(f"pip wheel failed (exit {done.returncode}):\n{output}")
    wheels = {}
    for dist in dists:
        (wheel,) = out.glob(f"{dist.wheel_prefix}*.whl")
        wheels[dist.name] = wheel
    return wheels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m build_support.dists",
        description="Build the wheels of inferway-core and its meta-distributions into one folder.",
    )
    parser.add_argument("out", nargs="?", type=Path, default=ROOT / "dist", help="default: dist/")
    args = parser.parse_args(argv)
    try:
        wheels = build_all(args.out.resolve())
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    for wheel in wheels.values():
        print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
