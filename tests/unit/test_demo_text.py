"""The demo's "keeps running" panel prints commands that work as printed: with --mtls the
curl presents the client certificate the demo minted and trusts its CA."""

from __future__ import annotations

import shlex
from pathlib import Path

from inferway.devtools.demo import CurlTls, build_keep_running_text

URL = "https://127.0.0.1:10000"
ADMIN = "http://127.0.0.1:15000"


def curl_argv(text: str) -> list[str]:
    line = text.split("status:")[0].removeprefix("try it:").replace("\\\n", " ")
    return shlex.split(line)


def test_plain_demo_curl_has_no_tls_options(tmp_path: Path) -> None:
    text = build_keep_running_text(
        URL.replace("https", "http"), ADMIN, tmp_path / "policy.yaml", tmp_path / "request.json"
    )
    argv = curl_argv(text)
    assert argv[0] == "curl" and not any(a in argv for a in ("--cert", "--key", "--cacert"))
    assert f"inferway status --admin {ADMIN}" in text


def test_mtls_demo_curl_presents_the_minted_client_certificate(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    files = CurlTls(certs / "ca.pem", certs / "client.pem", certs / "client-key.pem")
    text = build_keep_running_text(
        URL, ADMIN, tmp_path / "policy.yaml", tmp_path / "request.json", files
    )
    argv = curl_argv(text)
    assert argv[0] == "curl"
    options = dict(zip(argv[1:-3:2], argv[2:-3:2], strict=True))
    assert options == {
        "--cacert": str(certs / "ca.pem"),
        "--cert": str(certs / "client.pem"),
        "--key": str(certs / "client-key.pem"),
    }
    assert argv[-3:] == [f"{URL}/v2/models/demo/infer", "-d", f"@{tmp_path / 'request.json'}"]
