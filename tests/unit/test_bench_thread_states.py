"""bench/thread_states.py: where a thread client's threads wait (on the server, on the GIL, on
a CPU), read from the kernel for a real process whose threads the test placed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from bench.thread_clients import THREAD_NAME, name_os_thread
from bench.thread_states import UNSHOWN, ThreadStateSampler, _stat_fields, classify

# 3 client threads asleep on a socket, 2 on a lock (a futex, as the GIL is), 1 spinning in C
# that releases the GIL, all named as bench/thread_clients.py names its own; one helper thread
# unnamed, asleep on the socket too; the main thread asleep (never counted: the harness's).
CHILD = """
import ctypes, hashlib, socket, sys, threading, time
a, b = socket.socketpair()
lock = threading.Lock(); lock.acquire()
big = bytes(1 << 20)
libc = ctypes.CDLL(None)
def named(work, *args):
    def run():
        libc.prctl(15, b"iw-client", 0, 0, 0)
        work(*args)
    return run
def spin():
    while True:
        hashlib.sha256(big).digest()
for _ in range(3):
    threading.Thread(target=named(a.recv, 1), daemon=True).start()
for _ in range(2):
    threading.Thread(target=named(lock.acquire), daemon=True).start()
threading.Thread(target=named(spin), daemon=True).start()
threading.Thread(target=a.recv, args=(1,), daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"""


def test_states_are_classified_by_where_a_thread_sleeps() -> None:
    assert classify("R", "") == "cpu"
    assert classify("S", "futex_do_wait") == "gil"
    assert classify("S", "futex_wait_queue") == "gil"
    assert classify("S", "do_sys_poll") == "server"
    assert classify("D", "wait_woken") == "server"
    assert classify("Z", "0") is None
    assert classify("T", "do_signal_stop") is None
    assert classify("S", "0") == UNSHOWN  # caught waking, or a kernel that hides it: no guess


def test_the_state_is_read_after_the_last_parenthesis() -> None:
    assert _stat_fields(b"1234 (py (x) y) S 1 2 3") == ("py (x) y", "S")
    assert _stat_fields(b"7 (python) R 1 7 7") == ("python", "R")


def test_a_process_threads_are_counted_where_they_wait() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.2)  # every thread reached its wait
        with ThreadStateSampler(child.pid, interval_s=0.01, comm=THREAD_NAME, threads=6) as sampler:
            time.sleep(0.4)
        means = sampler.means()
        assert sampler.failure is None, sampler.failure  # e.g. a kernel that hides wchan
        assert sampler.unshown_share == 0  # nobody woke or slept meanwhile
        assert means is not None and sampler.samples >= 10
        assert means["server"] == pytest.approx(3, abs=0.01)
        assert means["gil"] == pytest.approx(2, abs=0.01)
        # the spinner is on a core or waiting for one, and now and then takes the GIL back
        assert 0.5 <= means["cpu"] <= 1.0
        assert sum(means.values()) == pytest.approx(6, abs=0.5)

        with ThreadStateSampler(child.pid, interval_s=0.01) as unnamed:  # every thread
            time.sleep(0.2)
        every = unnamed.means()
        assert every is not None and every["server"] == pytest.approx(4, abs=0.01)

        with ThreadStateSampler(
            child.pid, interval_s=0.01, comm=THREAD_NAME, threads=7
        ) as wrong_count:
            time.sleep(0.1)
        assert wrong_count.samples == 0 and wrong_count.means() is None  # 6 seen, not 7
    finally:
        child.kill()
        child.wait(10)


def test_a_process_that_is_gone_is_a_failure_not_a_count() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(10)
    with ThreadStateSampler(child.pid, interval_s=0.01) as sampler:
        time.sleep(0.05)
    assert sampler.means() is None
    assert sampler.failure is not None and "FileNotFoundError" in sampler.failure


def test_a_client_thread_is_named_in_the_kernel() -> None:
    seen: list[str] = []

    def work() -> None:
        name_os_thread(THREAD_NAME)
        with open("/proc/thread-self/comm") as f:
            seen.append(f.read().strip())

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert seen == [THREAD_NAME]
