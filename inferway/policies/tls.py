"""TLS in the policy: listener TLS/mTLS for clients, and TLS/mTLS from Envoy to services.

File paths are relative to the policy file. The files themselves never appear in Envoy's
config: the control plane reads them and sends the material to Envoy as SDS secrets, and
pushes new ones when the files change (certificate rotation without a restart).

``allowed_identities`` on a mutual listener decides who may send requests once the handshake
succeeded: an identity is the client certificate's first URI SAN (a SPIFFE ID such as
``spiffe://inferway.local/ns/default/sa/client``) or else its DNS SAN. ``*`` matches any run of
characters (a trailing ``*`` is a prefix match). A certificate from the trusted CA whose
identity is not allowed gets HTTP 403, not a handshake failure, so the client learns why.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferway.policies.types import FilePath

__all__ = ["ListenerTls", "ServiceTls", "TlsVersion"]

TlsVersion = Literal["1.2", "1.3"]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


def _coerce_version(value: object) -> object:
    # YAML reads `1.2` as a float; accept it as the string it looks like.
    return f"{value:g}" if isinstance(value, float) else value


class ListenerTls(_Model):
    """How a listener terminates TLS. ``mode: none`` is plain HTTP (the default without tls)."""

    mode: Literal["none", "tls", "mutual"] = "tls"
    certificate: FilePath | None = None
    """PEM certificate chain the listener presents."""
    private_key: FilePath | None = None
    """PEM private key of ``certificate``; must not be group/world readable (chmod 600)."""
    client_ca: FilePath | None = None
    """PEM CA bundle client certificates must chain to (``mutual`` only)."""
    min_version: TlsVersion = "1.2"
    allowed_identities: list[str] = Field(default_factory=list)
    """SPIFFE IDs or SAN patterns allowed to send requests (``mutual`` only; empty: any
    certificate from ``client_ca``)."""

    @field_validator("min_version", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        return _coerce_version(value)

    @field_validator("allowed_identities")
    @classmethod
    def _identities(cls, value: list[str]) -> list[str]:
        for identity in value:
            if not identity or identity.strip("*") == "":
                raise ValueError(
                    f"an allowed identity must name something, got {identity!r} "
                    "(to allow any certificate from client_ca, leave allowed_identities out)"
                )
            if any(ch.isspace() for ch in identity):
                raise ValueError(f"an identity has no whitespace, got {identity!r}")
        return value


class ServiceTls(_Model):
    """How Envoy connects to a service's replicas: plain, TLS, or TLS with a client cert."""

    mode: Literal["none", "tls", "mutual"] = "tls"
    ca: FilePath | None = None
    """PEM CA bundle the replicas' server certificates must chain to."""
    certificate: FilePath | None = None
    """PEM client certificate Envoy presents (``mutual``)."""
    private_key: FilePath | None = None
    """PEM private key of ``certificate`` (``mutual``; chmod 600)."""
    sni: str | None = None
    """Server name sent in the handshake and required in the replica's certificate SANs."""
