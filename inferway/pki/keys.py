"""Checks on private keys read from disk: does it belong to the certificate, is it private.

Shared by the policy's TLS files, the xDS mTLS files and the backend's own TLS, so all three
refuse an unsafe or mismatched key with the same message.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

__all__ = ["check_private_key_permissions", "key_matches_certificate"]


def key_matches_certificate(certificate: x509.Certificate, private_key: object) -> bool:
    """Whether ``private_key`` (a loaded cryptography key) is the key of ``certificate``."""
    public = getattr(private_key, "public_key", None)
    if public is None:
        return False
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return bool(certificate.public_key().public_bytes(*fmt) == public().public_bytes(*fmt))


def check_private_key_permissions(path: Path) -> str | None:
    """A message when ``path`` is readable by its group or others (POSIX only), else None."""
    if os.name != "posix":
        return None
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return (
            f"private key {path} is accessible by group/others (mode {mode:04o}); "
            f"restrict it: chmod 600 {path}"
        )
    return None
