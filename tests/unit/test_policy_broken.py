"""Each tests/data/broken/<case>.yaml is refused with exactly the errors in <case>.expected.txt.

The expected text is ``str(PolicyError)`` with the file shown relative to the repository
root. ``INFERWAY_UPDATE_GOLDEN=1`` rewrites every expected file (and prunes ones whose YAML
is gone); review the diff before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferway.policies import PolicyError, load_policy

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "tests" / "data" / "broken"
UPDATE = os.environ.get("INFERWAY_UPDATE_GOLDEN") == "1"
CASES = sorted(p.stem for p in BROKEN.glob("*.yaml"))


def _errors_for(case: str, monkeypatch: pytest.MonkeyPatch) -> PolicyError:
    monkeypatch.chdir(ROOT)
    with pytest.raises(PolicyError) as caught:
        load_policy(Path("tests/data/broken") / f"{case}.yaml")
    return caught.value


@pytest.mark.parametrize("case", CASES)
def test_broken_policy_is_refused_with_the_expected_errors(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = _errors_for(case, monkeypatch)
    expected_file = BROKEN / f"{case}.expected.txt"
    actual = str(error) + "\n"
    if UPDATE:
        expected_file.write_text(actual, encoding="utf-8")
    assert expected_file.exists(), f"run with INFERWAY_UPDATE_GOLDEN=1 to create {expected_file}"
    assert actual == expected_file.read_text(encoding="utf-8")


@pytest.mark.parametrize("case", CASES)
def test_every_issue_names_file_line_column(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    error = _errors_for(case, monkeypatch)
    assert error.issues
    for issue in error.issues:
        assert issue.file == f"tests/data/broken/{case}.yaml"
        assert issue.line is not None and issue.line >= 1
        assert issue.column is not None and issue.column >= 1
        assert issue.message


def test_no_expected_file_without_its_policy() -> None:
    stale = [
        p for p in BROKEN.glob("*.expected.txt") if p.name[: -len(".expected.txt")] not in CASES
    ]
    if UPDATE:
        for path in stale:
            path.unlink()
        stale = []
    assert stale == []


def test_several_errors_are_reported_together(monkeypatch: pytest.MonkeyPatch) -> None:
    error = _errors_for("several-errors", monkeypatch)
    paths = [issue.path for issue in error.issues]
    assert paths == [
        "version",
        "listeners[0].name",
        "services[0].protocol",
        "routes[0].match.path",
        "routes[0].backends[0].wieght",
    ]
    assert [issue.line for issue in error.issues] == sorted(i.line or 0 for i in error.issues)
