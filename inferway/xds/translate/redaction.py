"""Which request headers Envoy must never write to access logs or trace tags.

The set is the credential headers inferway always protects (Authorization, cookies, API keys)
plus the policy's ``redact_headers``. The translator's access-log format and tracing custom
tags are checked against it (``header_reads`` finds every header a format string reads), and
the policy check refuses an access-log field that would read one.
"""

from __future__ import annotations

import re

from inferway.policies.access import ALWAYS_REDACTED_HEADERS
from inferway.policies.model import Policy

__all__ = ["header_reads", "redacted_headers"]

_HEADER_OPERATOR = re.compile(
    r"%(?:REQ|RESP|TRAILER|REQ_WITHOUT_QUERY|RESPONSE_TRAILER)\(([^)]*)\)", re.IGNORECASE
)


def redacted_headers(policy: Policy | None = None) -> list[str]:
    """Lowercase, sorted: the always-redacted credential headers plus ``redact_headers``."""
    extra = [] if policy is None else list(policy.redact_headers)
    return sorted({*ALWAYS_REDACTED_HEADERS, *(name.lower() for name in extra)})


def header_reads(format_string: str) -> list[str]:
    """Every header an Envoy format string reads: ``%REQ(A?B):10%`` reads ``a`` and ``b``."""
    names: list[str] = []
    for inner in _HEADER_OPERATOR.findall(format_string):
        for name in inner.split("?"):
            name = name.strip().lower()
            if name and name not in names:
                names.append(name)
    return names
