"""Located policy errors: what went wrong, and where in which file.

A person fixing a policy needs the file, line, column and field of every problem at once,
so loading collects every issue into one :class:`PolicyError` instead of stopping early.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PolicyError", "PolicyIssue", "read_source_text"]


@dataclass(frozen=True)
class PolicyIssue:
    """One problem in a policy file.

    ``line``/``column`` are 1-based and ``None`` when no position applies (an unreadable
    file). ``path`` names the field, e.g. ``routes[0].backends[1].weight``; ``""`` is the
    document itself.
    """

    file: str
    line: int | None
    column: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        if self.path:
            return f"{where}: {self.path}: {self.message}"
        return f"{where}: {self.message}"


class PolicyError(Exception):
    """A policy was refused. ``issues`` lists every problem found, in file order."""

    def __init__(self, issues: Iterable[PolicyIssue]) -> None:
        self.issues: list[PolicyIssue] = list(issues)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(issue) for issue in self.issues)


def read_source_text(path: str | Path) -> str:
    """The UTF-8 text of a file the user gave us, or a PolicyError naming it and why not."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise PolicyError(
            [PolicyIssue(str(path), None, None, "", f"cannot read file: {reason}")]
        ) from None
