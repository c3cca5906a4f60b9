"""How many CPUs this process may use at once: its affinity mask, capped by a cgroup CPU quota.

The batch executor asks it where a CPU model's batch should run (``BatchingConfig.
compute_thread``): with at most one CPU, a worker thread cannot compute while the event loop
reads and answers, it can only take turns with it, and every hand-over costs two thread
switches; so the batch runs on the loop's own thread. A sidecar with ``resources.limits.cpu:
1``, a process started under ``taskset -c 1``, or a one-core VM all count as one.

The quota is read from cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``), from the process's own cgroup up to the hierarchy's root: the smallest
quota on the way is the one that binds. Missing files mean no quota. The figures can change
while the process runs (a pod resized in place, ``taskset -p``), so ``CpuAllowance`` reads them
again at most once every ``every_s`` seconds.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

__all__ = [
    "CpuAllowance",
    "affinity_cpus",
    "cgroup_quota_cpus",
    "describe_allowance",
    "process_allowance",
    "usable_cpus",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
RECHECK_EVERY_S = 1.0


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (``os.cpu_count()`` where there is no mask)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return max(len(getaffinity(0)), 1)
        except OSError:
            pass
    return max(os.cpu_count() or 1, 1)


def cgroup_quota_cpus(*, proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota binding this process, in CPUs (1.5: one and a half CPUs' time per
    period); None where no quota is set or no cgroup file can be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not hierarchy or not path.startswith("/"):
            continue
        if hierarchy == "0" and controllers == "":
            quotas += _quotas_along(root, path, _v2_quota)
        elif "cpu" in controllers.split(","):
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                if mount.is_dir():
                    quotas += _quotas_along(mount, path, _v1_quota)
                    break
    return min(quotas) if quotas else None


def _quotas_along(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """Every quota set from the cgroup at ``path`` under ``mount`` up to ``mount`` itself (a
    container sees its own cgroup as the root; its parents' files are then out of sight)."""
    found = []
    at = PurePosixPath(path)
    while True:
        quota = read(mount / str(at).lstrip("/"))
        if quota is not None:
            found.append(quota)
        if at == at.parent:
            return found
        at = at.parent


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return _ratio(quota, period)


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = (folder / "cpu.cfs_quota_us").read_text().strip()
        period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    if q <= 0 or p <= 0:  # v1 writes -1 for "no quota"
        return None
    return q / p


def usable_cpus() -> float:
    """CPUs this process may keep busy at once: its affinity, capped by its cgroup quota."""
    cpus: float = affinity_cpus()
    quota = cgroup_quota_cpus()
    if quota is not None:
        cpus = min(cpus, quota)
    return cpus


def describe_allowance() -> str:
    """One line on the CPUs this process may use, and what that means for where batches
    compute, as ``inferway serve`` prints it."""
    affinity = affinity_cpus()
    quota = cgroup_quota_cpus()
    cpus = affinity if quota is None else min(affinity, quota)
    limit = "no cgroup CPU quota" if quota is None else f"cgroup CPU quota {quota:g}"
    line = f"{cpus:g} usable (affinity {affinity}, {limit})"
    if cpus <= 1:
        line += (
            "; a CPU model's 5-50 ms batches, and shorter ones expected to end before the"
            " next request to the server, compute on the event loop's thread"
        )
    return line


class CpuAllowance:
    """``usable_cpus``, read again at most once every ``every_s`` seconds; cheap to ask."""

    def __init__(
        self,
        read: Callable[[], float] = usable_cpus,
        *,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = RECHECK_EVERY_S,
    ) -> None:
        self._read = read
        self._clock = clock
        self._every = every_s
        self._at = -math.inf
        self._cpus = 1.0

    def cpus(self) -> float:
        now = self._clock()
        if now - self._at >= self._every:
            self._at = now
            self._cpus = self._read()
        return self._cpus

    def at_most_one(self) -> bool:
        """Whether this process may use one CPU at most (a worker thread cannot overlap)."""
        return self.cpus() <= 1.0


_shared: CpuAllowance | None = None


def process_allowance() -> CpuAllowance:
    """One allowance per process, shared by every model's executor."""
    global _shared
    if _shared is None:
        _shared = CpuAllowance()
    return _shared
