"""Semantic checks for the observability section: access-log extra fields must not log a
header the policy asked to redact (``redact_headers``), just as they may never log the
credential headers the schema already refuses."""

from __future__ import annotations

from collections.abc import Iterator

from inferway.policies.model import Policy
from inferway.policies.observability import logged_headers
from inferway.policies.yaml_marks import Loc

__all__ = ["check_observability"]


def check_observability(policy: Policy) -> Iterator[tuple[Loc, str]]:
    observability = policy.observability
    if observability is None or observability.access_log is None:
        return
    redacted = set(getattr(policy, "redact_headers", ()))
    for name, fmt in observability.access_log.extra_fields.items():
        for header in logged_headers(fmt):
            if header in redacted:
                yield (
                    ("observability", "access_log", "extra_fields", name),
                    f"extra field {name!r} logs header {header!r}, which redact_headers keeps "
                    "out of logs; drop the field or the redaction",
                )
