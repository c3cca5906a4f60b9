"""``inferway validate`` refuses what ``inferway run`` refuses, with the same located lines:
both go through the composition root's plan (load -> sources -> resolve -> translate)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferway.cli.main import app
from tests.envoy_process import free_port

ROOT = Path(__file__).resolve().parents[2]
BROKEN = sorted((ROOT / "tests" / "data" / "broken").glob("*.yaml"))
MTLS = ROOT / "examples" / "mtls.yaml"

runner = CliRunner()


@pytest.fixture(autouse=True)
def keep_root_logging() -> Iterator[None]:
    """``run`` configures logging for a terminal; put the test process's logging back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _issue_lines(stderr: str) -> list[str]:
    return [
        line for line in stderr.splitlines() if line.strip() and "refusing to start" not in line
    ]


def _validate_and_run(policy: Path) -> tuple[list[str], list[str]]:
    checked = runner.invoke(app, ["validate", "-f", str(policy)])
    assert checked.exit_code == 1, checked.output
    ran = runner.invoke(
        app,
        [
            "run",
            "-f",
            str(policy),
            "--no-envoy",
            "--xds-port",
            str(free_port()),
            "--admin-port",
            str(free_port()),
        ],
    )
    assert ran.exit_code == 1, ran.output
    assert "refusing to start: the policy is invalid" in ran.stderr
    return _issue_lines(checked.stderr), _issue_lines(ran.stderr)


@pytest.mark.parametrize("broken", BROKEN, ids=lambda p: p.stem)
def test_validate_and_run_refuse_each_broken_case_alike(broken: Path, tmp_path: Path) -> None:
    policy = tmp_path / broken.name
    shutil.copyfile(broken, policy)
    validated, ran = _validate_and_run(policy)
    assert validated == ran
    expected = broken.with_suffix(".expected.txt").read_text(encoding="utf-8").splitlines()
    for line in expected:
        assert line.replace(str(broken.relative_to(ROOT)), str(policy)) in validated


def _tls_positions(text: str) -> list[str]:
    """``line:column`` of each ``tls:`` key in the file, in order."""
    return [
        f"{number}:{len(line) - len(line.lstrip()) + 1}"
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() == "tls:"
    ]


def test_validate_and_run_refuse_missing_certificate_files_alike(tmp_path: Path) -> None:
    policy = tmp_path / "mtls.yaml"
    shutil.copyfile(MTLS, policy)  # without the certs/ directory it names
    validated, ran = _validate_and_run(policy)
    assert validated == ran
    listener, service = _tls_positions(MTLS.read_text(encoding="utf-8"))
    ca = tmp_path / "certs" / "ca.pem"
    assert (
        f"{policy}:{listener}: listeners[0].tls: cannot read CA bundle {ca}: "
        "No such file or directory"
    ) in validated
    assert any(
        line.startswith(f"{policy}:{service}: services[0].tls: cannot read private key")
        for line in ran
    )


def test_validate_takes_several_files_and_reports_each(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    shutil.copyfile(ROOT / "examples" / "minimal.yaml", good)
    bad = tmp_path / "bad.yaml"
    shutil.copyfile(MTLS, bad)
    result = runner.invoke(app, ["validate", "-f", str(good), "-f", str(bad)])
    assert result.exit_code == 1
    assert result.stdout.startswith(f"ok {good}:"), result.stdout
    assert (
        f"{bad}:{_tls_positions(MTLS.read_text())[0]}: listeners[0].tls: cannot read certificate"
        in result.stderr
    )
    both = runner.invoke(app, ["validate", "-f", str(good), "-f", str(good)])
    assert both.exit_code == 0 and both.stdout.count(f"ok {good}:") == 2
