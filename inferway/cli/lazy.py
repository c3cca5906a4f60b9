"""Commands imported only when they run: the ``inferway`` app lists every command, but loads a
command's module (and what it imports: the gateway, pydantic policies, gRPC, onnxruntime) only
when that command is invoked, so ``inferway status`` or ``--version`` does not pay for ``run``.

A :class:`LazyCommand` names where a command lives (``"inferway.cli.status:status"``: a typer
command function, or a ``typer.Typer`` group) and carries its one-paragraph help, which the
root ``--help`` shows without importing anything; ``tests/unit/test_cli_lazy.py`` checks that
help against the command's own. A loaded command is registered exactly as ``app.command()`` or
``app.add_typer()`` would have.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

__all__ = ["LazyCommand", "LazyGroup", "lazy_group_class", "load_command"]


@dataclass(frozen=True, slots=True)
class LazyCommand:
    """``name`` on the command line; ``target`` ``"module:attribute"``; ``help`` the first
    paragraph of the command's help, as the root ``--help`` lists it."""

    name: str
    target: str
    help: str


class _Listed(TyperCommand):
    """A lazy command as the root's help lists it: name and help only, nothing imported."""


def load_command(entry: LazyCommand, group: TyperGroup) -> TyperCommand | TyperGroup:
    """Import ``entry``'s module and build its click command as ``group``'s app would have
    (same markup mode; a function becomes a command, a ``typer.Typer`` a sub-group)."""
    module_name, _, attribute = entry.target.partition(":")
    target: Any = getattr(importlib.import_module(module_name), attribute)
    holder = typer.Typer(add_completion=False, rich_markup_mode=group.rich_markup_mode)
    holder.callback()(_no_op)  # a group, so the command is built as a subcommand
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=entry.name)
    else:
        holder.command(entry.name)(target)
    built = typer.main.get_command(holder)
    assert isinstance(built, TyperGroup)
    command = built.commands[entry.name]
    assert isinstance(command, TyperCommand | TyperGroup)
    return command


def _no_op() -> None:
    """The holder group's callback (never run)."""


class LazyGroup(TyperGroup):
    """A typer group whose ``lazy`` commands load on first use (``get_command``), and are
    listed from their declared help while the group formats its own help."""

    lazy: Sequence[LazyCommand] = ()

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._listing = False
        for entry in self.lazy:
            self.commands.setdefault(entry.name, _Listed(name=entry.name, help=entry.help))
        self._entries = {entry.name: entry for entry in self.lazy}

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = self.commands.get(cmd_name)
        if isinstance(command, _Listed) and not self._listing:
            command = load_command(self._entries[cmd_name], self)
            self.commands[cmd_name] = command
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def shell_complete(self, ctx: Any, incomplete: str) -> Any:
        """Completing a command name lists the names and their help: nothing to import."""
        self._listing = True
        try:
            return super().shell_complete(ctx, incomplete)
        finally:
            self._listing = False


def lazy_group_class(commands: Sequence[LazyCommand]) -> type[LazyGroup]:
    """A :class:`LazyGroup` for ``commands`` (typer builds the group from its class)."""
    return type("InferwayGroup", (LazyGroup,), {"lazy": tuple(commands)})
