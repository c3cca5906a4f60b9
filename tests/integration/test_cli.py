"""The inferway command: validate and render in-process; run and demo as real subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from typer.testing import CliRunner

from inferway.cli.main import app
from tests.envoy_process import free_port

ROOT = Path(__file__).resolve().parents[2]
INFERWAY = [sys.executable, "-m", "inferway.cli.main"]

GOOD = """\
version: 1
listeners:
  - name: public
    port: 10000
services:
  - name: model-v1
    endpoints: ["127.0.0.1:8001"]
  - name: model-v2
    endpoints: ["127.0.0.1:8002"]
routes:
  - name: inference
    backends:
      - service: model-v1
        weight: 90
      - service: model-v2
        weight: 10
"""

runner = CliRunner()


def envoy_descendants() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "envoy" in child.name() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(autouse=True, scope="module")
def no_envoy_left_behind():
    yield
    leftover = envoy_descendants()
    for proc in leftover:
        proc.kill()
    assert not leftover, f"envoy processes left behind: {[p.pid for p in leftover]}"


def test_validate_accepts_a_good_policy_with_a_summary(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD)
    result = runner.invoke(app, ["validate", "-f", str(path)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.stdout
    assert "1 listener(s), 2 service(s), 1 route(s)" in result.stdout
    assert "model-v1 90% / model-v2 10%" in result.stdout


def test_validate_refuses_a_broken_policy_with_located_errors(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(GOOD.replace("port: 10000", "port: 70000").replace("weight: 10", "weight: -1"))
    result = runner.invoke(app, ["validate", "-f", str(path)])
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert f"{path}:4:11: listeners[0].port: must be at most 65535, got 70000" in lines
    assert any(
        line.startswith(f"{path}:16:17: routes[0].backends[1].weight: ") and "negative" in line
        for line in lines
    ), lines
    assert len(lines) == 2


def test_validate_names_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = runner.invoke(app, ["validate", "-f", str(missing)])
    assert result.exit_code == 1
    assert str(missing) in result.stderr and "cannot read file" in result.stderr


def test_render_prints_the_envoy_resources(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD)
    result = runner.invoke(app, ["render", "-f", str(path)])
    assert result.exit_code == 0, result.output
    rendered = yaml.safe_load(result.stdout)
    assert sorted(rendered) == ["clusters", "endpoints", "listeners", "routes"]
    assert [c["name"] for c in rendered["clusters"]] == ["model-v1", "model-v2"]
    out = tmp_path / "out.yaml"
    result = runner.invoke(app, ["render", "-f", str(path), "--out", str(out)])
    assert result.exit_code == 0
    assert yaml.safe_load(out.read_text()) == rendered


@pytest.mark.integration
def test_run_serves_status_and_stops_envoy_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD.replace("port: 10000", f"port: {free_port()}"))
    admin, envoy_admin = free_port(), free_port()
    command = [
        *INFERWAY,
        "run",
        "-f",
        str(path),
        "--xds-port",
        str(free_port()),
        "--admin-port",
        str(admin),
        "--envoy-admin-port",
        str(envoy_admin),
        "--node-id",
        "cli-test",
        "--workdir",
        str(tmp_path / "envoy"),
        "--envoy-concurrency",
        "1",
    ]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        status = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                status = httpx.get(f"http://127.0.0.1:{admin}/status", timeout=1).json()
                if status["nodes"] and status["nodes"][0]["in_sync"]:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.1)
        assert status is not None and status["nodes"], status
        assert status["nodes"][0]["node_id"] == "cli-test" and status["nodes"][0]["in_sync"]
        envoy_pid = status["envoy"]["pid"]
        assert psutil.pid_exists(envoy_pid)
        cmdline = psutil.Process(envoy_pid).cmdline()
        assert cmdline[cmdline.index("--concurrency") + 1] == "1"  # --envoy-concurrency

        shown = subprocess.run(
            [*INFERWAY, "status", "--admin", f"http://127.0.0.1:{admin}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert shown.returncode == 0, shown.stderr
        assert "cli-test" in shown.stdout and status["policy"]["version"][:12] in shown.stdout

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert not psutil.pid_exists(envoy_pid) or psutil.Process(envoy_pid).status() == (
            psutil.STATUS_ZOMBIE
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.integration
def test_run_refuses_to_start_on_an_invalid_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD.replace("weight: 10", "weight: 10.05"))
    result = subprocess.run(
        [*INFERWAY, "run", "-f", str(path), "--no-envoy", "--xds-port", "0", "--admin-port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "refusing to start" in result.stderr
    assert f"{path}:16:17: routes[0].backends[1].weight" in result.stderr


@pytest.mark.integration
def test_status_explains_an_unreachable_gateway() -> None:
    result = runner.invoke(app, ["status", "--admin", f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 3
    assert "cannot reach the inferway admin API" in result.stderr


@pytest.mark.integration
def test_demo_once_shows_both_versions_and_the_change_time() -> None:
    env = {**os.environ, "COLUMNS": "120"}
    started = time.monotonic()
    result = subprocess.run(
        [*INFERWAY, "demo", "--once", "--requests", "200"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "v1" in out and "v2" in out
    assert "Traffic at 10% canary" in out and "Traffic at 50% canary" in out
    assert "policy change applied by Envoy in" in out and " ms" in out
    assert "stopped cleanly" in out
    # One request's trace: Envoy span -> backend request span -> linked batch span.
    assert "trace of one request" in out
    assert "inferway-gateway" in out and "infer demo" in out and "linked" in out
    assert "batch demo" in out and "queue wait" in out and "compute" in out
    assert elapsed < 30


EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BROKEN = sorted((ROOT / "tests" / "data" / "broken").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_validate_accepts_every_shipped_example(example: Path, tmp_path: Path) -> None:
    # Copied next to the development certificates that examples/mtls.yaml names (relative to
    # the policy file), made as its header says: inferway certs init --dir certs.
    made = runner.invoke(app, ["certs", "init", "--dir", str(tmp_path / "certs")])
    assert made.exit_code == 0, made.output
    copy = tmp_path / example.name
    copy.write_text(example.read_text(encoding="utf-8"), encoding="utf-8")
    result = runner.invoke(app, ["validate", "-f", str(copy)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok {copy}"), result.stdout


@pytest.mark.parametrize("broken", BROKEN, ids=lambda p: p.stem)
def test_validate_prints_each_broken_files_expected_errors(
    broken: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    result = runner.invoke(app, ["validate", "-f", str(broken.relative_to(ROOT))])
    assert result.exit_code == 1, result.output
    expected = broken.with_suffix(".expected.txt").read_text(encoding="utf-8").splitlines()
    printed = [line for line in result.stderr.splitlines() if line.strip()]
    for line in expected:
        assert line in printed, f"missing {line!r} in:\n{result.stderr}"


# -- operator conventions, as a shell or a script sees them: stdout and stderr are pipes --


def _inferway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INFERWAY, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_piped_help_is_whole_plain_text_one_line_per_option() -> None:
    shown = _inferway("run", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "╭" not in shown.stdout and "…" not in shown.stdout and "..." not in shown.stdout
    lines = shown.stdout.splitlines()
    token = next(line for line in lines if line.lstrip().startswith("--admin-token-file"))
    assert token.rstrip().endswith(
        "File holding the admin token for POST /reload (default: $INFERWAY_ADMIN_TOKEN, "
        "else generated into <workdir>/admin-token)."
    ), token
    top = _inferway("--help")
    assert top.returncode == 0 and "…" not in top.stdout
    commands = top.stdout.split("Commands:")[1].splitlines()
    assert commands and not [line for line in commands if line.rstrip().endswith("...")]
    validate = next(line for line in top.stdout.splitlines() if line.strip().startswith("validate"))
    assert validate.rstrip().endswith("(-o json: one report with each file's verdict)."), validate
    assert "--version" in top.stdout and "--install-completion" in top.stdout


def test_version_names_the_installed_distribution() -> None:
    import importlib.metadata

    shown = _inferway("--version")
    assert (shown.returncode, shown.stdout) == (
        0,
        f"inferway {importlib.metadata.version('inferway-core')}\n",
    )


def test_each_exit_code_means_one_thing(tmp_path: Path) -> None:
    good, broken = tmp_path / "good.yaml", tmp_path / "broken.yaml"
    good.write_text(GOOD)
    broken.write_text(GOOD.replace("weight: 10", "weight: -1"))
    assert _inferway("validate", "-f", str(good)).returncode == 0
    assert _inferway("validate", "-f", str(broken)).returncode == 1
    assert _inferway("render", "-f", str(broken)).returncode == 1
    usage = [
        ("validate", "--no-such-option"),
        ("no-such-command",),
        ("validate",),  # -f is required
        ("render", "-f", str(good), "-o", "xml"),
        ("run", "-f", str(good), "--log-format", "xml"),
    ]
    for args in usage:
        result = _inferway(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "Usage:" in result.stderr, (args, result.stderr)
    unreachable = _inferway("status", "-o", "json", "--admin", f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 3 and unreachable.stdout == ""
    assert "cannot reach the inferway admin API" in unreachable.stderr


def test_shell_completion_script_and_answers() -> None:
    script = _inferway("--show-completion", "bash")
    assert script.returncode == 0, script.stderr
    assert "_INFERWAY_COMPLETE=complete_bash" in script.stdout
    assert "complete -o default -F _inferway_completion inferway" in script.stdout
    # What the installed script asks the program when the user presses Tab.
    asked = {"_INFERWAY_COMPLETE": "complete_bash", "COMP_WORDS": "inferway val", "COMP_CWORD": "1"}
    assert _inferway(env=asked).stdout.split() == ["validate"]
    asked = {**asked, "COMP_WORDS": "inferway status -o ", "COMP_CWORD": "3"}
    assert _inferway(env=asked).stdout.split() == ["text", "json", "yaml"]
    asked = {**asked, "COMP_WORDS": "inferway run --log-format ", "COMP_CWORD": "3"}
    assert _inferway(env=asked).stdout.split() == ["json", "text"]


def _json_lines(text: str) -> list[dict]:
    import json

    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.integration
def test_run_logs_json_lines_when_stderr_is_a_pipe_and_status_prints_documents(
    tmp_path: Path,
) -> None:
    import json

    path = tmp_path / "policy.yaml"
    path.write_text(GOOD)
    admin = free_port()
    command = [*INFERWAY, "run", "-f", str(path), "--no-envoy"]
    command += ["--xds-port", str(free_port()), "--admin-port", str(admin)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{admin}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.communicate()[1].decode()
            try:
                if httpx.get(f"{url}/status", timeout=1).json().get("policy"):
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the gateway never served /status"
            time.sleep(0.1)
        as_json = _inferway("status", "--admin", url, "-o", "json")
        as_yaml = _inferway("status", "--admin", url, "-o", "yaml")
        assert as_json.returncode == as_yaml.returncode == 0, as_json.stderr + as_yaml.stderr
        document = json.loads(as_json.stdout)
        assert yaml.safe_load(as_yaml.stdout)["policy"] == document["policy"]
        assert document["policy"]["source"] == str(path)
        not_admin = _inferway("status", "--admin", f"{url}/not-the-admin-api", "-o", "json")
        assert not_admin.returncode == 3 and not_admin.stdout == ""
        assert "answered HTTP 404" in not_admin.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()
    lines = _json_lines(err.decode())
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    pushed = next(line for line in lines if "pushed as snapshot" in line["message"])
    assert pushed["level"] == "info" and pushed["logger"].startswith("inferway")
    assert pushed["source"] == str(path) and pushed["snapshot"] == document["policy"]["version"]


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("log_format", "workers"), [("json", 1), ("text", 1), ("json", 2)], ids=str
)
def test_serve_logs_json_or_text_as_asked(log_format: str, workers: int, tmp_path: Path) -> None:
    from inferway.devtools.demo_models import write_demo_repository

    write_demo_repository(tmp_path / "models", versions=(1,), sizes=(4, 4, 2))
    http_port = free_port()
    command = [*INFERWAY, "serve", str(tmp_path / "models"), "--log-format", log_format]
    command += ["--http-port", str(http_port), "--grpc-port", str(free_port())]
    command += ["--workers", str(workers)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Every worker is ready (so has logged its model) once serve prints so; the process
    # exits rather than hang if workers cannot start, and the test's timeout bounds it.
    expected = b"all 2 workers ready" if workers > 1 else b"  model demo"
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(expected):
                break
        else:
            raise AssertionError(f"serve ended before it was ready: {proc.communicate()}")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()
    text = err.decode()
    if log_format == "text":
        assert text.strip() and not text.lstrip().startswith("{"), text
        assert " INFO inferway.backends" in text, text
        return
    lines = _json_lines(text)
    loaded = [line for line in lines if "loaded" in line["message"]]
    assert loaded and all(line["logger"].startswith("inferway.backends") for line in loaded)
    if workers > 1:  # each worker's lines say which worker wrote them
        assert {line["worker"] for line in loaded} == set(range(workers)), lines


@pytest.mark.integration
@pytest.mark.parametrize("log_format", ["json", "text"])
def test_the_keeper_and_its_control_plane_both_log_as_asked(
    log_format: str, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD.replace("port: 10000", f"port: {free_port()}"))
    admin = free_port()
    command = [*INFERWAY, "run", "-f", str(path), "--admin-port", str(admin)]
    command += ["--xds-port", str(free_port()), "--envoy-admin-port", str(free_port())]
    command += ["--workdir", str(tmp_path / "envoy"), "--log-format", log_format]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[1].decode()
            try:
                nodes = httpx.get(f"http://127.0.0.1:{admin}/status", timeout=1).json()["nodes"]
                if nodes and nodes[0]["in_sync"]:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Envoy never got in sync"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    if log_format == "text":  # the control plane is told the keeper's format, not a guess
        text = err.decode()
        assert "pushed as snapshot" in text, text
        assert not [line for line in text.splitlines() if line.lstrip().startswith("{")], text
        return
    lines = _json_lines(err.decode())  # every line parses: nothing else reached stderr
    loggers = {line["logger"] for line in lines}
    assert "inferway.gateway.control_plane_process" in loggers  # the keeper process
    assert any("pushed as snapshot" in line["message"] for line in lines)  # its child
