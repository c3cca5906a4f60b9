"""Runtime state: every input besides the policy file, as one immutable value.

Sources (the endpoints file, certificate files, and next the rollout controller and the
autoscaler) each write into a ``State``; ``inferway.resolve`` merges it with the policy.
A controller never edits the user's policy: it writes an override here, so undoing its
decision is a State change.
"""

from inferway.state.model import ServiceEndpoints, State, TlsMaterial, WeightOverrides

__all__ = ["ServiceEndpoints", "State", "TlsMaterial", "WeightOverrides"]
