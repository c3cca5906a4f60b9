"""The ``inferway`` command's exit codes, one meaning each, so scripts can tell a bad policy
from a typo from a gateway that is not there (docs/cli.md lists them per command)."""

from __future__ import annotations

__all__ = [
    "EXIT_BAR_MISSED",
    "EXIT_CANNOT_START",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
]

EXIT_OK = 0
"""Done: the policy is valid, the command did what it was asked."""
EXIT_INVALID = 1
"""Invalid input or refused: a policy (or a file it names) has errors, a gateway refused it."""
EXIT_USAGE = 2
"""Usage: an unknown option or command, a bad option value, a missing required file (click's
own code for usage errors)."""
EXIT_CANNOT_START = EXIT_USAGE
"""A local precondition the command as given cannot meet here: no Envoy binary for
``validate --envoy``, unusable xDS TLS files, a port ``run`` cannot bind, an Envoy that does
not start. It shares usage's code: the command line has to change (or the host)."""
EXIT_UNREACHABLE = 3
"""A client command (``status``) could not reach the gateway's admin API, or it answered
something other than its JSON document; ``report cost`` could not get its history from
Prometheus."""
EXIT_BAR_MISSED = 4
"""``verify`` ran and a bar was missed: requests routed elsewhere than the policy says (below
the correctness bar), pools' activation frequencies off their weights, the load run's p99
over the SLA or its errors over the limit, utilisation under ``--min-utilization``. A rollout
gate (a pre-step webhook, a CI step) stops on it."""
