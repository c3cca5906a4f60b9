"""``inferway validate --envoy``: the real Envoy binary checks the generated configuration, and
what it refuses is printed against the policy's own line; exit codes 0 / 1 / 2 for CI."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferway.cli.main import app

pytestmark = pytest.mark.integration

runner = CliRunner()

POLICY = """\
version: 1
listeners:
  - name: edge
    port: 18080
services:
  - name: v1
    endpoints: ["127.0.0.1:9000"]
routes:
  - name: models
    match:
      path: {prefix: /}
      headers:
        - name: HEADER
          exact: "on"
    backends:
      - service: v1
        weight: 100
"""


def test_envoy_accepts_a_good_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.replace("HEADER", "x-flag"))
    result = runner.invoke(app, ["validate", "--envoy", "-f", str(path)])
    assert result.exit_code == 0, result.output
    assert "envoy --mode validate: ok" in result.stdout


def test_what_only_envoy_refuses_is_reported_at_the_policy_line(tmp_path: Path) -> None:
    # A header name with a newline: the schema and checks let it through, Envoy does not.
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.replace("HEADER", '"x\\nflag"'))
    assert runner.invoke(app, ["validate", "-f", str(path)]).exit_code == 0  # checks pass
    result = runner.invoke(app, ["validate", "--envoy", "-f", str(path)])
    assert result.exit_code == 1, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"{path}:13:17: routes[0].match.headers[0].name: Envoy refuses this: ")
    assert "HeaderMatcherValidationError.Name" in line


def test_no_envoy_binary_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.replace("HEADER", "x-flag"))
    monkeypatch.setenv("INFERWAY_ENVOY", str(tmp_path / "no-such-envoy"))
    result = runner.invoke(app, ["validate", "--envoy", "-f", str(path)])
    assert result.exit_code == 2, result.output
    assert "--envoy" in result.stderr
