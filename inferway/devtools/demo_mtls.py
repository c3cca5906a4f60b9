"""``inferway demo --mtls``: the development CA and certificates the demo mints for itself.

The same files serve three readers: Envoy's listener (server certificate, client CA), the
demo's own traffic (httpx presenting the client certificate) and the curl the demo prints for
a person to try, so they are written to disk rather than kept in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from inferway.pki.bundle_files import bundle_paths, write_bundle
from inferway.pki.mint import build_ca, build_certificate, spiffe_id_for

__all__ = ["CurlTls", "setup_demo_mtls"]


@dataclass(frozen=True)
class CurlTls:
    """The files a curl needs to call the demo's mutual-TLS listener."""

    ca: Path
    certificate: Path
    private_key: Path


def setup_demo_mtls(
    workdir: Path, console: Console
) -> tuple[dict[str, object], dict[str, object], CurlTls]:
    """Mint a development CA, a server and a client certificate (``inferway certs init``) and
    return the listener's mutual-TLS settings, the httpx options of a client presenting the
    client certificate, and the same files for a curl."""
    import ssl

    certs = workdir / "certs"
    ca = build_ca("inferway demo CA", days=1)
    server = build_certificate(
        ca,
        spiffe_id=spiffe_id_for("gateway"),
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
        server=True,
        days=1,
    )
    client = build_certificate(ca, spiffe_id=spiffe_id_for("client"), server=False, client=True)
    write_bundle(certs, "ca", ca)
    server_paths = write_bundle(certs, "server", server)
    client_paths = write_bundle(certs, "client", client)
    context = ssl.create_default_context(cafile=str(bundle_paths(certs, "ca").certificate))
    context.load_cert_chain(client_paths.certificate, client_paths.private_key)
    console.print(
        f"[green]✓[/green] mutual TLS: development CA and certificates in {certs}; only "
        f"{spiffe_id_for('client')} may call the listener"
    )
    tls: dict[str, object] = {
        "mode": "mutual",
        "certificate": str(server_paths.certificate),
        "private_key": str(server_paths.private_key),
        "client_ca": str(bundle_paths(certs, "ca").certificate),
        "allowed_identities": [spiffe_id_for("client")],
    }
    curl_tls = CurlTls(
        bundle_paths(certs, "ca").certificate, client_paths.certificate, client_paths.private_key
    )
    return tls, {"verify": context}, curl_tls
