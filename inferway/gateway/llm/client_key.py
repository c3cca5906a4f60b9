"""Who a request is from, as a label: never the raw key.

The policy names a header (``x-api-key`` by default); without it the ``Authorization:
Bearer`` token is used. Either way the value is hashed (SHA-256, first 16 hex digits): a
label, a log line or a limit's key never holds a credential, yet the same key always gets
the same label. ``hash: false`` is for a header that names a client rather than
authenticating it (``x-tenant``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

__all__ = ["ANONYMOUS", "client_key"]

ANONYMOUS = "anonymous"


def _digest(value: str) -> str:
    return "key-" + hashlib.sha256(value.encode()).hexdigest()[:16]


def client_key(headers: Mapping[str, str], header: str, *, hashed: bool = True) -> str:
    """``headers``: lower-case names. The label of the request's client key."""
    value = headers.get(header.lower(), "").strip()
    if value:
        return _digest(value) if hashed else value[:64]
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return _digest(token.strip())
    return ANONYMOUS
