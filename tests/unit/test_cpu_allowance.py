"""The CPUs a process may use: affinity, capped by a cgroup v1 or v2 quota up the hierarchy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferway.backends.batching.cpu_allowance import (
    CpuAllowance,
    affinity_cpus,
    cgroup_quota_cpus,
    usable_cpus,
)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


CASES = {
    "v2: the smallest quota from the cgroup up to the root binds": (
        "0::/kubepods/pod1/sidecar\n",
        {
            "kubepods/pod1/sidecar/cpu.max": "max 100000\n",
            "kubepods/pod1/cpu.max": "150000 100000\n",
            "kubepods/cpu.max": "400000 100000\n",
        },
        1.5,
    ),
    "v2: a container sees its own cgroup as the root": (
        "0::/\n",
        {"cpu.max": "50000 100000\n"},
        0.5,
    ),
    "v2: max everywhere is no quota": ("0::/a\n", {"a/cpu.max": "max 100000\n"}, None),
    # Docker without a cgroup namespace: /proc names /docker/<id>, but the container's own
    # cgroup is mounted at the controller's root
    "v1: the path out of sight, the controller's root read": (
        "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
        {"cpu,cpuacct/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
        2.0,
    ),
    "v1: -1 is no quota": (
        "2:cpuacct:/\n1:cpu:/job\n",
        {"cpu/job/cpu.cfs_quota_us": "-1\n", "cpu/job/cpu.cfs_period_us": "100000\n"},
        None,
    ),
    "v1: a quota above the -1 binds": (
        "2:cpuacct:/\n1:cpu:/job\n",
        {
            "cpu/job/cpu.cfs_quota_us": "-1\n",
            "cpu/job/cpu.cfs_period_us": "100000\n",
            "cpu/cpu.cfs_quota_us": "100000\n",
            "cpu/cpu.cfs_period_us": "100000\n",
        },
        1.0,
    ),
}


@pytest.mark.parametrize(("proc_text", "files", "expected"), CASES.values(), ids=CASES.keys())
def test_cgroup_quota(
    tmp_path: Path, proc_text: str, files: dict[str, str], expected: float | None
) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text(proc_text)
    root = tmp_path / "fs"
    for name, text in files.items():
        _write(root / name, text)
    assert cgroup_quota_cpus(proc_cgroup=proc, root=root) == expected


@pytest.mark.parametrize("text", ["", "garbage\n", "0::relative\n"])
def test_unreadable_or_odd_proc_file_is_no_quota(tmp_path: Path, text: str) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text(text)
    assert cgroup_quota_cpus(proc_cgroup=proc, root=tmp_path) is None
    assert cgroup_quota_cpus(proc_cgroup=tmp_path / "missing", root=tmp_path) is None


@pytest.mark.parametrize("text", ["max\n", "x 100000\n", "100000 0\n", "0 100000\n"])
def test_malformed_cpu_max_is_no_quota(tmp_path: Path, text: str) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/\n")
    _write(tmp_path / "fs/cpu.max", text)
    assert cgroup_quota_cpus(proc_cgroup=proc, root=tmp_path / "fs") is None


def test_affinity_is_this_process_mask() -> None:
    assert affinity_cpus() == len(os.sched_getaffinity(0))
    assert 0 < usable_cpus() <= affinity_cpus()


def test_allowance_reads_again_only_after_its_interval() -> None:
    now = [0.0]
    reads = iter([2.0, 1.0, 0.5])
    allowance = CpuAllowance(lambda: next(reads), clock=lambda: now[0], every_s=1.0)
    assert allowance.cpus() == 2.0 and not allowance.at_most_one()
    now[0] = 0.9
    assert allowance.cpus() == 2.0  # cached
    now[0] = 1.0
    assert allowance.at_most_one()  # read again: 1 CPU
    now[0] = 2.5
    assert allowance.cpus() == 0.5 and allowance.at_most_one()


def test_describe_allowance_names_the_mask_the_quota_and_the_one_cpu_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import inferway.backends.batching.cpu_allowance as allowance

    monkeypatch.setattr(allowance, "affinity_cpus", lambda: 4)
    monkeypatch.setattr(allowance, "cgroup_quota_cpus", lambda: None)
    assert allowance.describe_allowance() == "4 usable (affinity 4, no cgroup CPU quota)"
    monkeypatch.setattr(allowance, "cgroup_quota_cpus", lambda: 0.5)
    line = allowance.describe_allowance()
    assert line.startswith("0.5 usable (affinity 4, cgroup CPU quota 0.5); ")
    assert "event loop's thread" in line
