"""Mutual TLS between the supervised Envoy and the xDS server, as ``inferway run`` is told it.

Why a module of its own: the pieces (``XdsTls`` for the server, ``XdsClientTlsFiles`` for
the bootstrap) take PEM bytes and paths, but a person gives a directory minted by
``inferway certs init`` or a handful of file options. Here those become the two halves, and
every mistake that would otherwise show up as an Envoy that silently never gets config is
refused before anything starts: a missing or unreadable file, a private key others can read,
a file that is not a PEM certificate, or an Envoy certificate that does not name the node
(the xDS server would refuse its stream).

With ``--xds-mtls-dir DIR`` the files are those ``inferway certs init --dir DIR`` writes:
``server.pem``/``server-key.pem`` for the xDS server, ``ca.pem`` as the CA both sides trust,
and for Envoy ``<node-id>.pem``/``<node-id>-key.pem`` (``inferway certs issue <node-id>``)
when present, else ``client.pem``/``client-key.pem``.

Rotation needs no restart: ``XdsServerTlsReloader`` re-reads the server's files when they
change (checked before each new connection's handshake), and the supervised Envoy reads its
client certificate and the CA through file-based SDS, which watches the files. A rotation
that leaves a certificate and a key that do not belong together is refused, and the last good
pair keeps serving.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from inferway.pki.bundle_files import bundle_paths
from inferway.pki.keys import check_private_key_permissions, key_matches_certificate
from inferway.xds.auth import XdsClientTlsFiles, XdsTls, check_node_identity, peer_identities

__all__ = [
    "XdsMtlsError",
    "XdsMtlsFiles",
    "XdsServerTlsReloader",
    "load_xds_mtls",
    "load_xds_server_tls",
    "resolve_xds_mtls_files",
]

_log = logging.getLogger(__name__)


class XdsMtlsError(Exception):
    """The xDS mutual-TLS files cannot be used; the message says which file and why."""


@dataclass(frozen=True)
class XdsMtlsFiles:
    """Where the xDS mutual-TLS material is. The Envoy half is optional (``--no-envoy``)."""

    server_certificate: Path
    server_key: Path
    client_ca: Path
    """The CA that signs the Envoys' client certificates (the server requires one)."""
    envoy_certificate: Path | None = None
    envoy_key: Path | None = None
    server_ca: Path | None = None
    """The CA Envoy trusts for the server's certificate (default: ``client_ca``)."""
    server_name: str | None = None
    """When set: the SNI Envoy sends and the DNS SAN the server's certificate must carry."""


def resolve_xds_mtls_files(
    *,
    directory: Path | None = None,
    node_id: str = "inferway",
    server_certificate: Path | None = None,
    server_key: Path | None = None,
    client_ca: Path | None = None,
    envoy_certificate: Path | None = None,
    envoy_key: Path | None = None,
    server_ca: Path | None = None,
    server_name: str | None = None,
) -> XdsMtlsFiles | None:
    """The files from a certs directory and/or explicit paths (explicit ones win); None when
    nothing was given (xDS stays plaintext). Raises XdsMtlsError when a part is missing."""
    given = (server_certificate, server_key, client_ca, envoy_certificate, envoy_key, server_ca)
    if directory is None and all(value is None for value in given) and server_name is None:
        return None
    if directory is not None:
        if not directory.is_dir():
            raise XdsMtlsError(
                f"--xds-mtls-dir {directory} is not a directory; mint one with "
                f"`inferway certs init --dir {directory}`"
            )
        server = bundle_paths(directory, "server")
        envoy = bundle_paths(directory, node_id)
        if not envoy.certificate.exists():
            envoy = bundle_paths(directory, "client")
        ca = bundle_paths(directory, "ca").certificate
        server_certificate = server_certificate or server.certificate
        server_key = server_key or server.private_key
        client_ca = client_ca or ca
        envoy_certificate = envoy_certificate or envoy.certificate
        envoy_key = envoy_key or envoy.private_key
        server_ca = server_ca or ca
    missing = [
        option
        for option, value in (
            ("--xds-tls-cert", server_certificate),
            ("--xds-tls-key", server_key),
            ("--xds-client-ca", client_ca),
        )
        if value is None
    ]
    if missing:
        raise XdsMtlsError(
            f"xDS mutual TLS needs the server's certificate, key and client CA: give "
            f"{', '.join(missing)} (or --xds-mtls-dir DIR from `inferway certs init`)"
        )
    if (envoy_certificate is None) != (envoy_key is None):
        raise XdsMtlsError("give both --xds-envoy-cert and --xds-envoy-key, or neither")
    assert server_certificate is not None and server_key is not None and client_ca is not None
    return XdsMtlsFiles(
        server_certificate=server_certificate,
        server_key=server_key,
        client_ca=client_ca,
        envoy_certificate=envoy_certificate,
        envoy_key=envoy_key,
        server_ca=server_ca,
        server_name=server_name,
    )


