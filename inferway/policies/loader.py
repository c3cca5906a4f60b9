"""Load a policy file: YAML with positions -> schema -> semantic checks, all errors at once.

A bad policy must never replace a good one, and the person who wrote it should fix every
mistake in one pass, so every stage reports all it finds as one :class:`PolicyError`.
Semantic checks only run on a policy that fits the schema (they need a typed Policy).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from inferway.policies.checks import check_policy
from inferway.policies.errors import PolicyError, PolicyIssue, read_source_text
from inferway.policies.located import (
    boolean_number_issues,
    describe_value,
    in_file_order,
    locate_issue,
    parse_located,
    validation_issues,
)
from inferway.policies.model import Policy

__all__ = ["load_policy", "load_policy_text"]


def load_policy(path: str | Path, *, external_endpoints: bool = False) -> Policy:
    """Read and validate the policy at ``path``; errors name the path as given."""
    text = read_source_text(path)
    return load_policy_text(text, str(path), external_endpoints=external_endpoints)


def load_policy_text(
    text: str, source: str = "<string>", *, external_endpoints: bool = False
) -> Policy:
    """Validate policy YAML ``text``; ``source`` is the file name used in errors.
    ``external_endpoints``: endpoints come from a file named elsewhere (see check_policy)."""
    document, issues = parse_located(text, source)
    if document.data is None:
        issues.append(
            PolicyIssue(
                source,
                1,
                1,
                "",
                "the policy is empty; expected a mapping with listeners, services and routes",
            )
        )
        raise PolicyError(issues)
    if not isinstance(document.data, dict):
        mark = document.position(())
        issues.append(
            PolicyIssue(
                source,
                mark.line,
                mark.column,
                "",
                f"expected a mapping with listeners, services and routes at the top level, "
                f"got {describe_value(document.data)}",
            )
        )
        raise PolicyError(issues)

    issues.extend(boolean_number_issues(document, source, Policy))
    try:
        policy = Policy.model_validate(document.data)
    except ValidationError as error:
        issues.extend(validation_issues(error, document, source, Policy))
        raise PolicyError(in_file_order(issues)) from None

    for loc, message in check_policy(policy, external_endpoints=external_endpoints):
        issues.append(locate_issue(document, source, loc, message))
    if issues:
        raise PolicyError(in_file_order(issues))
    return policy
