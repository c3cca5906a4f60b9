"""IR of a route's access rules (deny wins; with allow rules, the rest is refused)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AccessHeaderIR", "AccessIR", "AccessRuleIR"]


@dataclass(frozen=True)
class AccessHeaderIR:
    """Exactly one of exact, prefix or present (present is only ever true)."""

    name: str
    exact: str | None = None
    prefix: str | None = None
    present: bool = False


@dataclass(frozen=True)
class AccessRuleIR:
    """Every non-empty field must match; within a field, any entry."""

    identities: tuple[str, ...]
    source_ips: tuple[str, ...]
    headers: tuple[AccessHeaderIR, ...]


@dataclass(frozen=True)
class AccessIR:
    allow: tuple[AccessRuleIR, ...]
    deny: tuple[AccessRuleIR, ...]
