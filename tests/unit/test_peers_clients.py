"""bench/peers.py's thread-per-connection clients and its summary: the clients open the
connections they say (one per thread kept alive, or one per request) and send the counts
they say, and every ratio is to Mosec's figure of the same round and client."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from bench.core_pinning import pin_tree, split_cores
from bench.peers_report import summarize
from bench.thread_clients import ThreadCell, run_thread_cell, thread_sched


class _Counting(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless the client says Connection: close
    seen: list[tuple[int, bytes]] = []  # (client port, body) per request
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            self.seen.append((self.client_address[1], body))
        answer = b'{"outputs": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def server() -> Iterator[int]:
    _Counting.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("keepalive", [True, False])
def test_thread_clients_send_the_counts_over_the_connections_they_say(
    server: int, keepalive: bool
) -> None:
    cell = ThreadCell("127.0.0.1", server, "/infer", b'{"x": 1}', 4, keepalive, 10, 40)
    result = run_thread_cell(cell)
    assert result["errors"] == []
    assert len(result["latencies_s"]) == 40  # the warm-up's are not measured
    assert result["elapsed_s"] > 0
    assert len(_Counting.seen) == 50
    assert {body for _, body in _Counting.seen} == {b'{"x": 1}'}
    ports = {port for port, _ in _Counting.seen}
    if keepalive:  # one connection per thread and phase
        assert len(ports) <= 2 * 4
    else:  # urllib: a new connection per request
        assert len(ports) == 50


def test_a_refused_server_is_counted_as_errors_not_hidden() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    cell = ThreadCell("127.0.0.1", port, "/infer", b"{}", 2, False, 0, 6)
    result = run_thread_cell(cell)
    assert result["latencies_s"] == []
    assert len(result["errors"]) == 6
    assert all("refused" in error.lower() for error in result["errors"])


def _point(server: str, round_: int, client: str, rps: float, p99: float) -> dict[str, object]:
    return {
        "server": server,
        "round": round_,
        "client": client,
        "connections": "new",
        "concurrency": 64,
        "throughput": rps,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "errors": 0,
    }


def test_ratios_are_to_mosec_of_the_same_round_and_client() -> None:
    points = [
        _point("aiohttp", 0, "threads", 100, 10),
        _point("mosec", 0, "threads", 200, 20),
        _point("inferway-fast", 0, "threads", 300, 30),
        _point("aiohttp", 1, "threads", 50, 10),
        _point("mosec", 1, "threads", 100, 40),
        _point("inferway-fast", 1, "threads", 100, 10),
        _point("aiohttp", 0, "loadgen", 100, 10),
        _point("mosec", 0, "loadgen", 400, 20),
        _point("inferway-fast", 0, "loadgen", 400, 5),
    ]
    rows = {(r["server"], r["client"]): r for r in summarize(points, ["inferway-fast", "mosec"])}
    threads = rows["inferway-fast", "threads"]
    assert threads["ratio_to_mosec"] == pytest.approx((1.5 + 1.0) / 2)  # per round, then median
    assert threads["mosec_p99_ms"] == pytest.approx(30)
    assert threads["ratio_to_aiohttp"] == pytest.approx((3.0 + 2.0) / 2)
    assert rows["inferway-fast", "loadgen"]["ratio_to_mosec"] == pytest.approx(1.0)
    assert rows["mosec", "threads"]["ratio_to_mosec"] == pytest.approx(1.0)


def test_thread_clients_report_what_the_scheduler_did_with_them(server: int) -> None:
    cell = ThreadCell("127.0.0.1", server, "/infer", b"{}", 4, False, 0, 20)
    result = run_thread_cell(cell)
    assert result["errors"] == []
    if not Path("/proc/thread-self/sched").exists():  # a kernel without CONFIG_SCHED_DEBUG
        assert result["sched"] is None
        return
    sched = result["sched"]
    assert set(sched) == {"migrations", "voluntary_switches", "involuntary_switches"}
    assert all(isinstance(v, int) and v >= 0 for v in sched.values())
    # every thread waited for its answers at least once per request it sent, in recv
    assert sched["voluntary_switches"] >= 20


def test_thread_sched_reads_this_threads_counts() -> None:
    counts = thread_sched()
    if not Path("/proc/thread-self/sched").exists():
        assert counts is None
        return
    assert counts is not None
    before = counts["voluntary_switches"]
    time.sleep(0.01)  # a sleep is a voluntary switch
    after = thread_sched()
    assert after is not None and after["voluntary_switches"] > before


def test_pin_tree_moves_every_thread_of_a_process_and_its_children() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        with pytest.raises(SystemExit, match="needs two cores"):
            split_cores()
        return
    client, servers = split_cores()
    assert client == {cpus[0]} and servers == set(cpus[1:])
    code = (
        "import subprocess, sys, threading, time; "
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
        "print(child.pid, flush=True); time.sleep(30)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        pin_tree(parent.pid, client)
        for pid in (parent.pid, child_pid):
            for thread in psutil.Process(pid).threads():
                assert os.sched_getaffinity(thread.id) == client
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait(10)
