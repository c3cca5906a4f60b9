"""The endpoints file: each service's replicas, kept apart from the policy.

A deploy system (or a discovery sidecar) rewrites this file as replicas come and go, without
touching the policy a person reviews. It is loaded with the same located errors as the
policy, and a service it names must exist in the policy: a typo would otherwise leave a
service without the replicas meant for it.

    services:
      llama:
        - 10.0.0.1:8000
        - {address: 10.0.0.2:8000, zone: us-east-1b, weight: 2}
      embedder: []
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferway.policies.errors import PolicyError, PolicyIssue
from inferway.policies.located import (
    describe_kind,
    in_file_order,
    locate_issue,
    parse_located,
    validation_issues,
)
from inferway.policies.model import Endpoint, Policy
from inferway.policies.types import Name

__all__ = [
    "EndpointsFile",
    "ServiceEndpoints",
    "endpoints_file_path",
    "load_endpoints_text",
]

ServiceEndpoints = Mapping[str, tuple[Endpoint, ...]]
"""Service name -> its endpoints: what ``inferway.state.State.endpoints`` holds."""


class EndpointsFile(BaseModel):
    """The file's schema: ``services: {<service name>: [endpoint, ...]}``."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )

    services: dict[Name, list[Endpoint]] = Field(default_factory=dict)


def endpoints_file_path(policy: Policy, policy_path: str | Path) -> Path | None:
    """The policy's ``endpoints_file``, relative to the policy file's directory."""
    if policy.endpoints_file is None:
        return None
    path = Path(policy.endpoints_file).expanduser()
    return path if path.is_absolute() else Path(policy_path).parent / path


def _near_services(keys: Collection[object]) -> bool:
    """A key that is a typo of 'services' (reported as such, by name: it is nearly ours)."""
    return any(difflib.get_close_matches(str(key), ["services"], n=1, cutoff=0.75) for key in keys)


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def _unquoted(issue: PolicyIssue) -> PolicyIssue:
    """A YAML syntax issue without the fragments of the file the parser quotes."""
    message = _QUOTED.sub("(a character of the file)", issue.message)
    return dataclasses.replace(issue, message=message)


def load_endpoints_text(
    text: str, source: str = "<string>", *, services: Collection[str] | None = None
) -> ServiceEndpoints:
    """Validate endpoints YAML; ``services`` (the policy's service names), when given, is
    what the file may name. Raises PolicyError with every located issue."""
    try:
        document, issues = parse_located(text, source)
    except PolicyError as error:  # a syntax error: its message may quote the text
        raise PolicyError([_unquoted(issue) for issue in error.issues]) from None
    data = document.data
    if data is None:
        data = {}
    others = set(data) - {"services"} if isinstance(data, dict) else set()
    if not isinstance(data, dict) or (others and not _near_services(others)):
        # Not an endpoints file at all (``endpoints_file: /etc/passwd``): say so without
        # quoting a word of it, since the error is shown by ``GET /status``.
        got = f"a mapping with other keys ({len(others)})"
        if not isinstance(data, dict):
            got = describe_kind(data)
        mark = document.position(())
        raise PolicyError(
            [
                PolicyIssue(
                    source,
                    mark.line,
                    mark.column,
                    "",
                    "not an endpoints file: expected a mapping with only 'services' at the top "
                    f"level, got {got} (its content is not shown)",
                )
            ]
        )
    try:
        parsed = EndpointsFile.model_validate(data)
    except ValidationError as error:
        issues.extend(validation_issues(error, document, source, EndpointsFile))
        raise PolicyError(in_file_order(issues)) from None

    known = sorted(services) if services is not None else None
    for name, endpoints in parsed.services.items():
        if known is not None and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = (
                f" (did you mean '{close[0]}'?)"
                if close
                else f"; the policy's services: {', '.join(known) or '(none)'}"
            )
            message = f"service '{name}' is not in the policy{hint}"
            issues.append(locate_issue(document, source, ("services", name), message, at_key=True))
        first: dict[tuple[str, int], int] = {}
        for index, endpoint in enumerate(endpoints):
            key = (endpoint.host.lower(), endpoint.port)
            if key in first:
                issues.append(
                    locate_issue(
                        document,
                        source,
                        ("services", name, index),
                        f"duplicate endpoint {endpoint.host}:{endpoint.port} (also [{first[key]}])",
                    )
                )
            else:
                first[key] = index
    if issues:
        raise PolicyError(in_file_order(issues))
    return MappingProxyType({name: tuple(eps) for name, eps in sorted(parsed.services.items())})
