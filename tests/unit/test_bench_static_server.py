"""bench/static_http_server.py, the fixed-answer servers of bench/peers.py: ``--close``
closes a ``Connection: close`` request's connection, ``--busy-us`` spends that CPU before each
answer, ``--sleep-us`` waits as long without the CPU, ``--spin-us`` keeps polling its loop after
each request, and bad options are refused."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from inferway.free_ports import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "static_http_server.py"
REQUEST = (
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Connection: close\r\n\r\n{}"
)


def _start(*options: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(port), *options])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"static_http_server.py exited with {proc.returncode}") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("static_http_server.py did not listen in 30 s")


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(10)


def _ask(port: int) -> bytes:
    """One request on a new connection; everything read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(REQUEST)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_close_answers_and_closes(started: list[subprocess.Popen[bytes]]) -> None:
    proc, port = _start("--close")
    started.append(proc)
    answer = _ask(port)  # returns only once the server has closed the connection
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nConnection: close\r\n" in answer
    assert answer.endswith(b"}")


@pytest.mark.parametrize("option", ["--busy-us", "--sleep-us"])
def test_busy_and_sleep_wait_before_each_answer(
    option: str, started: list[subprocess.Popen[bytes]]
) -> None:
    """Both answer one request at a time, each 40 ms after it came: ``--busy-us`` spends them
    as CPU, ``--sleep-us`` leaves the core free."""
    proc, port = _start("--close", option, "40000")
    started.append(proc)
    server = psutil.Process(proc.pid)
    cpu0 = sum(server.cpu_times()[:2])
    t0 = time.perf_counter()
    for _ in range(5):
        assert _ask(port).startswith(b"HTTP/1.1 200 OK")
    assert time.perf_counter() - t0 >= 5 * 0.040
    cpu = sum(server.cpu_times()[:2]) - cpu0
    if option == "--busy-us":
        assert cpu >= 0.1  # spent as CPU, not as a sleep
    else:
        assert cpu < 0.1  # slept: far under the 200 ms waited


def test_spin_keeps_polling_after_a_request(started: list[subprocess.Popen[bytes]]) -> None:
    proc, port = _start("--close", "--spin-us", "500000")
    started.append(proc)
    server = psutil.Process(proc.pid)
    time.sleep(0.2)
    idle0 = sum(server.cpu_times()[:2])
    time.sleep(0.3)
    idle = sum(server.cpu_times()[:2]) - idle0
    assert idle < 0.05  # no request yet: it sleeps in epoll
    cpu0 = sum(server.cpu_times()[:2])
    assert _ask(port).startswith(b"HTTP/1.1 200 OK")  # answered at once, then it polls
    time.sleep(0.6)
    assert sum(server.cpu_times()[:2]) - cpu0 >= 0.05


@pytest.mark.parametrize("option", ["--busy-us", "--spin-us", "--sleep-us"])
def test_a_negative_amount_is_refused(option: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "1", option, "-1"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "must be >= 0" in done.stderr
