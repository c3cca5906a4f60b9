"""The ``inferway`` command lines quoted in docs and examples must work as written: every
option they use exists on that command, and a policy file is given with ``-f``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from inferway.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
_COMMAND = re.compile(r"`[^`]*?\binferway (run|validate|render|status|demo|verify)\b([^`]*)`")
_TAKES_FILE = {"validate", "render", "run", "verify"}


def _quoted_commands() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("examples/*.yaml")]):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _COMMAND.finditer(line):
                found.append((f"{path.relative_to(ROOT)}:{number}", match[1], match[2]))
    return found


def _options(command: str) -> set[str]:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    loaded = group.get_command(typer.Context(group), command)  # imports the command's module
    assert loaded is not None, f"no command {command}"
    return {opt for param in loaded.params for opt in param.opts}


def test_docs_quote_some_commands() -> None:
    assert len(_quoted_commands()) >= 3


@pytest.mark.parametrize(("where", "command", "rest"), _quoted_commands())
def test_quoted_command_uses_real_options(where: str, command: str, rest: str) -> None:
    tokens = [t for t in rest.split() if t not in ("...", "|", "&&")]
    known = _options(command)
    for token in tokens:
        if token.startswith("-"):
            option = token.strip("[]").split("=")[0]
            assert option in known, f"{where}: 'inferway {command}' has no option {option}"
    if command in _TAKES_FILE and tokens:
        assert tokens[0].startswith("-"), (
            f"{where}: 'inferway {command} {tokens[0]}': the policy file is given with -f"
        )
