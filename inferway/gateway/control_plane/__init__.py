"""The gateway's one piece of state: which policy is live, and which edit was last refused
(:class:`ControlPlane` in plane.py; what it reports, applied or refused, in outcomes.py).

Applying a policy is resolve -> translate -> snapshot -> consistency check -> cache, all pure:
the runtime state (endpoints, certificates) arrives already read by its sources, so applying
does no I/O. Anything that fails on the way leaves the cache holding the last good snapshot: a
bad edit never replaces a good policy, it is recorded as refused so ``inferway status`` can
say why. That includes a snapshot an Envoy rejects after the push (a NACK): the cache goes back
to the last ACKed snapshot and the control plane to the policy and runtime state it was built
from, so the next edit and the next state change start from the last good policy, not from the
rejected one. :func:`build_policy_snapshot` is the same pipeline without the cache, for
``inferway validate`` and ``render``.
"""

from inferway.gateway.control_plane.outcomes import (
    AppliedPolicy,
    FileProblem,
    PolicyFollower,
    PolicyObserver,
    PolicyRefusedError,
    Refusal,
)
from inferway.gateway.control_plane.plane import DEGRADED_REJECTED, ControlPlane

__all__ = [
    "DEGRADED_REJECTED",
    "AppliedPolicy",
    "ControlPlane",
    "FileProblem",
    "PolicyFollower",
    "PolicyObserver",
    "PolicyRefusedError",
    "Refusal",
]
