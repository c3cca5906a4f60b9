"""The development CA: what it mints is what mTLS peers will check."""

from __future__ import annotations

import ssl
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from typer.testing import CliRunner

from inferway.cli.main import app
from inferway.pki.bundle_files import bundle_paths, load_bundle, write_bundle
from inferway.pki.mint import build_ca, build_certificate, spiffe_id_for

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _sans(bundle) -> x509.SubjectAlternativeName:  # type: ignore[no-untyped-def]
    return bundle.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def test_ca_is_a_ca_valid_from_the_clock() -> None:
    ca = build_ca("test CA", days=10, now=NOW)
    cert = ca.certificate
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.not_valid_after_utc == NOW + timedelta(days=10)
    assert cert.not_valid_before_utc < NOW
    assert cert.issuer == cert.subject


def test_leaf_carries_spiffe_id_dns_and_ip_sans_and_usages() -> None:
    ca = build_ca(now=NOW)
    spiffe = spiffe_id_for("api")
    assert spiffe == "spiffe://inferway.local/ns/default/sa/api"
    leaf = build_certificate(
        ca,
        spiffe_id=spiffe,
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
        server=True,
        client=True,
        now=NOW,
    )
    sans = _sans(leaf)
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [spiffe]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    usages = leaf.certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert leaf.certificate.issuer == ca.certificate.subject
    leaf.certificate.verify_directly_issued_by(ca.certificate)


def test_expired_certificate_by_override() -> None:
    ca = build_ca(now=NOW)
    leaf = build_certificate(
        ca,
        spiffe_id=spiffe_id_for("old"),
        server=False,
        client=True,
        not_before=NOW - timedelta(days=30),
        not_after=NOW - timedelta(days=1),
        now=NOW,
    )
    assert leaf.certificate.not_valid_after_utc < NOW


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "at least one of"),
        ({"spiffe_id": "https://x", "server": True}, "spiffe://"),
        ({"dns_names": ["a"], "server": False, "client": False}, "server or client"),
    ],
)
def test_bad_requests_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_certificate(build_ca(now=NOW), **kwargs)


def test_repr_never_shows_the_key() -> None:
    bundle = build_ca()
    assert b"PRIVATE KEY" in bundle.key_pem
    assert "PRIVATE" not in repr(bundle) and bundle.key_pem.decode() not in repr(bundle)


def test_write_bundle_keys_0600_and_loads_into_ssl(tmp_path: Path) -> None:
    ca = build_ca()
    server = build_certificate(ca, dns_names=["localhost"], server=True)
    write_bundle(tmp_path, "ca", ca)
    paths = write_bundle(tmp_path, "server", server)
    assert stat.S_IMODE(paths.private_key.stat().st_mode) == 0o600
    assert load_bundle(tmp_path, "server") == server
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(paths.certificate, paths.private_key)
    context.load_verify_locations(bundle_paths(tmp_path, "ca").certificate)


def test_cli_init_then_issue(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "certs"
    result = runner.invoke(app, ["certs", "init", "--dir", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("ca", "server", "client"):
        assert f"{name}.pem" in result.output
        assert stat.S_IMODE((out / f"{name}-key.pem").stat().st_mode) == 0o600
    client = load_bundle(out, "client")
    uris = _sans(client).get_values_for_type(x509.UniformResourceIdentifier)
    assert uris == ["spiffe://inferway.local/ns/default/sa/client"]

    again = runner.invoke(app, ["certs", "init", "--dir", str(out)])
    assert again.exit_code == 1 and "--force" in again.output

    issued = runner.invoke(app, ["certs", "issue", "worker", "--dir", str(out), "--days", "2"])
    assert issued.exit_code == 0, issued.output
    worker = load_bundle(out, "worker")
    worker.certificate.verify_directly_issued_by(load_bundle(out, "ca").certificate)
    uris = _sans(worker).get_values_for_type(x509.UniformResourceIdentifier)
    assert uris == ["spiffe://inferway.local/ns/default/sa/worker"]


def test_cli_issue_without_ca_says_what_to_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["certs", "issue", "x", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "inferway certs init" in result.output
