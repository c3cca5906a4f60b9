"""Which local process ``inferway profile --target backend|gateway`` means, read from /proc.

``backend`` is an ``inferway serve`` (its ``--workers`` children are profiled through it with
py-spy's ``--subprocesses``). ``gateway`` is the control plane: under ``inferway run`` with
Envoy that is the keeper's child (``-m inferway.gateway.control_plane_main``), where the xDS
and admin work happens; with ``--no-envoy`` it is the ``inferway run`` process itself. More
than one candidate is an error listing them, so the operator picks with ``--pid``.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Candidate", "ProfileTarget", "TargetError", "classify", "find_targets", "pick_target"]


class ProfileTarget(enum.StrEnum):
    backend = "backend"
    gateway = "gateway"


class TargetError(Exception):
    """No process, or several, match the target; the message lists them."""


@dataclass(frozen=True)
class Candidate:
    pid: int
    target: ProfileTarget
    command: str


_CLI_MODULES = ("inferway.cli.main", "inferway.cli.entry")


def _subcommand(argv: Sequence[str]) -> str | None:
    """The inferway subcommand of ``argv`` (console script or ``python -m`` form)."""
    for i, arg in enumerate(argv):
        is_script = Path(arg).name == "inferway"
        is_module = arg in _CLI_MODULES and i > 0 and argv[i - 1] == "-m"
        if is_script or is_module:
            rest = [a for a in argv[i + 1 :] if not a.startswith("-")]
            return rest[0] if rest else None
    return None


def classify(argv: Sequence[str]) -> ProfileTarget | None:
    """The profile target a process with this command line is, or None. Pure."""
    if "inferway.gateway.control_plane_main" in argv:
        return ProfileTarget.gateway
    sub = _subcommand(argv)
    if sub == "serve":
        return ProfileTarget.backend
    if sub == "run" and "--no-envoy" in argv:
        return ProfileTarget.gateway
    return None


def _processes(proc: Path) -> Iterable[tuple[int, list[str]]]:
    for entry in proc.iterdir():
        if not (entry.name.isascii() and entry.name.isdigit()):
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if raw:
            yield int(entry.name), raw.rstrip(b"\0").decode(errors="replace").split("\0")


def find_targets(target: ProfileTarget, *, proc: Path = Path("/proc")) -> list[Candidate]:
    """Every local process that is ``target`` (never this process)."""
    if not proc.is_dir():
        raise TargetError(f"{proc} is not readable here: give the process with --pid")
    me = os.getpid()
    return sorted(
        (
            Candidate(pid, target, " ".join(argv))
            for pid, argv in _processes(proc)
            if pid != me and classify(argv) is target
        ),
        key=lambda c: c.pid,
    )


def pick_target(target: ProfileTarget, candidates: Sequence[Candidate]) -> Candidate:
    if not candidates:
        what = "inferway serve" if target is ProfileTarget.backend else "inferway control plane"
        raise TargetError(f"no running {what} process found here; give its --pid")
    if len(candidates) > 1:
        listed = "\n".join(f"  {c.pid}: {c.command[:160]}" for c in candidates)
        raise TargetError(f"{len(candidates)} {target} processes; choose one with --pid:\n{listed}")
    return candidates[0]
