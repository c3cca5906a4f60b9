"""The policy: inferway's single source of desired state, loaded with located errors."""

from inferway.policies.checks import check_policy
from inferway.policies.dump import dump_policy
from inferway.policies.errors import PolicyError, PolicyIssue
from inferway.policies.loader import load_policy, load_policy_text
from inferway.policies.model import (
    Backend,
    Endpoint,
    HeaderMatch,
    Listener,
    PathMatch,
    Policy,
    Retries,
    Route,
    RouteMatch,
    Service,
)
from inferway.policies.types import Duration, parse_duration, split_host_port

__all__ = [
    "Backend",
    "Duration",
    "Endpoint",
    "HeaderMatch",
    "Listener",
    "PathMatch",
    "Policy",
    "PolicyError",
    "PolicyIssue",
    "Retries",
    "Route",
    "RouteMatch",
    "Service",
    "check_policy",
    "dump_policy",
    "load_policy",
    "load_policy_text",
    "parse_duration",
    "split_host_port",
]
