"""Policy + State -> a checked Envoy snapshot: resolve, translate, consistency check.

The one pipeline ``run`` (through the control plane), ``validate`` and ``render`` share, so
what ``validate`` accepts is what ``run`` applies. Pure: no cache, no sockets.
"""

from __future__ import annotations

from collections.abc import Callable

from inferway.policies.errors import PolicyError, PolicyIssue
from inferway.policies.model import Policy
from inferway.resolve import IR, resolve_policy
from inferway.state import State
from inferway.xds.resources import Resources
from inferway.xds.snapshot import Snapshot, build_snapshot
from inferway.xds.translate import translate as translate_ir

__all__ = ["build_policy_snapshot", "resolve_and_snapshot"]


def resolve_and_snapshot(
    policy: Policy,
    state: State,
    source: str,
    *,
    translate: Callable[[IR], Resources] | None = None,
) -> tuple[IR, Snapshot]:
    """resolve -> translate -> a consistent snapshot (with the IR it came from), or
    PolicyError naming ``source``.

    A translation error (a bug, or a case the checks miss) becomes one located issue, not a
    traceback, for ``run`` and ``validate`` alike.
    """
    try:
        ir = resolve_policy(policy, state)
        snapshot = build_snapshot((translate or translate_ir)(ir))
    except (ValueError, TypeError) as error:
        message = f"cannot translate to Envoy configuration: {error}"
        raise PolicyError([PolicyIssue(source, None, None, "", message)]) from error
    problems = snapshot.consistent()
    if problems:
        raise PolicyError([PolicyIssue(source, None, None, "", p) for p in problems])
    return ir, snapshot


def build_policy_snapshot(
    policy: Policy,
    state: State,
    source: str,
    *,
    translate: Callable[[IR], Resources] | None = None,
) -> Snapshot:
    """The Envoy snapshot of :func:`resolve_and_snapshot`, for ``validate``/``render``."""
    return resolve_and_snapshot(policy, state, source, translate=translate)[1]
