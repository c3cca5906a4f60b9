"""resolve(policy, State) -> IR: defaults applied and runtime sources merged, in one place.

The IR (:mod:`inferway.resolve.ir`) is plain data the translator reads without deciding
anything; ``ir_to_yaml`` / ``ir_from_yaml`` make it golden-testable.
"""

from inferway.resolve.errors import ResolveError
from inferway.resolve.ir import IR
from inferway.resolve.ir.serialize import ir_from_yaml, ir_to_yaml
from inferway.resolve.policy import resolve_policy

__all__ = ["IR", "ResolveError", "ir_from_yaml", "ir_to_yaml", "resolve_policy"]
