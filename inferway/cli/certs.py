"""``inferway certs``: a development CA for the demo, the tests and first-time mTLS users.

``init`` mints a CA plus one server and one client certificate; ``issue`` signs more
certificates with an existing CA. Everything lands in one directory: ``<name>.pem`` and
``<name>-key.pem`` (private keys mode 0600). Not a production PKI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from inferway.console import make_console
from inferway.pki.bundle_files import BundlePaths, bundle_paths, load_bundle, write_bundle
from inferway.pki.mint import (
    DEFAULT_TRUST_DOMAIN,
    CertBundle,
    build_ca,
    build_certificate,
    spiffe_id_for,
)

__all__ = ["app"]

app = typer.Typer(
    name="certs",
    help="Development CA: mint a CA, server and client certificates with SPIFFE IDs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Directory = Annotated[
    Path, typer.Option("--dir", "-d", help="Where the PEM files are written.", file_okay=False)
]
TrustDomain = Annotated[str, typer.Option(help="SPIFFE trust domain.")]
Namespace = Annotated[str, typer.Option(help="Namespace part of the SPIFFE IDs.")]
Days = Annotated[int, typer.Option(min=1, help="Validity in days.")]


def _report(label: str, paths: BundlePaths, bundle: CertBundle) -> None:
    cert = bundle.certificate
    try:
        from cryptography import x509

        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = ", ".join(str(name.value) for name in sans)
    except Exception:  # a CA has no SAN
        names = cert.subject.rfc4514_string()
    until = cert.not_valid_after_utc.strftime("%Y-%m-%d")
    out = make_console()
    out.print(Text(f"  {label:<7} {paths.certificate}  ({names}; valid until {until})"))
    out.print(Text(f"  {'key':<7} {paths.private_key}  (mode 0600)"))


def _refuse_overwrite(directory: Path, names: list[str], force: bool) -> None:
    existing = [
        str(path)
        for name in names
        for path in (bundle_paths(directory, name).certificate,)
        if path.exists()
    ]
    if existing and not force:
        make_console(stderr=True).print(
            Text(f"refusing to overwrite {', '.join(existing)} (use --force)", style="red")
        )
        raise typer.Exit(1)


@app.command()
def init(
    directory: Directory = Path("certs"),
    trust_domain: TrustDomain = DEFAULT_TRUST_DOMAIN,
    namespace: Namespace = "default",
    server_name: Annotated[str, typer.Option(help="Workload name of the server cert.")] = (
        "gateway"
    ),
    client_name: Annotated[str, typer.Option(help="Workload name of the client cert.")] = (
        "client"
    ),
    dns: Annotated[
        list[str] | None, typer.Option("--dns", help="DNS SAN of the server cert (repeatable).")
    ] = None,
    ip: Annotated[
        list[str] | None, typer.Option("--ip", help="IP SAN of the server cert (repeatable).")
    ] = None,
    days: Days = 365,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
) -> None:
    """Mint ca.pem, server.pem and client.pem (and their keys) for a development setup."""
    _refuse_overwrite(directory, ["ca", "server", "client"], force)
    ca = build_ca(f"inferway development CA ({trust_domain})", days=days)
    server = build_certificate(
        ca,
        spiffe_id=spiffe_id_for(server_name, trust_domain=trust_domain, namespace=namespace),
        dns_names=dns or ["localhost"],
        ip_addresses=ip or ["127.0.0.1"],
        server=True,
        client=True,  # the same workload also dials upstreams with it
        days=days,
    )
    client = build_certificate(
        ca,
        spiffe_id=spiffe_id_for(client_name, trust_domain=trust_domain, namespace=namespace),
        server=False,
        client=True,
        days=days,
    )
    make_console().print(Text(f"wrote a development CA and two certificates to {directory}/"))
    for label, name, bundle in (
        ("ca", "ca", ca),
        ("server", "server", server),
        ("client", "client", client),
    ):
        _report(label, write_bundle(directory, name, bundle), bundle)


@app.command()
def issue(
    name: Annotated[str, typer.Argument(help="File stem: writes <name>.pem, <name>-key.pem.")],
    directory: Directory = Path("certs"),
    trust_domain: TrustDomain = DEFAULT_TRUST_DOMAIN,
    namespace: Namespace = "default",
    spiffe_id: Annotated[
        str | None, typer.Option(help="URI SAN (default: spiffe://<td>/ns/<ns>/sa/<name>).")
    ] = None,
    dns: Annotated[list[str] | None, typer.Option("--dns", help="DNS SAN (repeatable).")] = None,
    ip: Annotated[list[str] | None, typer.Option("--ip", help="IP SAN (repeatable).")] = None,
    server: Annotated[bool, typer.Option("--server/--no-server", help="serverAuth usage.")] = False,
    client: Annotated[bool, typer.Option("--client/--no-client", help="clientAuth usage.")] = True,
    days: Days = 90,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
) -> None:
    """Sign one more certificate with the CA in --dir (ca.pem, ca-key.pem)."""
    ca_paths = bundle_paths(directory, "ca")
    if not (ca_paths.certificate.exists() and ca_paths.private_key.exists()):
        make_console(stderr=True).print(
            Text(
                f"no CA in {directory}/ (need {ca_paths.certificate.name} and "
                f"{ca_paths.private_key.name}); run `inferway certs init --dir {directory}` first",
                style="red",
            )
        )
        raise typer.Exit(1)
    _refuse_overwrite(directory, [name], force)
    try:
        bundle = build_certificate(
            load_bundle(directory, "ca"),
            spiffe_id=spiffe_id
            or spiffe_id_for(name, trust_domain=trust_domain, namespace=namespace),
            dns_names=dns or [],
            ip_addresses=ip or [],
            server=server,
            client=client,
            days=days,
        )
    except ValueError as error:
        make_console(stderr=True).print(Text(str(error), style="red"))
        raise typer.Exit(2) from None
    make_console().print(Text(f"wrote {name} to {directory}/"))
    _report(name, write_bundle(directory, name, bundle), bundle)
