"""``-o text|json|yaml`` for the commands whose answer a script reads (status, render,
validate), and the documented shapes of their JSON documents (docs/cli.md).

``text`` is for people and may change; ``json`` and ``yaml`` print one document on stdout with
keys sorted, whose fields only grow, so ``jq`` and CI steps can rely on them.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from inferway.policies.errors import PolicyIssue

__all__ = [
    "DocumentOutputOption",
    "OutputFormat",
    "OutputOption",
    "file_verdict",
    "issue_document",
    "validation_report",
    "write_document",
]


class OutputFormat(enum.StrEnum):
    text = "text"
    json = "json"
    yaml = "yaml"


OutputOption = Annotated[
    OutputFormat,
    typer.Option(
        "--output",
        "-o",
        help="text (for people), json or yaml (one document on stdout, for scripts).",
        case_sensitive=False,
    ),
]
DocumentOutputOption = Annotated[
    OutputFormat,
    typer.Option(
        "--output",
        "-o",
        help="yaml or json (text is the yaml).",
        case_sensitive=False,
    ),
]
"""``-o`` of a command whose answer is always a document (``render``)."""


def write_document(document: Any, output: OutputFormat, stream: IO[str] | None = None) -> None:
    """Print ``document`` as ``output`` (json or yaml), ending with a newline."""
    target = sys.stdout if stream is None else stream
    if output is OutputFormat.json:
        target.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
    elif output is OutputFormat.yaml:
        import yaml  # only for -o yaml: the json and text paths stay light

        target.write(yaml.safe_dump(document, sort_keys=True, default_flow_style=False))
    else:
        raise ValueError(f"{output} is not a document format")


def issue_document(issue: PolicyIssue) -> dict[str, Any]:
    """One located problem: ``file``, ``line``, ``column`` (1-based, null when no position
    applies), ``field`` (e.g. ``routes[0].backends[1].weight``; "" for the whole file),
    ``message``, and ``text``, the same ``file:line:column: field: message`` line as stderr."""
    return {
        "file": issue.file,
        "line": issue.line,
        "column": issue.column,
        "field": issue.path,
        "message": issue.message,
        "text": str(issue),
    }


def file_verdict(
    file: str, issues: Iterable[PolicyIssue] = (), summary: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One file's verdict: ``ok`` (no issues), its ``issues`` and, for a valid file, the
    ``summary`` of what it configures (null for an invalid one)."""
    listed = [issue_document(issue) for issue in issues]
    return {"file": file, "ok": not listed, "issues": listed, "summary": summary}


def validation_report(verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """``validate -o json``: ``ok`` (every file valid), ``files`` (one verdict each, in the
    order given) and ``issues`` (every file's issues, in order)."""
    return {
        "ok": all(v["ok"] for v in verdicts),
        "files": verdicts,
        "issues": [issue for v in verdicts for issue in v["issues"]],
    }
