"""Located policy errors: what went wrong, and where in which file.

A person fixing a policy needs the file, line, column and field of every problem at once,
so loading collects every issue into one :class:`PolicyError` instead of stopping early.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["PolicyError", "PolicyIssue"]


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
