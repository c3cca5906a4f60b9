"""Encrypted model files (``model.onnx.enc``): AES-256-GCM with a per-file data key wrapped
by a key in a PKCS#11 token (``hsm.py``), decrypted in memory at load.

Layout: ``MAGIC``, a 4-byte big-endian header length, the header (JSON: format, cipher,
nonce, token and key labels, the wrapped data key), then the ciphertext with its GCM tag.
The whole preamble is the ciphertext's additional data, so changing one byte anywhere --
header or body -- fails authentication, and a file is either decrypted exactly or refused.
The plaintext exists only as bytes handed to the engine; nothing decrypted is written to
disk (the runners also skip their on-disk engine caches for such models).
"""

from __future__ import annotations

import base64
import json
import os
import struct
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from inferway.backends.models.hsm import (
    ModelEncryption,
    TokenKey,
    TokenKeyError,
    resolve_token_key,
    unwrap_data_key,
    wrap_data_key,
)

__all__ = [
    "ENCRYPTED_MODEL_FILE",
    "MAGIC",
    "ModelDecryptionError",
    "decrypt_model_file",
    "encrypt_model_bytes",
    "is_encrypted",
]

ENCRYPTED_MODEL_FILE = "model.onnx.enc"
MAGIC = b"IWENC\x00\x01\n"
_FORMAT = 1
_CIPHER = "AES-256-GCM"
_MAX_HEADER = 64 * 1024


class ModelDecryptionError(RuntimeError):
    """An encrypted model that cannot be opened: not this format, the wrong key, a modified
    file, or a token that cannot be used; the message names the file and the cause."""


def is_encrypted(path: Path) -> bool:
    return path.name.endswith(".enc")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encrypt_model_bytes(plaintext: bytes, ref: TokenKey) -> bytes:
    """The ``model.onnx.enc`` bytes for ``plaintext``, its data key wrapped by ``ref``."""
    data_key = AESGCM.generate_key(bit_length=256)
    wrap_nonce, wrapped = wrap_data_key(ref, data_key)
    nonce = os.urandom(12)
    header = {
        "format": _FORMAT,
        "cipher": _CIPHER,
        "nonce": _b64(nonce),
        "token": ref.token,
        "key": ref.key,
        "wrap": {"mechanism": "CKM_AES_GCM", "nonce": _b64(wrap_nonce), "data_key": _b64(wrapped)},
    }
    header_bytes = json.dumps(header, sort_keys=True).encode()
    preamble = MAGIC + struct.pack(">I", len(header_bytes)) + header_bytes
    return preamble + AESGCM(data_key).encrypt(nonce, plaintext, preamble)


def _split(path: Path, blob: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    """(header, preamble, ciphertext) of an encrypted file's bytes."""
    if not blob.startswith(MAGIC):
        raise ModelDecryptionError(f"{path}: not an inferway encrypted model (bad magic)")
    start = len(MAGIC) + 4
    if len(blob) < start:
        raise ModelDecryptionError(f"{path}: truncated header")
    (length,) = struct.unpack(">I", blob[len(MAGIC) : start])
    if length > _MAX_HEADER or len(blob) < start + length:
        raise ModelDecryptionError(f"{path}: truncated or corrupt header")
    try:
        header = json.loads(blob[start : start + length])
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except ValueError as e:
        raise ModelDecryptionError(f"{path}: corrupt header ({e}): the file was modified") from e
    if header.get("format") != _FORMAT or header.get("cipher") != _CIPHER:
        raise ModelDecryptionError(
            f"{path}: unsupported format {header.get('format')!r} / cipher "
            f"{header.get('cipher')!r} (this inferway reads format {_FORMAT}, {_CIPHER})"
        )
    return header, blob[: start + length], blob[start + length :]


def decrypt_model_file(path: Path, settings: ModelEncryption | None) -> bytes:
    """The plaintext model of ``path``, decrypted in memory with its key from the token."""
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise ModelDecryptionError(f"{path}: cannot read: {e.strerror or e}") from e
    header, preamble, ciphertext = _split(path, blob)
    try:
        wrap = header["wrap"]
        nonce = base64.b64decode(header["nonce"], validate=True)
        wrap_nonce = base64.b64decode(wrap["nonce"], validate=True)
        wrapped = base64.b64decode(wrap["data_key"], validate=True)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelDecryptionError(f"{path}: corrupt header: the file was modified ({e})") from e
    try:
        ref = resolve_token_key(settings, token=header.get("token"), key=header.get("key"))
        data_key = unwrap_data_key(ref, wrap_nonce, wrapped)
    except TokenKeyError as e:
        raise ModelDecryptionError(f"{path}: {e}") from None
    try:
        return AESGCM(data_key).decrypt(nonce, ciphertext, preamble)
    except (InvalidTag, ValueError):
        raise ModelDecryptionError(
            f"{path}: authentication failed: the file was modified after it was encrypted "
            f"(AES-GCM tag mismatch); refusing to load it"
        ) from None
    finally:
        del data_key
