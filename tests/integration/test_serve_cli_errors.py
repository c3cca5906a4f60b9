"""``inferway serve``'s bad options and unusable addresses end in a usage error naming what to
change (exit 2, docs/cli.md), never a traceback or a silently wrapped port (issue 33, items 7
and 8). A real ``serve`` process on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from inferway.free_ports import free_port

pytestmark = pytest.mark.integration

SERVE = [sys.executable, "-m", "inferway.cli.entry", "serve"]


def _serve(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVE, str(repo), *args, "--log-format", "text"],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "option", [("--http-port", "70000"), ("--http-port", "-1"), ("--grpc-port", "65536")]
)
def test_a_port_out_of_range_is_a_usage_error(tmp_path: Path, option: tuple[str, str]) -> None:
    done = _serve(tmp_path, *option)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"Invalid value for '{option[0]}'" in done.stderr


def test_a_port_in_use_is_exit_2_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _serve(tmp_path, "--http-port", str(port), "--grpc-port", str(free_port()))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"cannot listen on 127.0.0.1 (HTTP port {port}" in done.stderr
    assert "in use" in done.stderr


def test_a_host_that_does_not_resolve_is_exit_2_naming_host(tmp_path: Path) -> None:
    done = _serve(tmp_path, "--host", "no such host.invalid", "--http-port", "0")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "cannot listen on 'no such host.invalid'" in done.stderr
    assert "(--host)" in done.stderr


def test_help_links_a_page_that_exists() -> None:
    done = subprocess.run([*SERVE, "--help"], capture_output=True, text=True, timeout=60)
    root = Path(__file__).resolve().parents[2]
    pages = {word.strip("().,;") for word in done.stdout.split() if word.startswith("(docs/")}
    pages |= {w.strip("().,;") for w in done.stdout.split() if w.startswith("docs/")}
    assert pages, done.stdout
    for page in pages:
        assert (root / page).is_file(), f"serve --help links {page}, which does not exist"
