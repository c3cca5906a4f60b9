"""The ``inferway`` command's exit codes, one meaning each, so scripts can tell a bad policy
from a typo from a gateway that is not there (docs/cli.md lists them per command)."""

from __future__ import annotations

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE"]

EXIT_OK = 0
"""Done: the policy is valid, the command did what it was asked."""
EXIT_INVALID = 1
"""Invalid input or refused: a policy (or a file it names) has errors, a gateway refused it."""
EXIT_USAGE = 2
"""Usage: an unknown option or command, a bad option value, a missing required file (click's
own code for usage errors); also a local precondition the command cannot meet (no Envoy
binary for ``validate --envoy``, a port ``run`` cannot bind)."""
EXIT_UNREACHABLE = 3
"""A client command (``status``) could not reach the gateway's admin API, or it answered
something other than its JSON document."""
