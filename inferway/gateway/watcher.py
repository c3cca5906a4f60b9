"""Watch the policy file and apply each edit that is valid; refuse, log and record the rest.

The loop itself (directory watch, debounce, digest, refusal) is :mod:`file_watch`'s; this
module only says how a policy is loaded and applied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry import trace

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.file_watch import ReloadResult, WatchedFile
from inferway.gateway.sources import StateSource, read_sources
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.checks_disruptive import check_disruptive_edit
from inferway.policies.located import locate_issue, parse_located, place_issues
from inferway.policies.model import Policy

__all__ = ["PolicyWatcher", "ReloadResult"]

_tracer = trace.get_tracer("inferway.gateway")


class PolicyWatcher(WatchedFile):
    """Re-applies ``path`` through ``control_plane`` whenever its content changes."""

    kind = "policy"

    def __init__(
        self,
        path: str | Path,
        control_plane: ControlPlane,
        *,
        debounce_ms: int = 10,
        on_reload: Callable[[ReloadResult], None] | None = None,
        force_polling: bool | None = None,
        external_endpoints: bool = False,
        sources: Sequence[StateSource] = (),
    ) -> None:
        """``external_endpoints``: the gateway was given an endpoints file, so an edit may
        leave services without inline endpoints (see ``check_policy``). ``sources`` read what
        each edit names (certificate files, a moved endpoints file) before it is applied."""
        super().__init__(
            path,
            control_plane,
            debounce_ms=debounce_ms,
            on_reload=on_reload,
            force_polling=force_polling,
        )
        self.control_plane = control_plane
        self.external_endpoints = external_endpoints
        self.sources = tuple(sources)

    def apply(self, text: str, source: str) -> str | None:
        with _tracer.start_as_current_span(
            "reload policy", attributes={"inferway.policy.source": source}
        ):
            with _tracer.start_as_current_span("load policy"):
                policy = load_policy_text(text, source, external_endpoints=self.external_endpoints)
                _refuse_disruptive(self.control_plane.policy, policy, text, source)
            with _tracer.start_as_current_span("read sources"):
                try:
                    state = read_sources(self.sources, policy, self.control_plane.state)
                except PolicyError as error:  # placed on the fields naming the files
                    raise PolicyError(place_issues(text, source, error.issues)) from None
            return self.control_plane.apply_policy(policy, source, state=state)


def _refuse_disruptive(live: Policy | None, edit: Policy, text: str, source: str) -> None:
    """Raise PolicyError, located on ``routes`` / ``listeners``, for an edit that would cut
    every client off without saying ``allow_disruptive: true``."""
    found = check_disruptive_edit(live, edit)
    if found:
        document, _ = parse_located(text, source)
        raise PolicyError([locate_issue(document, source, loc, message) for loc, message in found])
