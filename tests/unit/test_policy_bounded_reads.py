"""Every file a policy names is read bounded (issue 33, items 2 and 5): a device, a pipe or a
huge file is refused with a located error instead of being read until memory runs out, and
a file that is not what the policy says it is is refused without quoting its content (the
error is shown by ``GET /status``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferway.cli.main import app
from inferway.cli.validate import check_policy_file
from inferway.policies.errors import MAX_FILE_BYTES, PolicyError, read_limited, read_source_text

POLICY = """\
version: 1
listeners: [{name: edge, port: 10080}]
services: [{name: llama}]
routes: [{name: chat, backends: [{service: llama}]}]
endpoints_file: {endpoints}
"""


def _policy(tmp_path: Path, endpoints: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.replace("{endpoints}", endpoints), encoding="utf-8")
    return path


def test_a_character_device_is_refused_without_reading_it(tmp_path: Path) -> None:
    issues, summary = check_policy_file(_policy(tmp_path, "/dev/zero"), None, envoy=False)
    assert summary is None
    assert [str(issue) for issue in issues] == [
        "/dev/zero: cannot read file: not a regular file (a character device)"
    ]


def test_a_named_pipe_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "endpoints.fifo")
    issues, _ = check_policy_file(_policy(tmp_path, "endpoints.fifo"), None, envoy=False)
    assert len(issues) == 1
    assert issues[0].message == "cannot read file: not a regular file (a named pipe)"


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "endpoints.d").mkdir()
    issues, _ = check_policy_file(_policy(tmp_path, "endpoints.d"), None, envoy=False)
    assert issues[0].message == "cannot read file: not a regular file (a directory)"


def test_a_file_over_the_limit_is_refused_with_the_limit(tmp_path: Path) -> None:
    big = tmp_path / "endpoints.yaml"
    with big.open("wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)
    issues, _ = check_policy_file(_policy(tmp_path, "endpoints.yaml"), None, envoy=False)
    assert len(issues) == 1
    assert issues[0].file == str(big)
    assert f"larger than the limit of {MAX_FILE_BYTES} bytes" in issues[0].message


def test_the_policy_file_itself_is_bounded(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="not a regular file"):
        read_source_text("/dev/zero")
    small = tmp_path / "small.yaml"
    small.write_bytes(b"x" * 100)
    with pytest.raises(OSError, match="larger than the limit of 10 bytes"):
        read_limited(small, limit=10)
    assert read_limited(small, limit=100) == b"x" * 100


def test_another_files_content_is_never_quoted(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(
        "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin\n", encoding="utf-8"
    )
    issues, _ = check_policy_file(_policy(tmp_path, "secret.txt"), None, envoy=False)
    text = "\n".join(issue.message for issue in issues)
    assert "/bin/bash" not in text and "daemon" not in text
    assert "not an endpoints file" in text


def test_a_yaml_file_with_other_keys_is_not_quoted_either(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text(
        "apiVersion: v1\nusers: [{name: admin, token: hunter2}]\n", encoding="utf-8"
    )
    issues, _ = check_policy_file(_policy(tmp_path, "kubeconfig"), None, envoy=False)
    text = "\n".join(str(issue) for issue in issues)
    assert "hunter2" not in text and "apiVersion" not in text and "users" not in text
    assert "not an endpoints file" in text


def test_a_syntax_error_in_another_file_does_not_quote_it(tmp_path: Path) -> None:
    (tmp_path / "endpoints.yaml").write_text('services: {a: "\\qsecret"\n', encoding="utf-8")
    issues, _ = check_policy_file(_policy(tmp_path, "endpoints.yaml"), None, envoy=False)
    assert issues and all("'q'" not in str(issue) for issue in issues)
    assert issues[0].line == 1


def test_validate_on_dev_zero_exits_with_the_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", "-f", str(_policy(tmp_path, "/dev/zero"))])
    assert result.exit_code == 1, result.output
    assert "not a regular file (a character device)" in result.output
    assert "Traceback" not in result.output


def test_a_path_with_a_nul_character_is_a_located_error(tmp_path: Path) -> None:
    """Found by bench/fuzz_policies.py: os.open raised ValueError ("embedded null byte")."""
    path = _policy(tmp_path, '"eps\\0.yaml"')
    issues, _ = check_policy_file(path, None, envoy=False)
    assert [str(issue) for issue in issues] == [
        f"{path}:5:17: endpoints_file: a file path cannot contain a NUL character"
    ]
    with pytest.raises(OSError, match="the path contains a NUL character"):
        read_limited("a\0b")
