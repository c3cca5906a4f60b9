"""Rotating the xDS server's own certificate: the reloader hands gRPC fresh credentials only
after the files changed and only when they still form a usable set; a rotation caught half
way (a new certificate beside the old key) keeps the last good credentials."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from inferway.gateway.xds_mtls import (
    XdsMtlsError,
    XdsMtlsFiles,
    XdsServerTlsReloader,
    load_xds_server_tls,
)
from inferway.pki.bundle_files import write_bundle
from inferway.pki.mint import build_ca, build_certificate
from inferway.xds.auth import XdsClientTlsFiles
from inferway.xds.bootstrap import build_bootstrap, write_xds_client_secrets


@pytest.fixture
def files(tmp_path: Path) -> XdsMtlsFiles:
    ca = build_ca("test CA")
    write_bundle(tmp_path, "ca", ca)
    write_bundle(tmp_path, "server", build_certificate(ca, dns_names=["xds.local"]))
    return XdsMtlsFiles(tmp_path / "server.pem", tmp_path / "server-key.pem", tmp_path / "ca.pem")


def test_unchanged_files_are_not_read_again(files: XdsMtlsFiles) -> None:
    reload = XdsServerTlsReloader(files)
    assert reload() is None
    assert reload() is None


def test_a_rotated_certificate_is_handed_over_once(files: XdsMtlsFiles) -> None:
    reload = XdsServerTlsReloader(files)
    ca = build_ca("test CA 2")
    write_bundle(files.client_ca.parent, "ca", ca)
    write_bundle(files.client_ca.parent, "server", build_certificate(ca, dns_names=["xds.local"]))
    fresh = reload()
    assert fresh is not None
    assert fresh.certificate_chain == files.server_certificate.read_bytes()
    assert fresh.client_ca == ca.cert_pem
    assert reload() is None


def test_a_half_done_rotation_keeps_the_last_good_pair(
    files: XdsMtlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    reload = XdsServerTlsReloader(files)
    ca = build_ca("test CA")
    new = build_certificate(ca, dns_names=["xds.local"])
    files.server_certificate.write_bytes(new.cert_pem)  # the key is still the old one
    with caplog.at_level(logging.WARNING):
        assert reload() is None
        assert reload() is None  # the same refused state is not re-read or re-logged
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "does not belong to the certificate" in warning.getMessage()
    assert "keeping the last" in warning.getMessage()
    files.server_key.write_bytes(new.key_pem)  # the rotation completes
    fresh = reload()
    assert fresh is not None and fresh.private_key == new.key_pem


def test_a_key_that_is_not_the_certificates_is_refused_at_start(files: XdsMtlsFiles) -> None:
    other = build_certificate(build_ca("x"), dns_names=["xds.local"])
    files.server_key.write_bytes(other.key_pem)
    with pytest.raises(XdsMtlsError, match=r"server-key\.pem does not belong to the certificate"):
        load_xds_server_tls(files)


def test_bootstrap_reads_the_client_files_through_file_sds(tmp_path: Path) -> None:
    tls = XdsClientTlsFiles("/c/n.pem", "/c/n-key.pem", "/c/ca.pem", "xds.local")
    written = write_xds_client_secrets(tmp_path, tls)
    boot = build_bootstrap(
        node_id="n", xds_port=18000, admin_port=0, xds_tls=tls, xds_tls_sds_dir=tmp_path
    )
    context = boot["static_resources"]["clusters"][0]["transport_socket"]["typed_config"]
    common = context["common_tls_context"]
    assert "tls_certificates" not in common  # nothing read once and kept
    paths = {
        common["tls_certificate_sds_secret_configs"][0]["sds_config"]["path_config_source"]["path"],
        common["combined_validation_context"]["validation_context_sds_secret_config"]["sds_config"][
            "path_config_source"
        ]["path"],
    }
    assert paths == {str(p.resolve()) for p in written}
    assert common["combined_validation_context"]["default_validation_context"] == {
        "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": "xds.local"}}]
    }
    assert context["sni"] == "xds.local"
