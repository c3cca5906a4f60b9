"""py-spy's start-up race: two samplers on one process, only one may stop it at a time, so
the one that loses says "No python processes found" and is run again; other failures are not."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from inferway.observability import py_spy

_FAKE = """#!{python}
import pathlib, sys
calls = pathlib.Path({calls!r})
n = int(calls.read_text()) + 1 if calls.exists() else 1
calls.write_text(str(n))
if n <= {fail_times}:
    sys.stderr.write("Error: {message}\\n")
    sys.exit(1)
sys.exit(0)
"""


def _fake_py_spy(tmp_path: Path, fail_times: int, message: str) -> tuple[str, Path]:
    calls = tmp_path / "calls"
    script = tmp_path / "py-spy"
    script.write_text(
        _FAKE.format(
            python=sys.executable, calls=str(calls), fail_times=fail_times, message=message
        )
    )
    script.chmod(0o755)
    return str(script), calls


_RACE = "No python processes found in process 42 or any of its subprocesses"


def test_a_sampler_that_lost_the_attach_race_is_run_again(tmp_path: Path) -> None:
    binary, calls = _fake_py_spy(tmp_path, 1, _RACE)
    code, _ = asyncio.run(py_spy._sampler(binary, ["record"], os.getpid()))
    assert code == 0 and calls.read_text() == "2"


def test_it_gives_up_after_the_tries_and_reports_py_spys_reason(tmp_path: Path) -> None:
    binary, calls = _fake_py_spy(tmp_path, 99, _RACE)
    code, stderr = asyncio.run(py_spy._sampler(binary, ["record"], os.getpid()))
    assert code == 1 and calls.read_text() == str(py_spy.ATTACH_TRIES)
    assert "no process" in py_spy._explain(stderr, 42)


def test_other_failures_and_a_gone_target_are_not_retried(tmp_path: Path) -> None:
    binary, calls = _fake_py_spy(tmp_path, 99, "Permission denied (os error 13)")
    code, _ = asyncio.run(py_spy._sampler(binary, ["record"], os.getpid()))
    assert code == 1 and calls.read_text() == "1"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / "gone").mkdir()
    binary, calls = _fake_py_spy(tmp_path / "gone", 99, _RACE)
    code, _ = asyncio.run(py_spy._sampler(binary, ["record"], gone.pid))
    assert code == 1 and calls.read_text() == "1"
