"""``-o text|json|yaml`` on validate and render, ``--out``, ``--version``: the documented
shapes (docs/cli.md) and exit codes, through the real command in process."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from inferway.cli.main import app

GOOD = """\
version: 1
listeners: [{name: main, port: 10000}]
services:
  - {name: v1, endpoints: ["127.0.0.1:8081"]}
  - {name: v2, endpoints: ["127.0.0.1:8082"]}
routes: [{name: all, backends: [{service: v1, weight: 90}, {service: v2, weight: 10}]}]
"""
BROKEN = """\
version: 1
listeners: [{name: main, port: 70000}]
services: [{name: v1, endpoints: ["127.0.0.1:8081"]}]
routes: [{name: all, backends: [{service: nope}]}]
"""

runner = CliRunner()


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    good, broken = tmp_path / "good.yaml", tmp_path / "broken.yaml"
    good.write_text(GOOD, encoding="utf-8")
    broken.write_text(BROKEN, encoding="utf-8")
    return good, broken, tmp_path / "missing.yaml"


def test_version_is_the_installed_distributions() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"inferway {importlib.metadata.version('inferway-core')}\n"


def test_validate_json_lists_every_issue_located_and_a_verdict_per_file(tmp_path: Path) -> None:
    good, broken, missing = _files(tmp_path)
    args = ["validate", "-o", "json", "-f", str(good), "-f", str(broken), "-f", str(missing)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert result.stderr == ""  # the document says it all
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert [(v["file"], v["ok"]) for v in report["files"]] == [
        (str(good), True),
        (str(broken), False),
        (str(missing), False),
    ]
    ok = report["files"][0]
    assert ok["issues"] == []
    assert ok["summary"]["listeners"] == 1 and ok["summary"]["services"] == 2
    assert ok["summary"]["routes"] == [
        {
            "name": "all",
            "backends": [{"service": "v1", "weight": 90}, {"service": "v2", "weight": 10}],
        }
    ]
    assert ok["summary"]["envoy"] is None and len(ok["summary"]["snapshot"]) >= 12
    port = report["files"][1]["issues"][0]
    assert port == {
        "file": str(broken),
        "line": 2,
        "column": 32,
        "field": "listeners[0].port",
        "message": "must be at most 65535, got 70000",
        "text": f"{broken}:2:32: listeners[0].port: must be at most 65535, got 70000",
    }
    assert report["files"][1]["summary"] is None
    (unreadable,) = report["files"][2]["issues"]
    assert unreadable["line"] is None and "cannot read file" in unreadable["message"]
    everything = [i for v in report["files"] for i in v["issues"]]
    assert report["issues"] == everything and len(everything) >= 2


def test_validate_text_prints_the_same_issues_as_lines_on_stderr(tmp_path: Path) -> None:
    good, broken, _ = _files(tmp_path)
    as_json = json.loads(runner.invoke(app, ["validate", "-o", "json", "-f", str(broken)]).stdout)
    result = runner.invoke(app, ["validate", "-f", str(good), "-f", str(broken)])
    assert result.exit_code == 1
    assert result.stdout.startswith(f"ok {good}: 1 listener(s), 2 service(s), 1 route(s)")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [issue["text"] for issue in as_json["issues"]]


def test_validate_yaml_is_the_json_document(tmp_path: Path) -> None:
    good, broken, _ = _files(tmp_path)
    args = ["validate", "-f", str(good), "-f", str(broken), "-o"]
    as_json = runner.invoke(app, [*args, "json"])
    as_yaml = runner.invoke(app, [*args, "yaml"])
    assert as_yaml.exit_code == as_json.exit_code == 1
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)


def test_validate_json_of_valid_files_is_ok_and_exit_0(tmp_path: Path) -> None:
    good, _, _ = _files(tmp_path)
    result = runner.invoke(app, ["validate", "-o", "json", "-f", str(good)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ok"] is True


def test_render_json_and_yaml_are_one_document_and_out_writes_it(tmp_path: Path) -> None:
    good, _, _ = _files(tmp_path)
    as_yaml = runner.invoke(app, ["render", "-f", str(good)])
    as_json = runner.invoke(app, ["render", "-f", str(good), "-o", "json"])
    assert as_yaml.exit_code == as_json.exit_code == 0, as_yaml.output + as_json.output
    document = json.loads(as_json.stdout)
    assert yaml.safe_load(as_yaml.stdout) == document
    assert sorted(document) == ["clusters", "endpoints", "listeners", "routes"]
    assert runner.invoke(app, ["render", "-f", str(good), "-o", "text"]).stdout == as_yaml.stdout
    out = tmp_path / "envoy.json"
    written = runner.invoke(app, ["render", "-f", str(good), "-o", "json", "--out", str(out)])
    assert written.exit_code == 0 and written.stdout == ""
    assert json.loads(out.read_text(encoding="utf-8")) == document
    assert f"wrote {out}" in written.stderr


def test_an_unknown_output_format_is_a_usage_error(tmp_path: Path) -> None:
    good, _, _ = _files(tmp_path)
    for command in (["render", "-f", str(good)], ["validate", "-f", str(good)], ["status"]):
        result = runner.invoke(app, [*command, "-o", "xml"])
        assert result.exit_code == 2, (command, result.output)
        assert "Invalid value" in result.stderr and "'xml'" in result.stderr


def test_an_invalid_policy_is_exit_1_for_render_too(tmp_path: Path) -> None:
    _, broken, _ = _files(tmp_path)
    result = runner.invoke(app, ["render", "-f", str(broken), "-o", "json"])
    assert result.exit_code == 1 and result.stdout == ""
    assert "listeners[0].port: must be at most 65535" in result.stderr
