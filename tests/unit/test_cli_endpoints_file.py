"""``inferway validate`` and ``render`` read the endpoints file as ``run`` does: the policy's
own ``endpoints_file``, or ``--endpoints-file`` overriding it; its problems are located."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from inferway.cli.main import app

POLICY = """\
version: 1
endpoints_file: endpoints.yaml
listeners: [{name: edge, port: 10080}]
services: [{name: llama}]
routes: [{name: chat, backends: [{service: llama}]}]
"""


def _write(tmp_path: Path, endpoints: str, name: str = "endpoints.yaml") -> Path:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    (tmp_path / name).write_text(endpoints, encoding="utf-8")
    return policy


def test_render_uses_the_policys_endpoints_file(tmp_path: Path) -> None:
    policy = _write(tmp_path, "services:\n  llama: [127.0.0.1:9001, 127.0.0.1:9002]\n")
    result = CliRunner().invoke(app, ["render", "-f", str(policy)])
    assert result.exit_code == 0, result.output
    assert "port_value: 9001" in result.output and "port_value: 9002" in result.output


def test_the_option_overrides_the_policys_file(tmp_path: Path) -> None:
    policy = _write(tmp_path, "services:\n  llama: [127.0.0.1:9001]\n")
    other = tmp_path / "other.yaml"
    other.write_text("services:\n  llama: [127.0.0.1:9555]\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["render", "-f", str(policy), "--endpoints-file", str(other)])
    assert result.exit_code == 0, result.output
    assert "port_value: 9555" in result.output and "port_value: 9001" not in result.output
    ok = CliRunner().invoke(app, ["validate", "-f", str(policy), "--endpoints-file", str(other)])
    assert ok.exit_code == 0, ok.output


def test_validate_locates_a_bad_endpoints_file(tmp_path: Path) -> None:
    policy = _write(tmp_path, "services:\n  llama: [127.0.0.1:9001]\n  nosuch: [127.0.0.1:1]\n")
    result = CliRunner().invoke(app, ["validate", "-f", str(policy)])
    assert result.exit_code == 1
    assert "endpoints.yaml:3" in result.stderr and "nosuch" in result.stderr


def test_a_missing_endpoints_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", "-f", str(policy)])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "endpoints.yaml" in result.stderr
