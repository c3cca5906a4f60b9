"""Where a thread client's requests wait: sampled from the kernel, whatever the server.

A closed-loop client with ``C`` threads always has ``C`` requests somewhere. Each of its
threads is, at any instant, in one of three places, which ``/proc/<pid>/task/<tid>/stat`` (the
state) and ``.../wchan`` (where in the kernel a sleeping thread sleeps) tell apart:

- ``server``: asleep on a socket (connect, send, poll, recv): the request is the server's,
  from the client's send to the moment its answer wakes the thread;
- ``gil``: asleep on a futex: in the thread clients the only one is CPython's GIL, so the
  thread has its answer (or is about to send) and waits for the client's own interpreter;
- ``cpu``: running, or runnable and waiting for a core.

By Little's law the mean count in ``server`` over the throughput is the time a request spends
at the server, measured from the client's side with nothing asked of the server: the same
figure for inferway, Mosec or a fixed answer. Where most of the ``C`` wait in ``gil``, the
client, not the server, sets the rate (docs/serving-performance.md).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

__all__ = ["PLACES", "UNSHOWN", "ThreadStateSampler", "classify"]

PLACES = ("server", "gil", "cpu")


UNSHOWN = "unshown"
"""A sleeping thread whose ``wchan`` read ``0``: it was running when ``wchan`` was read and
asleep when ``stat`` was (a hand-over between the two reads), or the kernel hides it (no
kallsyms, a restricted ``kptr``): where it waits cannot be told, so it is not counted."""


def classify(state: str, wchan: str) -> str | None:
    """The place of a thread in ``state`` (stat's third field) sleeping at ``wchan``;
    ``UNSHOWN`` for a sleeper the kernel does not name; None for a state that is none of them
    (stopped, a zombie, being traced)."""
    if state == "R":
        return "cpu"
    if state not in ("S", "D"):
        return None
    if wchan.strip() in ("", "0"):
        return UNSHOWN
    return "gil" if "futex" in wchan else "server"


def _stat_fields(text: bytes) -> tuple[str, str]:
    """The name and the state letter of a ``stat`` line: ``pid (comm) S ...``, where the name
    may itself hold spaces and parentheses, so the last ``)`` ends it."""
    end = text.rindex(b")")
    return text[text.index(b"(") + 1 : end].decode(errors="replace"), text[
        end + 2 : end + 3
    ].decode()


@dataclass
class _Thread:
    stat: int
    wchan: int

    def close(self) -> None:
        os.close(self.stat)
        os.close(self.wchan)


@dataclass
class ThreadStateSampler:
    """Samples the threads of ``pid`` (all but its main one, which waits on the harness, or
    those named ``comm``) every ``interval_s`` on a thread of its own, from ``with`` to the end
    of the block.

    Files stay open and are re-read from offset 0, so a sample costs two ``pread`` calls a
    thread: about 0.65 ms of CPU for 64 threads, 3% of a core at the default 50 Hz, spent in
    the sampling process (the harness), not in the client or the server.
    """

    pid: int
    interval_s: float = 0.02
    comm: str | None = None
    """Count only the threads of this name (``/proc/.../comm``, as ``prctl(PR_SET_NAME)`` sets
    it): the client's own workers, not the interpreter's or a library's helper threads."""
    threads: int | None = None
    """Count only the samples that see this many threads (the client's ``C``): the others
    catch a phase's threads starting or ending, when fewer requests are in flight."""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PLACES, 0))
    samples: int = 0
    unshown: int = 0
    _threads: dict[int, _Thread] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _runner: threading.Thread | None = None
    failure: str | None = None

    def __enter__(self) -> ThreadStateSampler:
        self._runner = threading.Thread(target=self._run, name="thread-states", daemon=True)
        self._runner.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._runner is not None:
            self._runner.join()
        for thread in self._threads.values():
            thread.close()
        self._threads.clear()

    def means(self) -> dict[str, float] | None:
        """The mean number of threads in each place, or None without a sample, or where the
        kernel did not say where any thread slept (the reason is in ``failure``). Sleepers
        caught between two reads (``UNSHOWN``) are left out: ``unshown_share`` says how many."""
        named = self.counts["server"] + self.counts["gil"]
        if self.unshown and not named:
            self.failure = (
                f"the kernel named no place where a thread slept ({self.unshown} sleepers: "
                "/proc/<pid>/task/<tid>/wchan reads 0)"
            )
            return None
        if not self.samples:
            return None
        return {place: self.counts[place] / self.samples for place in PLACES}

    @property
    def unshown_share(self) -> float:
        """Of the threads seen, the share left out as ``UNSHOWN``."""
        seen = sum(self.counts.values()) + self.unshown
        return self.unshown / seen if seen else 0.0

    def _run(self) -> None:
        own = threading.get_native_id()  # not itself, where it samples its own process
        try:
            while not self._stop.wait(self.interval_s):
                if self._sample(own):
                    self.samples += 1
        except OSError as exc:  # the process is gone, or /proc is not there
            self.failure = f"{type(exc).__name__}: {exc}"

    def _sample(self, own: int) -> bool:
        tids = {int(t) for t in os.listdir(f"/proc/{self.pid}/task")} - {self.pid, own}
        for tid in set(self._threads) - tids:
            self._threads.pop(tid).close()
        counted = dict.fromkeys(PLACES, 0)
        unshown = 0
        for tid in tids:
            thread = self._threads.get(tid)
            try:
                if thread is None:
                    base = f"/proc/{self.pid}/task/{tid}"
                    stat = os.open(f"{base}/stat", os.O_RDONLY)
                    try:
                        wchan = os.open(f"{base}/wchan", os.O_RDONLY)
                    except OSError:
                        os.close(stat)
                        raise
                    thread = self._threads[tid] = _Thread(stat, wchan)
                # wchan first: a thread that wakes between the reads is then seen running
                wchan_text = os.pread(thread.wchan, 128, 0).decode()
                comm, state = _stat_fields(os.pread(thread.stat, 512, 0))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue  # the thread ended between the listing and the read
            if self.comm is not None and comm != self.comm:
                continue
            place = classify(state, wchan_text)
            if place == UNSHOWN:
                unshown += 1
            elif place is not None:
                counted[place] += 1
        seen = sum(counted.values()) + unshown
        if not seen or (self.threads is not None and seen != self.threads):
            return False  # nobody there, or a phase starting or ending: not all its threads
        self.unshown += unshown
        for place, count in counted.items():
            self.counts[place] += count
        return True
