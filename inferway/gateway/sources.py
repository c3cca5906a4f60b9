"""Runtime sources: what a policy names outside itself (endpoints file, certificate files).

A source reads those files for a policy and returns the runtime state to apply it with, or
raises PolicyError (which refuses the policy, located). Sources run before the control plane's
apply step, never inside it, so applying stays pure and ``inferway validate`` runs the same
reads as ``inferway run``. A source knows nothing of the control plane: it gets a policy and
the current state and returns the next state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from inferway.gateway.control_plane import Refusal
from inferway.policies.model import Policy
from inferway.state import State

__all__ = ["StateSink", "StateSource", "read_sources"]

StateSource = Callable[[Policy, State], State]
"""``source(policy, state) -> state``: the state with this source's part read for ``policy``."""


def read_sources(sources: Iterable[StateSource], policy: Policy, state: State) -> State:
    """Run each source in turn; the first PolicyError stops and refuses the policy."""
    for source in sources:
        state = source(policy, state)
    return state


class StateSink(Protocol):
    """Where a watching source pushes a change it saw (the control plane is one): the live
    policy and state to read, ``update_state`` to push (raises PolicyRefusedError when the
    result is refused), ``refuse`` to record files that could not be used, and
    ``set_file_problem`` to show a watched file that is missing or unreadable (None clears it)."""

    @property
    def policy(self) -> Policy | None: ...

    @property
    def state(self) -> State: ...

    def update_state(self, state: State, source: str) -> str | None: ...

    def refuse(self, error: BaseException, source: str | None = None) -> Refusal: ...

    def set_file_problem(self, file: str, kind: str, message: str | None) -> None: ...