def load_xds_mtls(
    files: XdsMtlsFiles, *, node_id: str, with_envoy: bool = True
) -> tuple[XdsTls, XdsClientTlsFiles | None]:
    """Read and check everything: the server's credentials, and (``with_envoy``) the files
    the supervised Envoy's bootstrap names. Raises XdsMtlsError naming the file at fault."""
    server_tls = load_xds_server_tls(files)
    if not with_envoy:
        return server_tls, None
    if files.envoy_certificate is None or files.envoy_key is None:
        raise XdsMtlsError(
            "xDS mutual TLS: the supervised Envoy needs a client certificate; give "
            "--xds-envoy-cert and --xds-envoy-key (or --xds-mtls-dir), or run with --no-envoy"
        )
    envoy_certificate = _read_certificate(files.envoy_certificate, "Envoy's xDS client certificate")
    envoy_key = _read_private_key(files.envoy_key, "Envoy's xDS client private key")
    _check_pair(envoy_certificate, envoy_key, files.envoy_certificate, files.envoy_key)
    server_ca = files.server_ca or files.client_ca
    _read_certificate(server_ca, "CA of the xDS server certificate")
    identities = peer_identities({"x509_pem_cert": [envoy_certificate]})
    if not check_node_identity(node_id, identities):
        raise XdsMtlsError(
            f"Envoy's xDS client certificate {files.envoy_certificate} names "
            f"{', '.join(identities) or 'nothing'}, not node {node_id!r}: the xDS server would "
            f"refuse its stream. Issue one for the node (`inferway certs issue {node_id} --dir "
            f"{files.envoy_certificate.parent}`) or run with --node-id matching the certificate"
        )
    client_files = XdsClientTlsFiles(
        certificate=str(files.envoy_certificate.resolve()),
        private_key=str(files.envoy_key.resolve()),
        ca=str(server_ca.resolve()),
        server_name=files.server_name,
    )
    return server_tls, client_files


def load_xds_server_tls(files: XdsMtlsFiles) -> XdsTls:
    """The xDS server's certificate, its key (which must belong to it) and the client CA."""
    certificate = _read_certificate(files.server_certificate, "xDS server certificate")
    key = _read_private_key(files.server_key, "xDS server private key")
    _check_pair(certificate, key, files.server_certificate, files.server_key)
    client_ca = _read_certificate(files.client_ca, "xDS client CA")
    return XdsTls(certificate, key, client_ca)


class XdsServerTlsReloader:
    """Hands the xDS server fresh credentials after its files change on disk.

    Called by gRPC before each new connection's handshake, so it only compares file stamps
    (inode, size, mtime) unless something changed. A changed set that does not load (a
    half-finished rotation, a key that is not the certificate's) is logged once and skipped:
    the last good credentials keep serving, and the next change is tried again."""

    def __init__(self, files: XdsMtlsFiles) -> None:
        self._files = files
        self._paths = (files.server_certificate, files.server_key, files.client_ca)
        self._loaded = _stamp(self._paths)
        self._refused: tuple[tuple[int, int, int] | None, ...] | None = None

    def __call__(self) -> XdsTls | None:
        stamp = _stamp(self._paths)
        if stamp == self._loaded or stamp == self._refused:
            return None
        try:
            fresh = load_xds_server_tls(self._files)
        except XdsMtlsError as error:
            self._refused = stamp
            _log.warning("xDS TLS files changed but cannot be used (%s); keeping the last", error)
            return None
        self._loaded = stamp
        _log.info("xDS TLS: reloaded %s", self._files.server_certificate)
        return fresh


def _stamp(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    stamps: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(stamps)


def _check_pair(certificate: bytes, key: bytes, certificate_path: Path, key_path: Path) -> None:
    """TLS fails late and vaguely on a key that is not the certificate's: say it here."""
    try:
        private_key = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as error:
        raise XdsMtlsError(
            f"xDS mutual TLS: cannot load the private key {key_path}: {error}"
        ) from None
    if not key_matches_certificate(x509.load_pem_x509_certificates(certificate)[0], private_key):
        raise XdsMtlsError(
            f"xDS mutual TLS: the private key {key_path} does not belong to the certificate "
            f"{certificate_path}"
        )


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        reason = error.strerror or str(error)
        raise XdsMtlsError(f"xDS mutual TLS: cannot read the {what} {path}: {reason}") from None


def _read_certificate(path: Path, what: str) -> bytes:
    data = _read(path, what)
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError:
        raise XdsMtlsError(f"xDS mutual TLS: the {what} {path} is not a PEM certificate") from None
    return data


def _read_private_key(path: Path, what: str) -> bytes:
    data = _read(path, what)
    unsafe = check_private_key_permissions(path)
    if unsafe is not None:
        raise XdsMtlsError(f"xDS mutual TLS: the {what}: {unsafe}")
    if b"PRIVATE KEY-----" not in data:
        raise XdsMtlsError(f"xDS mutual TLS: the {what} {path} is not a PEM private key")
    return data
