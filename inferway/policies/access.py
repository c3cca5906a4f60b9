"""Access control and redaction in the policy: who may call a route, and what never gets logged.

A route's ``access`` has ``allow`` and ``deny`` rule lists. How they combine (the one rule to
remember):

* **deny wins**: a request matching any deny rule is refused, even if it is also allowed;
* **if any allow rule exists, anything not allowed is refused**; with no allow rules, everything
  not denied passes.

A rule matches when **every** field it gives matches (``identities`` AND ``source_ips`` AND
``headers``); within a field, **any** entry is enough (identity A OR identity B). A rule must
give at least one field. Refused requests get HTTP 403 with a JSON body naming the route.

``identities`` are client-certificate identities (a SPIFFE ID or other SAN; ``*`` matches any
run of characters), so they only mean something on listeners that require client
certificates. ``source_ips`` are CIDRs matched against the connection's peer address, never
against ``X-Forwarded-For`` (a client can write that header itself).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

__all__ = [
    "Access",
    "AccessHeader",
    "AccessRule",
    "RedactHeaders",
    "normalize_header_names",
]

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9a-z-]+$")
"""An HTTP header field name (RFC 9110 token), lowercase."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


def _cidr(value: str) -> str:
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError as error:
        raise ValueError(
            f"expected a CIDR such as 10.0.0.0/8, 127.0.0.1/32 or ::1/128, got {value!r} ({error})"
        ) from None
    return str(network)


class AccessHeader(_Model):
    """A request header a rule requires: exactly one of exact, prefix or present."""

    name: str = Field(min_length=1)
    exact: str | None = None
    prefix: str | None = None
    present: bool | None = None

    @field_validator("name")
    @classmethod
    def _lower(cls, value: str) -> str:
        return normalize_header_names([value])[0]

    @model_validator(mode="after")
    def _exactly_one(self) -> AccessHeader:
        given = [k for k in ("exact", "prefix", "present") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of exact, prefix or present (got {', '.join(given) or 'none'})"
            )
        if self.present is False:
            raise ValueError(
                "present: false would match requests without the header; use a deny rule "
                "with present: true, or an allow rule that requires it"
            )
        return self


class AccessRule(_Model):
    """One rule: every field given must match; within a field, any entry matches."""

    identities: list[Annotated[str, Field(min_length=1)]] | None = None
    """Client-certificate identities (URI/DNS SAN or subject); ``*`` matches any run of
    characters, as in a listener's ``allowed_identities`` (``spiffe://td/ns/*/sa/monitor``)."""
    source_ips: list[str] | None = None
    """CIDRs of the connection's peer address."""
    headers: list[AccessHeader] | None = None
    """Request headers, e.g. ``{name: x-api-key, exact: ...}``; all listed must match."""

    @field_validator("source_ips")
    @classmethod
    def _cidrs(cls, values: list[str] | None) -> list[str] | None:
        return None if values is None else [_cidr(v) for v in values]

    @model_validator(mode="after")
    def _not_empty(self) -> AccessRule:
        given = [k for k in ("identities", "source_ips", "headers") if getattr(self, k)]
        if not given:
            raise ValueError(
                "a rule needs at least one non-empty field: identities, source_ips or headers"
            )
        return self


class Access(_Model):
    """Who may use a route: deny wins; with allow rules, whatever is not allowed is refused."""

    allow: list[AccessRule] = Field(default_factory=list)
    deny: list[AccessRule] = Field(default_factory=list)

    @property
    def restricts(self) -> bool:
        """False for an empty ``access: {}``, which lets everything through."""
        return bool(self.allow or self.deny)

    def rules(self) -> list[AccessRule]:
        return [*self.allow, *self.deny]


def normalize_header_names(values: list[str]) -> list[str]:
    """Lowercased, validated header names, duplicates dropped, order kept."""
    names: list[str] = []
    for value in values:
        name = value.strip().lower()
        if not _HEADER_NAME.match(name):
            raise ValueError(f"{value!r} is not an HTTP header name (e.g. x-api-key)")
        if name not in names:
            names.append(name)
    return names


RedactHeaders = Annotated[
    list[str], AfterValidator(normalize_header_names), Field(default_factory=list)
]
"""Policy-level ``redact_headers``: extra header names kept out of logs and traces."""
