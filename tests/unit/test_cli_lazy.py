"""The lazily loaded commands (``cli/lazy.py``, ``cli/main.py``'s ``COMMANDS``): each loads, the
help ``COMMANDS`` declares is the command's own, and the root ``--help`` listed from it is the
very help the loaded commands would give, plain (piped) and rich."""

from __future__ import annotations

import inspect
import io

import pytest
import typer
from typer.core import TyperGroup

from inferway.cli.lazy import LazyCommand, LazyGroup, load_command
from inferway.cli.main import COMMANDS, app


def _group(markup: str | None) -> LazyGroup:
    app.rich_markup_mode = markup  # type: ignore[assignment]
    try:
        group = typer.main.get_command(app)
    finally:
        app.rich_markup_mode = "rich"
    assert isinstance(group, LazyGroup)
    return group


def _help(group: TyperGroup, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("TERMINAL_WIDTH", "200")
    buffer = io.StringIO()
    monkeypatch.setattr("sys.stdout", buffer)
    with typer.Context(group, info_name="inferway", terminal_width=200) as ctx:
        text = group.get_help(ctx)
    return text + buffer.getvalue()


@pytest.mark.parametrize("entry", COMMANDS, ids=lambda e: e.name)
def test_each_command_loads_and_declares_its_own_help(entry: LazyCommand) -> None:
    command = load_command(entry, _group(None))
    assert command.name == entry.name
    assert command.help is not None
    assert inspect.cleandoc(command.help).split("\n\n")[0] == entry.help


def test_the_group_lists_every_command_in_order_before_loading_any() -> None:
    group = _group(None)
    with typer.Context(group, info_name="inferway") as ctx:
        assert group.list_commands(ctx) == [entry.name for entry in COMMANDS]


def test_a_command_is_loaded_when_resolved_and_kept() -> None:
    group = _group(None)
    with typer.Context(group, info_name="inferway") as ctx:
        first = group.get_command(ctx, "scale")
        assert isinstance(first, TyperGroup) and "status" in first.commands
        assert group.get_command(ctx, "scale") is first
        assert group.get_command(ctx, "no-such-command") is None


@pytest.mark.parametrize("markup", [None, "rich"])
def test_root_help_from_declared_help_equals_help_from_loaded_commands(
    markup: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = _help(_group(markup), monkeypatch)
    loaded = _group(markup)
    with typer.Context(loaded, info_name="inferway") as ctx:
        for entry in COMMANDS:
            loaded.get_command(ctx, entry.name)  # replaces the listing with the command
    assert _help(loaded, monkeypatch) == listed
    for entry in COMMANDS:
        assert entry.name in listed


def test_completing_a_command_name_loads_no_command() -> None:
    group = _group(None)
    with typer.Context(group, info_name="inferway") as ctx:
        found = [item.value for item in group.shell_complete(ctx, "r")]
    assert found == ["render", "run", "rollout", "report"]
    assert all(group.commands[entry.name].params == [] for entry in COMMANDS)  # listings only
    with typer.Context(group, info_name="inferway") as ctx:
        assert group.get_command(ctx, "run").params  # type: ignore[union-attr]
