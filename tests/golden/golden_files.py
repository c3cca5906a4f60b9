"""Shared rules of the golden tests: where the cases live, how an expected file is compared
(or rewritten with ``INFERWAY_UPDATE_GOLDEN=1``, i.e. ``make golden``), and how stale files
are pruned. Review the diff of a regeneration like any code change."""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from functools import cache
from pathlib import Path

from inferway.policies import load_policy
from inferway.resolve import IR, ResolveError, resolve_policy
from inferway.state import State
from inferway.state.load import load_state

__all__ = [
    "GOLDEN",
    "RESOLVE",
    "TRANSLATE",
    "UPDATE",
    "check_text",
    "prune_case_dirs",
    "prune_case_files",
]

GOLDEN = Path(__file__).parent
RESOLVE = GOLDEN / "resolve"
"""<case>/policy.yaml [+ state.yaml] in; ir.yaml (or error.txt for refused State) out."""
TRANSLATE = GOLDEN / "translate"
"""<case>/ir.yaml (a copy of the resolve case's output) in; one file per resource type out."""
UPDATE = os.environ.get("INFERWAY_UPDATE_GOLDEN") == "1"


def check_text(path: Path, rendered: str, what: str) -> None:
    """Assert ``path`` holds ``rendered``; under UPDATE, write it first."""
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered)
    assert path.exists(), f"{path} missing: run `make golden`"
    assert rendered == path.read_text(), (
        f"{what} differs from {path}; if the change is intended, run `make golden` and "
        "review the diff"
    )


def prune_case_files(case_dir: Path, keep: Collection[str]) -> list[Path]:
    """Files in ``case_dir`` not in ``keep``; under UPDATE they are deleted (and none stay)."""
    stale = sorted(p for p in case_dir.iterdir() if p.name not in keep)
    if UPDATE:
        for path in stale:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        return []
    return stale


def prune_case_dirs(root: Path, live: Collection[str]) -> list[Path]:
    """Case directories under ``root`` not in ``live``; under UPDATE they are deleted."""
    if not root.exists():
        return []
    stale = sorted(d for d in root.iterdir() if d.is_dir() and d.name not in live)
    if UPDATE:
        for case_dir in stale:
            shutil.rmtree(case_dir)
        return []
    return stale


def resolve_cases() -> list[str]:
    return sorted(p.parent.name for p in RESOLVE.glob("*/policy.yaml"))


def resolve_case(case_dir: Path) -> IR:
    """Through the real loaders, so every input also passes the policy checks."""
    state_path = case_dir / "state.yaml"
    state = load_state(state_path) if state_path.exists() else State()
    return resolve_policy(load_policy(case_dir / "policy.yaml"), state)


@cache
def refused_cases(cases: tuple[str, ...]) -> frozenset[str]:
    """Cases whose State the policy refuses: their expected output is error.txt, and they
    have no translate case. Decided by resolving, so a new refused case needs no hand-made
    error.txt before ``make golden`` writes it."""
    refused = set()
    for case in cases:
        try:
            resolve_case(RESOLVE / case)
        except ResolveError:
            refused.add(case)
    return frozenset(refused)
