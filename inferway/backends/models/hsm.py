"""Model keys in a PKCS#11 token (an HSM, or SoftHSM2 in tests), via ``python-pkcs11``.

Envelope encryption: each encrypted model file has its own random data key, and only that
data key, wrapped (AES-GCM) by a key-encryption key that lives in the token, is stored in
the file. The key-encryption key is generated in the token as sensitive and not extractable,
so it never leaves it; unwrapping happens inside the token, and the data key exists only in
this process's memory while the model is decrypted. The PIN comes from an environment
variable or a file, never from the command line or a config value (both end up in shell
histories, process lists and repositories).

``python-pkcs11`` is imported only when a token is used (the ``hsm`` extra), so a backend
without encrypted models does not need it.
"""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = [
    "MODULE_ENV",
    "PIN_ENV",
    "PIN_FILE_ENV",
    "TOKEN_ENV",
    "ModelEncryption",
    "TokenKey",
    "TokenKeyError",
    "create_token_key",
    "refuse_exposed_pin_file",
    "resolve_token_key",
    "unwrap_data_key",
    "wrap_data_key",
]

MODULE_ENV = "INFERWAY_PKCS11_MODULE"
TOKEN_ENV = "INFERWAY_PKCS11_TOKEN"
PIN_ENV = "INFERWAY_PKCS11_PIN"
PIN_FILE_ENV = "INFERWAY_PKCS11_PIN_FILE"
_WRAP_CONTEXT = b"inferway model data key v1"
"""Bound to every wrapped data key (GCM additional data): a wrapped key from another
purpose of the same token key does not unwrap as a model key."""


class TokenKeyError(RuntimeError):
    """The token, its key or its PIN cannot be used; the message says which and why."""


class ModelEncryption(BaseModel):
    """``encryption:`` in a model's ``config.yaml``: where the key of ``model.onnx.enc`` is.
    Every field may be left out: the token and key labels default to those the file was
    encrypted with (its header), the module and PIN to the serve-wide environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    module: str | None = None
    """The PKCS#11 library (e.g. libsofthsm2.so); default $INFERWAY_PKCS11_MODULE."""
    token: str | None = None
    """Token label; default: the file header's, else $INFERWAY_PKCS11_TOKEN."""
    key: str | None = None
    """Label of the AES key in the token; default: the file header's."""
    pin_env: str | None = None
    """Environment variable holding the user PIN; default $INFERWAY_PKCS11_PIN."""
    pin_file: str | None = None
    """File holding the user PIN (first line); default $INFERWAY_PKCS11_PIN_FILE."""

    @model_validator(mode="before")
    @classmethod
    def _no_pin_values(cls, data: object) -> object:
        if isinstance(data, dict) and ({"pin", "user_pin"} & set(data)):
            raise ValueError(
                "a PIN is never written into config: name where it is with pin_env "
                "(an environment variable) or pin_file"
            )
        return data


@dataclass(frozen=True)
class TokenKey:
    """One resolved key: library, token label, key label and where its PIN is read."""

    module: str
    token: str
    key: str
    pin_env: str = PIN_ENV
    pin_file: str | None = None

    def describe(self) -> str:
        return f"key {self.key!r} in token {self.token!r} ({self.module})"

    def read_pin(self) -> str:
        """The user PIN, from ``pin_file`` when set, else from ``pin_env``."""
        if self.pin_file:
            refuse_exposed_pin_file(self.pin_file)
            try:
                lines = Path(self.pin_file).read_text(encoding="utf-8").splitlines()
            except OSError as e:
                raise TokenKeyError(f"cannot read the PIN file {self.pin_file}: {e}") from e
            if not lines or not lines[0].strip():
                raise TokenKeyError(f"the PIN file {self.pin_file} is empty")
            return lines[0].strip()
        pin = os.environ.get(self.pin_env)
        if not pin:
            raise TokenKeyError(
                f"no PIN for token {self.token!r}: set ${self.pin_env} or give a PIN file "
                f"(pin_file in the model's encryption config, or ${PIN_FILE_ENV})"
            )
        return pin


