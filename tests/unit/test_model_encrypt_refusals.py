"""``model encrypt`` encrypts only ONNX models, and a PIN file others can read is refused
(issue 33, item 8): ``model encrypt /etc/passwd`` wrote ``/etc/passwd.enc``, and a PIN file of
mode 0644 was accepted without a word."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferway.backends.models.hsm import TokenKey, TokenKeyError
from inferway.cli.main import app
from inferway.devtools.demo_models import build_add


def _said(output: str) -> str:
    """The CLI's message, its words joined again across rich's box and line breaks."""
    return " ".join(output.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())


TOKEN = ["--token", "t", "--key", "k", "--module", "/nonexistent/libsofthsm2.so"]


@pytest.mark.parametrize("name", ["passwd", "model.onnx.bak", "weights.bin"])
def test_a_file_that_is_not_onnx_by_name_is_refused(tmp_path: Path, name: str) -> None:
    target = tmp_path / name
    target.write_text("root:x:0:0:root:/root:/bin/bash\n")
    result = CliRunner().invoke(app, ["model", "encrypt", str(target), *TOKEN])
    assert result.exit_code == 2, result.output
    assert "is not an ONNX model file" in _said(result.output)
    assert not list(tmp_path.glob("*.enc"))


def test_a_dot_onnx_file_that_is_no_model_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_text("root:x:0:0:root:/root:/bin/bash\n")
    result = CliRunner().invoke(app, ["model", "encrypt", str(target), *TOKEN])
    assert result.exit_code == 2, result.output
    text = _said(result.output)
    assert "does not parse as an ONNX model" in text or "holds no ONNX graph" in text
    assert not list(tmp_path.glob("*.enc"))


def test_a_real_model_gets_past_the_check_to_the_token(tmp_path: Path) -> None:
    target = build_add(tmp_path / "model.onnx")
    result = CliRunner().invoke(app, ["model", "encrypt", str(target), *TOKEN])
    assert result.exit_code == 1, result.output  # the token cannot be used: not a usage error
    assert "not an ONNX model" not in result.output


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_pin_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    pin = tmp_path / "pin"
    pin.write_text("1234\n")
    pin.chmod(mode)
    settings = TokenKey(module="m", token="t", key="k", pin_file=str(pin))
    with pytest.raises(TokenKeyError, match=f"mode {mode:04o}.*chmod 600"):
        settings.read_pin()


def test_a_private_pin_file_is_read(tmp_path: Path) -> None:
    pin = tmp_path / "pin"
    pin.write_text("1234\n")
    pin.chmod(0o600)
    assert TokenKey(module="m", token="t", key="k", pin_file=str(pin)).read_pin() == "1234"
