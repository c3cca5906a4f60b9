"""Edits that would cut every client off: refused unless the policy says it means it.

A truncated save of a policy is often still valid YAML (``version: 1`` and the first
listener, nothing after): applied, it moves Envoy's listener and drops every route, and
every request fails. An edit to the live policy that removes every route, or moves every
listener (none of the live listener addresses is kept), is therefore refused unless the new
policy sets ``allow_disruptive: true`` (docs/policy.md). Only edits are checked: a gateway
started on such a policy is what its operator asked for.
"""

from __future__ import annotations

from inferway.policies.model import Listener, Policy
from inferway.policies.yaml_marks import Loc

__all__ = ["check_disruptive_edit"]

_HOW = (
    "a half-saved file looks like this; if the change is meant, add 'allow_disruptive: true' "
    "at the top level (and remove it with the next edit)"
)


def _addresses(listeners: list[Listener]) -> list[str]:
    return [f"{listener.address}:{listener.port}" for listener in listeners]


def check_disruptive_edit(live: Policy | None, edit: Policy) -> list[tuple[Loc, str]]:
    """The reasons ``edit`` would cut off every client of ``live`` (empty: it would not, or
    it says ``allow_disruptive: true``)."""
    if live is None or edit.allow_disruptive:
        return []
    issues: list[tuple[Loc, str]] = []
    if live.routes and not edit.routes:
        issues.append(
            (("routes",), f"this edit removes every route ({len(live.routes)} live); {_HOW}")
        )
    before, after = _addresses(live.listeners), _addresses(edit.listeners)
    if before and not set(before) & set(after):
        issues.append(
            (
                ("listeners",),
                f"this edit moves every listener (live: {', '.join(before)}; "
                f"new: {', '.join(after)}); {_HOW}",
            )
        )
    return issues