def refuse_exposed_pin_file(path: str) -> None:
    """A PIN file others can read is a PIN others know: refused (as ssh refuses a private key
    with such a mode) until it is ``chmod 600``."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # reading it says why
    if mode & 0o077:
        raise TokenKeyError(
            f"the PIN file {path} is readable or writable by group or others (mode "
            f"{stat.S_IMODE(mode):04o}): chmod 600 {path}"
        )


def resolve_token_key(
    settings: ModelEncryption | None,
    *,
    token: str | None = None,
    key: str | None = None,
) -> TokenKey:
    """Settings first, then the labels the file names (``token``, ``key``), then the
    environment."""
    settings = settings or ModelEncryption()
    module = settings.module or os.environ.get(MODULE_ENV)
    token_label = settings.token or token or os.environ.get(TOKEN_ENV)
    key_label = settings.key or key
    missing = [
        what
        for what, value in (
            (f"module (or ${MODULE_ENV})", module),
            (f"token (or ${TOKEN_ENV})", token_label),
            ("key", key_label),
        )
        if not value
    ]
    if missing:
        raise TokenKeyError(f"PKCS#11 settings incomplete: no {', '.join(missing)}")
    assert module and token_label and key_label
    return TokenKey(
        module=module,
        token=token_label,
        key=key_label,
        pin_env=settings.pin_env or PIN_ENV,
        pin_file=settings.pin_file or os.environ.get(PIN_FILE_ENV) or None,
    )


_libs: dict[str, Any] = {}
_libs_lock = threading.Lock()


def _lib(module: str) -> Any:
    """The PKCS#11 library, loaded and initialised once per process (C_Initialize may be
    called only once per library)."""
    try:
        import pkcs11
    except ImportError as e:
        raise TokenKeyError(
            "encrypted models need python-pkcs11: pip install 'inferway[hsm]'"
        ) from e
    with _libs_lock:
        if module not in _libs:
            if not Path(module).is_file():
                raise TokenKeyError(f"PKCS#11 module {module} does not exist")
            try:
                _libs[module] = pkcs11.lib(module)
            except Exception as e:
                raise TokenKeyError(f"cannot load the PKCS#11 module {module}: {e!r}") from e
        return _libs[module]


def _session(ref: TokenKey, *, rw: bool = False) -> Any:
    import pkcs11

    try:
        token = _lib(ref.module).get_token(token_label=ref.token)
    except pkcs11.exceptions.NoSuchToken:
        raise TokenKeyError(f"no token labelled {ref.token!r} in {ref.module}") from None
    try:
        return token.open(user_pin=ref.read_pin(), rw=rw)
    except pkcs11.exceptions.PinIncorrect:
        raise TokenKeyError(f"token {ref.token!r} refused the PIN (incorrect PIN)") from None
    except pkcs11.exceptions.PKCS11Error as e:
        raise TokenKeyError(f"cannot open token {ref.token!r}: {e!r}") from None


def _aes_key(session: Any, ref: TokenKey) -> Any:
    import pkcs11

    try:
        return session.get_key(label=ref.key, key_type=pkcs11.KeyType.AES)
    except pkcs11.exceptions.NoSuchKey:
        raise TokenKeyError(f"no AES key labelled {ref.key!r} in token {ref.token!r}") from None
    except pkcs11.exceptions.MultipleObjectsReturned:
        raise TokenKeyError(
            f"several AES keys labelled {ref.key!r} in token {ref.token!r}; labels must be unique"
        ) from None


def create_token_key(ref: TokenKey) -> bool:
    """Generate a 256-bit AES key labelled ``ref.key`` in the token (sensitive, never
    extractable) unless one exists; True when it was created."""
    import pkcs11
    from pkcs11 import Attribute

    with _session(ref, rw=True) as session:
        try:
            _aes_key(session, ref)
            return False
        except TokenKeyError:
            pass
        template = {
            Attribute.SENSITIVE: True,
            Attribute.EXTRACTABLE: False,
            Attribute.ENCRYPT: True,
            Attribute.DECRYPT: True,
            Attribute.TOKEN: True,
        }
        session.generate_key(pkcs11.KeyType.AES, 256, label=ref.key, store=True, template=template)
        return True


def wrap_data_key(ref: TokenKey, data_key: bytes) -> tuple[bytes, bytes]:
    """Encrypt ``data_key`` inside the token with the token key: (nonce, wrapped key)."""
    from pkcs11 import Mechanism
    from pkcs11.mechanisms import GCMParams

    nonce = os.urandom(12)
    with _session(ref) as session:
        key = _aes_key(session, ref)
        wrapped = key.encrypt(
            data_key, mechanism=Mechanism.AES_GCM, mechanism_param=GCMParams(nonce, _WRAP_CONTEXT)
        )
    return nonce, bytes(wrapped)


def unwrap_data_key(ref: TokenKey, nonce: bytes, wrapped: bytes) -> bytes:
    """The data key, unwrapped inside the token; a key other than the one that wrapped it
    (or a modified wrapped key) fails GCM authentication in the token."""
    import pkcs11
    from pkcs11 import Mechanism
    from pkcs11.mechanisms import GCMParams

    with _session(ref) as session:
        key = _aes_key(session, ref)
        try:
            return bytes(
                key.decrypt(
                    wrapped,
                    mechanism=Mechanism.AES_GCM,
                    mechanism_param=GCMParams(nonce, _WRAP_CONTEXT),
                )
            )
        except pkcs11.exceptions.PKCS11Error as e:
            raise TokenKeyError(
                f"{ref.describe()} does not open this file's data key: wrong key, or the "
                f"file's header was modified ({type(e).__name__})"
            ) from None
