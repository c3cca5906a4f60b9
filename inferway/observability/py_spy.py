"""Sampling a live Python process with py-spy (the PyPI wheel ships its binary).

One profile is two py-spy samplers started together on the same process for the same seconds:
one writes the flame graph SVG (the artefact to look at), the other the folded stacks the top
frames are computed from, since py-spy writes one format per run. Each sample pauses the target
for microseconds (``nonblocking`` avoids even that at some accuracy cost).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from inferway.observability.folded_stacks import FoldedStacks, parse_folded

__all__ = ["ProfileError", "ProfileResult", "find_py_spy", "record_profile"]


class ProfileError(Exception):
    """py-spy is missing, cannot attach, or failed; the message says which and what to do."""


@dataclass(frozen=True)
class ProfileResult:
    pid: int
    seconds: float
    rate: int
    svg: Path
    stacks: FoldedStacks


def find_py_spy() -> str:
    """The py-spy binary: beside this interpreter (a venv's bin/) first, then on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise ProfileError("py-spy is not installed: pip install py-spy (it comes with inferway)")
    return found


def _explain(stderr: str, pid: int) -> str:
    """py-spy's own error line (it prints a Rust backtrace after it), with what to do."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    said = errors[0].removeprefix("Error:").strip() if errors else (lines[-1] if lines else "")
    lowered = stderr.lower()
    if "permission" in lowered or "operation not permitted" in lowered or "ptrace" in lowered:
        return (
            f"py-spy may not attach to pid {pid} ({said}): run as the same user with ptrace "
            "allowed (CAP_SYS_PTRACE in a container, kernel.yama.ptrace_scope=0, or sudo)"
        )
    if "no stack counts found" in lowered:
        return (
            f"no samples from pid {pid}: no thread ran Python code while it was sampled (an idle "
            "server); profile it under load, or include idle threads (--idle)"
        )
    if "failed to get process executable name" in lowered or "no such process" in lowered:
        return f"no process {pid} to profile ({said or 'it is not running'})"
    if "no python processes found" in lowered:
        return f"no process {pid} running Python to profile ({said})"
    return f"py-spy failed on pid {pid}: {said or 'no output'}"


_ATTACH_RACE = "no python processes found"
"""What py-spy says when it cannot read the interpreter at start-up, which happens when the
other sampler has the target stopped at that moment (one ptrace tracer at a time)."""
ATTACH_TRIES = 3


async def _sampler(binary: str, args: list[str], pid: int) -> tuple[int, str]:
    """Run one py-spy; a start-up that lost the race for the target is run again (up to
    ``ATTACH_TRIES`` in all, a fraction of a second later) while the target is alive."""
    attempt = 1
    while True:
        code, stderr = await _run_once(binary, args)
        if (
            code == 0
            or attempt >= ATTACH_TRIES
            or _ATTACH_RACE not in stderr.lower()
            or not _alive(pid)
        ):
            return code, stderr
        await asyncio.sleep(0.05 * attempt)
        attempt += 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _run_once(binary: str, args: list[str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        binary, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        _, stderr = await process.communicate()
    except asyncio.CancelledError:
        process.kill()
        await process.wait()
        raise
    return process.returncode or 0, stderr.decode(errors="replace")


async def record_profile(
    pid: int,
    svg: Path,
    *,
    seconds: float = 10.0,
    rate: int = 100,
    subprocesses: bool = False,
    nonblocking: bool = False,
    idle: bool = False,
) -> ProfileResult:
    """Sample ``pid`` for ``seconds`` and write the flame graph to ``svg``."""
    if seconds <= 0 or rate <= 0:
        raise ProfileError(f"seconds and rate must be positive (got {seconds:g}, {rate})")
    binary = find_py_spy()
    common = ["record", "--pid", str(pid), "--duration", f"{max(1, round(seconds))}"]
    common += ["--rate", str(rate)]
    common += ["--subprocesses"] * subprocesses + ["--nonblocking"] * nonblocking
    common += ["--idle"] * idle
    svg.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="inferway-profile-") as scratch:
        folded = Path(scratch) / "stacks.txt"
        (code_svg, err_svg), (code_raw, err_raw) = await asyncio.gather(
            _sampler(binary, [*common, "--format", "flamegraph", "--output", str(svg)], pid),
            _sampler(binary, [*common, "--format", "raw", "--output", str(folded)], pid),
        )
        if code_svg != 0 or not svg.is_file():
            raise ProfileError(_explain(err_svg, pid))
        if code_raw != 0 or not folded.is_file():
            raise ProfileError(_explain(err_raw, pid))
        try:
            stacks = parse_folded(folded.read_text(encoding="utf-8", errors="replace"))
        except ValueError as error:
            raise ProfileError(f"py-spy's folded stacks could not be read: {error}") from None
    return ProfileResult(pid=pid, seconds=seconds, rate=rate, svg=svg, stacks=stacks)
