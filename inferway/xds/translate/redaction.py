"""Which request headers a format string reads, so the access-log format and tracing custom
tags can be checked against the IR's ``redacted_headers`` (the credential headers inferway
always protects plus the policy's ``redact_headers``); the policy check refuses an
access-log field that would read one.
"""

from __future__ import annotations

import re

__all__ = ["header_reads"]

_HEADER_OPERATOR = re.compile(
    r"%(?:REQ|RESP|TRAILER|REQ_WITHOUT_QUERY|RESPONSE_TRAILER)\(([^)]*)\)", re.IGNORECASE
)


def header_reads(format_string: str) -> list[str]:
    """Every header an Envoy format string reads: ``%REQ(A?B):10%`` reads ``a`` and ``b``."""
    names: list[str] = []
    for inner in _HEADER_OPERATOR.findall(format_string):
        for name in inner.split("?"):
            name = name.strip().lower()
            if name and name not in names:
                names.append(name)
    return names
