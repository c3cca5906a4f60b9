"""The encrypted model file's framing and the key settings, without a token: what is refused
before any key is asked for, and where a PIN may (and may not) come from."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from inferway.backends.models.encrypted import MAGIC, ModelDecryptionError, decrypt_model_file
from inferway.backends.models.hsm import (
    MODULE_ENV,
    PIN_ENV,
    PIN_FILE_ENV,
    TOKEN_ENV,
    ModelEncryption,
    TokenKey,
    TokenKeyError,
    resolve_token_key,
)


def _file(tmp_path: Path, blob: bytes) -> Path:
    path = tmp_path / "model.onnx.enc"
    path.write_bytes(blob)
    return path


def _framed(header: object) -> bytes:
    body = json.dumps(header).encode()
    return MAGIC + struct.pack(">I", len(body)) + body + b"ciphertext"


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"\x08\x07onnx protobuf", "not an inferway encrypted model (bad magic)"),
        (MAGIC + b"\x00", "truncated header"),
        (MAGIC + struct.pack(">I", 500) + b"{}", "truncated or corrupt header"),
        (MAGIC + struct.pack(">I", 3) + b"{x}", "corrupt header"),
        (_framed([1, 2]), "corrupt header"),
        (_framed({"format": 9, "cipher": "AES-256-GCM"}), "unsupported format 9"),
        (_framed({"format": 1, "cipher": "AES-256-GCM"}), "corrupt header: the file was modified"),
    ],
)
def test_files_that_are_not_whole_encrypted_models_are_refused_by_name(
    tmp_path: Path, blob: bytes, message: str
) -> None:
    path = _file(tmp_path, blob)
    with pytest.raises(ModelDecryptionError, match=re.escape(message)) as caught:
        decrypt_model_file(path, None)
    assert str(caught.value).startswith(str(path))


def test_settings_fall_back_from_config_to_the_file_header_to_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MODULE_ENV, "/lib/p11.so")
    monkeypatch.setenv(TOKEN_ENV, "env-token")
    monkeypatch.delenv(PIN_FILE_ENV, raising=False)
    ref = resolve_token_key(None, token="header-token", key="header-key")
    assert (ref.module, ref.token, ref.key, ref.pin_env) == (
        "/lib/p11.so",
        "header-token",
        "header-key",
        PIN_ENV,
    )
    pinned = resolve_token_key(ModelEncryption(token="t", key="k"), token="h", key="h")
    assert (pinned.token, pinned.key) == ("t", "k")  # config pins the key
    assert resolve_token_key(None, key="k").token == "env-token"
    monkeypatch.delenv(MODULE_ENV)
    with pytest.raises(
        TokenKeyError, match=r"incomplete: no module \(or \$INFERWAY_PKCS11_MODULE\)"
    ):
        resolve_token_key(None, token="t", key="k")


def test_the_pin_comes_from_a_file_or_an_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pin_file = tmp_path / "pin"
    pin_file.write_text("1234\n")
    pin_file.chmod(0o600)  # a PIN file others can read is refused
    assert TokenKey("m", "t", "k", pin_file=str(pin_file)).read_pin() == "1234"
    pin_file.write_text("\n")
    pin_file.chmod(0o600)  # a PIN file others can read is refused
    with pytest.raises(TokenKeyError, match="is empty"):
        TokenKey("m", "t", "k", pin_file=str(pin_file)).read_pin()
    monkeypatch.setenv("MY_PIN", "9999")
    assert TokenKey("m", "t", "k", pin_env="MY_PIN").read_pin() == "9999"
    monkeypatch.delenv("MY_PIN")
    with pytest.raises(TokenKeyError, match=r"no PIN for token 't': set \$MY_PIN"):
        TokenKey("m", "t", "k", pin_env="MY_PIN").read_pin()
    with pytest.raises(ValueError, match="a PIN is never written into config"):
        ModelEncryption.model_validate({"user_pin": "1"})
