"""Encrypted models with their key in a real PKCS#11 token (SoftHSM2, initialised by the test):
``inferway model encrypt``, in-memory decryption at load through the real repository and real
onnxruntime, ``inferway serve`` over them, and the refusals -- a wrong key, a modified file,
no PIN -- each with its reason while the version that served keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from inferway.backends.models.config import ModelConfigError, load_model_config
from inferway.backends.models.encrypted import (
    ENCRYPTED_MODEL_FILE,
    ModelDecryptionError,
    decrypt_model_file,
)
from inferway.backends.models.hsm import ModelEncryption
from inferway.backends.models.repository import ModelRepository
from inferway.cli.main import app
from inferway.devtools.demo_models import build_mlp, mlp_reference
from tests.envoy_process import free_port
from tests.helpers import poll_until
from tests.serve_process import wait_serve_ready
from tests.softhsm import SoftHsm, init_softhsm

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)
CONFIG = {"provider": "cpu", "intra_op_threads": 1, "batching": {"max_batch_size": 4}}
TOKEN, ROGUE, KEY = "inferway-models", "rogue", "model-key"


@pytest.fixture(scope="session")
def hsm(tmp_path_factory: pytest.TempPathFactory) -> SoftHsm:
    """Two tokens, each with its own AES key labelled KEY: the rogue one is 'a wrong key'.
    Session-wide: SoftHSM reads SOFTHSM2_CONF once per process."""
    softhsm = init_softhsm(tmp_path_factory.mktemp("softhsm"), (TOKEN, ROGUE))
    patch = pytest.MonkeyPatch()
    for name, value in softhsm.env.items():
        patch.setenv(name, value)
    yield softhsm
    patch.undo()


def _encrypt(model: Path, token: str = TOKEN, *extra: str) -> None:
    args = ["model", "encrypt", str(model), "--token", token, "--key", KEY]
    result = CliRunner().invoke(app, [*args, "--create-key", "--remove-plaintext", *extra])
    assert result.exit_code == 0, result.output


def _version(root: Path, version: int, token: str = TOKEN) -> Path:
    model = build_mlp(root / "demo" / str(version) / "model.onnx", SIZES, seed=version - 1)
    _encrypt(model, token)
    return model.with_name(ENCRYPTED_MODEL_FILE)


def _x() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((3, SIZES[0]), dtype=np.float32)


def test_encrypt_writes_a_file_without_the_plaintext_that_decrypts_in_memory(
    hsm: SoftHsm, tmp_path: Path
) -> None:
    model = build_mlp(tmp_path / "model.onnx", SIZES, seed=0)
    plaintext = model.read_bytes()
    _encrypt(model)
    encrypted = tmp_path / ENCRYPTED_MODEL_FILE
    assert not model.exists()  # --remove-plaintext
    blob = encrypted.read_bytes()
    assert plaintext[-64:] not in blob and plaintext[:64] not in blob
    assert decrypt_model_file(encrypted, None) == plaintext  # labels from the file's header
    assert sorted(p.name for p in tmp_path.iterdir()) == [ENCRYPTED_MODEL_FILE]

    import pkcs11
    from pkcs11 import Attribute

    token = pkcs11.lib(hsm.module).get_token(token_label=TOKEN)
    with token.open(user_pin=hsm.pin) as session:
        key = session.get_key(label=KEY, key_type=pkcs11.KeyType.AES)
        assert key[Attribute.SENSITIVE] is True and key[Attribute.EXTRACTABLE] is False


async def test_repository_decrypts_at_load_and_serves_real_answers(
    hsm: SoftHsm, tmp_path: Path
) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    _version(tmp_path, 1)
    repository = ModelRepository(tmp_path)
    await repository.start(watch=False)
    try:
        assert repository.ready, repository.errors
        served = repository.get("demo")
        out = await served.executor.infer({"x": _x()})
        np.testing.assert_allclose(out["y"], mlp_reference(_x(), SIZES, 0), rtol=1e-4, atol=1e-5)
        # nothing decrypted reached the disk
        assert sorted(p.name for p in (tmp_path / "demo" / "1").iterdir()) == [ENCRYPTED_MODEL_FILE]
    finally:
        await repository.stop()


async def test_wrong_key_and_modified_file_are_refused_while_the_old_version_serves(
    hsm: SoftHsm, tmp_path: Path
) -> None:
    # The model's config pins the trusted key: a file wrapped by any other key is refused.
    config = {**CONFIG, "encryption": {"token": TOKEN, "key": KEY}}
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "config.yaml").write_text(yaml.safe_dump(config))
    v1 = _version(tmp_path, 1)
    repository = ModelRepository(tmp_path)
    await repository.start(watch=False)
    try:
        first = repository.get("demo", "1")
        _version(tmp_path, 2, token=ROGUE)  # same label, another token's key
        (event,) = await repository.poll_once()
        assert event.kind == "refused" and event.version == "2"
        assert f"key {KEY!r} in token {TOKEN!r}" in event.message
        assert "does not open this file's data key" in event.message
        assert repository.get("demo") is first and repository.ready

        blob = bytearray(v1.read_bytes())
        blob[-100] ^= 0x01  # one bit of the ciphertext
        tampered = v1.with_name(".tampered")
        tampered.write_bytes(bytes(blob))
        tampered.replace(v1)
        events = await repository.poll_once()
        assert [(e.kind, e.version) for e in events] == [("refused", "1")]
        assert "authentication failed: the file was modified" in events[0].message
        assert repository.get("demo", "1") is first  # the old instance keeps serving
        out = await first.executor.infer({"x": _x()})
        np.testing.assert_allclose(out["y"], mlp_reference(_x(), SIZES, 0), rtol=1e-4, atol=1e-5)
    finally:
        await repository.stop()


def test_no_pin_and_a_pin_in_config_are_clear_errors(hsm: SoftHsm, tmp_path: Path) -> None:
    model = build_mlp(tmp_path / "model.onnx", SIZES, seed=0)
    _encrypt(model)
    settings = ModelEncryption(pin_env="INFERWAY_TEST_NO_SUCH_PIN")
    with pytest.raises(ModelDecryptionError, match=r"no PIN for token .*INFERWAY_TEST_NO_SUCH_PIN"):
        decrypt_model_file(tmp_path / ENCRYPTED_MODEL_FILE, settings)
    with pytest.raises(ModelDecryptionError, match="refused the PIN"):
        pin_file = tmp_path / "pin"
        pin_file.write_text("0000\n")
        pin_file.chmod(0o600)  # a PIN file others can read is refused
        decrypt_model_file(tmp_path / ENCRYPTED_MODEL_FILE, ModelEncryption(pin_file=str(pin_file)))
    with pytest.raises(ValidationError, match="a PIN is never written into config"):
        ModelEncryption.model_validate({"pin": "4321"})
    bad = tmp_path / "config.yaml"
    bad.write_text("encryption:\n  pin: '4321'\n")
    with pytest.raises(ModelConfigError, match=r"config.yaml:\d+: encryption: .*never written"):
        load_model_config(bad)


def _index(base: str) -> list[dict]:
    return httpx.post(f"{base}/v2/repository/index", json={}, timeout=5).json()


async def test_serve_loads_encrypted_models_and_refuses_a_tampered_new_version(
    hsm: SoftHsm, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    (root / "demo").mkdir(parents=True)
    (root / "demo" / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    _version(root, 1)
    pin_file = tmp_path / "pin"
    pin_file.write_text(hsm.pin + "\n")
    pin_file.chmod(0o600)  # a PIN file others can read is refused
    env = {k: v for k, v in os.environ.items() if k != "INFERWAY_PKCS11_PIN"}
    env.update(SOFTHSM2_CONF=str(hsm.conf), INFERWAY_PKCS11_MODULE=hsm.module)
    env["INFERWAY_PKCS11_PIN_FILE"] = str(pin_file)  # the PIN from a file this time
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "inferway.cli.main", "serve", str(root)]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    base = f"http://127.0.0.1:{http_port}"
    body = {
        "inputs": [
            {"name": "x", "shape": [3, SIZES[0]], "datatype": "FP32", "data": _x().ravel().tolist()}
        ]
    }
    try:
        wait_serve_ready(proc, base)
        answer = httpx.post(f"{base}/v2/models/demo/infer", json=body, timeout=5)
        assert answer.status_code == 200, answer.text
        got = np.array(answer.json()["outputs"][0]["data"]).reshape(3, SIZES[-1])
        np.testing.assert_allclose(got, mlp_reference(_x(), SIZES, 0), rtol=1e-4, atol=1e-5)

        # version 2 arrives modified (one bit of its GCM tag), moved in whole
        encrypted = _version(tmp_path / "staging", 2)
        blob = bytearray(encrypted.read_bytes())
        blob[-1] ^= 0x01
        encrypted.write_bytes(bytes(blob))
        encrypted.parent.rename(root / "demo" / "2")
        entry = await poll_until(
            lambda: next((e for e in _index(base) if e.get("version") == "2"), None),
            timeout=30,
            what="version 2 to be tried",
        )
        assert entry["state"] == "UNAVAILABLE" and "authentication failed" in entry["reason"]
        again = httpx.post(f"{base}/v2/models/demo/infer", json=body, timeout=5)
        assert again.status_code == 200, again.text  # version 1 keeps serving
        assert again.json()["model_version"] == "1"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert "authentication failed" in out


def test_encrypt_refuses_an_unknown_token_or_key_and_writes_nothing(
    hsm: SoftHsm, tmp_path: Path
) -> None:
    model = build_mlp(tmp_path / "model.onnx", SIZES, seed=0)
    runner = CliRunner()
    args = ["model", "encrypt", str(model), "--key", KEY]
    result = runner.invoke(app, [*args, "--token", "no-such-token"])
    assert result.exit_code == 1 and "no token labelled 'no-such-token'" in result.output
    result = runner.invoke(app, [*args[:-1], "absent-key", "--token", TOKEN])
    assert result.exit_code == 1 and "no AES key labelled 'absent-key'" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
