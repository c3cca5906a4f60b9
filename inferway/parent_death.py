"""A child process that must not outlive its parent (Envoy under the gateway, the workers of
``inferway serve --workers``): Linux's ``PR_SET_PDEATHSIG``."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["set_parent_death_signal"]

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(
    sig: int = signal.SIGKILL, *, expected_parent: int | None = None
) -> None:
    """In a freshly forked child: ask Linux to send ``sig`` when the parent dies.

    Runs between fork and exec (``preexec_fn``). If the parent already died before the prctl
    took effect, the child is reparented, so it exits at once rather than run as an orphan.
    """
    if not sys.platform.startswith("linux"):
        return
    # The running program's own symbols (libc among them): no find_library, which would run
    # ldconfig in a subprocess between fork and exec.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        os._exit(127)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(127)
