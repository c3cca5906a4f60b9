"""``inferway serve`` off loopback warns (issue 33, item 12): the backend has no authentication
but client certificates, so an address others reach is said out loud, as ``run`` does for its
admin API. Pure: the warning from the host and the TLS settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.backends.tls import BackendTls
from inferway.cli.serve_options import exposure_warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_is_quiet(host: str) -> None:
    assert exposure_warning(host, None) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "backend.example.com"])
def test_any_other_address_warns_naming_it_and_the_fix(host: str) -> None:
    warning = exposure_warning(host, None)
    assert warning is not None and warning.startswith(f"warning: serving on {host}, not loopback")
    assert "--require-client-cert" in warning


def test_required_client_certificates_are_authentication_enough() -> None:
    pem = Path("/x.pem")
    assert exposure_warning("0.0.0.0", BackendTls(pem, pem, pem, True)) is None
    assert exposure_warning("0.0.0.0", BackendTls(pem, pem, None, False)) is not None
