"""A replica command naming ``inferway`` runs this control plane's inferway, so the examples
work under a pip install without the venv's bin on PATH; a replica that cannot start is logged
at ERROR with its reason in words (issue 33, item 10)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from inferway.gateway.actuators.replica_plan import build_command, resolve_inferway
from inferway.gateway.actuators.replicas import ReplicaManager
from inferway.policies.replicas import Replicas


def _spec(command: str) -> Replicas:
    return Replicas.model_validate({"command": command, "max": 1})


def test_inferway_by_name_runs_the_script_beside_this_interpreter() -> None:
    beside = Path(sys.executable).parent / "inferway"
    assert beside.is_file(), "the test venv has the console script"
    argv = build_command(
        _spec("inferway serve models --http-port {port}"), "m", 0, 8001, 9001, None
    )
    assert argv == [str(beside), "serve", "models", "--http-port", "8001"]


def test_without_the_script_this_interpreter_runs_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = tmp_path / "bin" / "python3"  # an interpreter whose bin has no inferway script
    monkeypatch.setattr(sys, "executable", str(python))
    assert resolve_inferway(["inferway", "serve", "m"]) == [
        str(python),
        "-m",
        "inferway.cli.entry",
        "serve",
        "m",
    ]


def test_other_programs_are_left_as_written() -> None:
    assert resolve_inferway(["python", "-m", "x"]) == ["python", "-m", "x"]
    assert resolve_inferway(["/opt/inferway", "serve"]) == ["/opt/inferway", "serve"]


def test_a_start_failure_is_logged_at_error_in_words(caplog: pytest.LogCaptureFixture) -> None:
    class Sink:
        def replicas_changed(self, *args: object) -> None:
            return None

    manager = ReplicaManager(Sink())  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="inferway"):
        manager._emit("spawn_failed", "model", 0, error="cannot run 'x': not found", failures=3)
        manager._emit("ready", "model", 0, port=8001)
    failed, ready = caplog.records[-2:]
    assert failed.levelno == logging.ERROR
    assert (
        failed.getMessage()
        == "replica model[0] spawn_failed: cannot run 'x': not found (failures=3)"
    )
    assert ready.levelno == logging.INFO
    assert "{" not in ready.getMessage()
