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


def _listening_output(repo: Path, host: str) -> tuple[str, str]:
    """stdout and stderr of ``serve --host host`` once it said where it listens (then it is
    stopped)."""
    process = subprocess.Popen(
        [*SERVE, str(repo), "--host", host, "--http-port", "0", "--grpc-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        seen = []
        for line in process.stdout:
            seen.append(line)
            if "gRPC" in line:
                break
    finally:
        process.terminate()
        rest, errors = process.communicate(timeout=30)
    return "".join(seen) + rest, errors


def test_serving_off_loopback_warns_as_run_does(tmp_path: Path) -> None:
    """Issue 33 item 12: ``run`` warned for a non-loopback admin API, ``serve --host 0.0.0.0``
    said nothing, although anyone reaching it can infer and load or unload models."""
    out, errors = _listening_output(tmp_path, "0.0.0.0")
    assert "gRPC  0.0.0.0:" in out, out + errors
    assert (
        "warning: serving on 0.0.0.0, not loopback, without client certificates: anyone who "
        "reaches it can run inference and load or unload models (/v2/repository)"
    ) in errors, errors
    out, errors = _listening_output(tmp_path, "127.0.0.1")
    assert "gRPC  127.0.0.1:" in out and "warning" not in errors, out + errors
