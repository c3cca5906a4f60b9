"""Clients and servers on cores of their own (``peers.py --pin-cores``), as if the client ran
on another host: a process tree's threads are moved with ``sched_setaffinity``, and the threads
and processes they start later inherit it."""

from __future__ import annotations

import os

import psutil

__all__ = ["pin_tree", "split_cores"]


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` and of its children on ``cpus``."""
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        for thread in proc.threads():
            os.sched_setaffinity(thread.id, cpus)


def split_cores() -> tuple[set[int], set[int]]:
    """The clients' core (the first this process may use) and the servers' (the rest)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit(f"--pin-cores needs two cores or more; this process may use {cpus}")
    return {cpus[0]}, set(cpus[1:])
