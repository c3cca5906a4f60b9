"""``inferway validate`` and ``render`` report a policy that loads but does not translate as
one error line and exit 1, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import inferway.xds.policy_snapshot
from inferway.cli.main import app

POLICY = """\
version: 1
listeners: [{name: main, port: 10000}]
services: [{name: v1, endpoints: ["127.0.0.1:8081"]}]
routes: [{name: all, backends: [{service: v1}]}]
"""


@pytest.mark.parametrize("command", ["validate", "render"])
def test_a_translation_error_is_one_line_and_exit_1(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_translation(policy: object) -> None:
        raise ValueError("duplicate Cluster resource named 'v1'")

    monkeypatch.setattr(inferway.xds.policy_snapshot, "translate_ir", broken_translation)
    path = tmp_path / "p.yaml"
    path.write_text(POLICY, encoding="utf-8")
    result = CliRunner().invoke(app, [command, "-f", str(path)])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        f"{path}: cannot translate to Envoy configuration: duplicate Cluster resource named 'v1'"
    ]
