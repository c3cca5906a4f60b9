"""The one error resolve raises: runtime state that cannot be merged with the policy."""

from __future__ import annotations

__all__ = ["ResolveError"]


class ResolveError(ValueError):
    """A State entry that contradicts the policy (e.g. a weight override naming a service
    that is not a backend of its route). The message names the entry and what was expected;
    the control plane refuses the change like a bad edit."""
