"""Which process ``inferway profile --target`` means, from command lines (and a /proc tree)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.gateway.profile_targets import (
    Candidate,
    ProfileTarget,
    TargetError,
    classify,
    find_targets,
    pick_target,
)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/venv/bin/python", "/venv/bin/inferway", "serve", "--http-port", "1"], "backend"),
        (["python", "-m", "inferway.cli.main", "serve"], "backend"),
        (["python", "-m", "inferway.gateway.control_plane_main"], "gateway"),
        (["/venv/bin/inferway", "run", "-f", "p.yaml", "--no-envoy"], "gateway"),
        (["/venv/bin/inferway", "run", "-f", "p.yaml"], None),  # the keeper: Envoy's owner
        (["/venv/bin/inferway", "status"], None),
        (["python", "serve.py"], None),
    ],
)
def test_classify(argv: list[str], expected: str | None) -> None:
    found = classify(argv)
    assert (found.value if found else None) == expected


def _proc(tmp_path: Path, pid: int, argv: list[str]) -> None:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_find_targets_reads_a_proc_tree(tmp_path: Path) -> None:
    _proc(tmp_path, 10, ["python", "-m", "inferway.cli.main", "serve"])
    _proc(tmp_path, 11, ["python", "-m", "inferway.gateway.control_plane_main"])
    (tmp_path / "self").mkdir()
    found = find_targets(ProfileTarget.backend, proc=tmp_path)
    assert [c.pid for c in found] == [10]


def test_pick_target_refuses_none_or_several_and_lists_them() -> None:
    with pytest.raises(TargetError, match="no running inferway serve"):
        pick_target(ProfileTarget.backend, [])
    two = [Candidate(1, ProfileTarget.gateway, "a"), Candidate(2, ProfileTarget.gateway, "b")]
    with pytest.raises(TargetError, match=r"(?s)2 gateway processes.*1: a.*2: b"):
        pick_target(ProfileTarget.gateway, two)
    assert pick_target(ProfileTarget.gateway, two[:1]).pid == 1
