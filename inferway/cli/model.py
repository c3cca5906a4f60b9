"""``inferway model encrypt``: turn a ``model.onnx`` into the ``model.onnx.enc`` the backend
decrypts in memory, its data key wrapped by a key in a PKCS#11 token (docs/security.md).

The PIN is read from ``$INFERWAY_PKCS11_PIN`` (or the variable ``--pin-env`` names) or from
``--pin-file``; there is deliberately no option that takes the PIN itself. The written file is
decrypted again in memory and compared before the command reports success.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from inferway.console import make_console
from inferway.exit_codes import EXIT_INVALID

__all__ = ["app", "encrypt"]

app = typer.Typer(
    help="Model files: encrypt with a key held in a PKCS#11 token.", no_args_is_help=True
)


def _refuse_non_model(model: Path) -> None:
    """Only an ONNX model is encrypted: any other file (``/etc/passwd``) would be read whole
    and a ``.enc`` written beside it, wherever it is. The name must end in ``.onnx`` and the
    bytes must parse as an ONNX model with a graph."""
    if model.suffix != ".onnx":
        raise typer.BadParameter(
            f"{model} is not an ONNX model file (MODEL must be a .onnx file, e.g. "
            "models/<name>/<version>/model.onnx)",
            param_hint="MODEL",
        )
    import onnx

    try:
        proto = onnx.load_model(str(model), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError, or an OSError reading it
        raise typer.BadParameter(
            f"{model} does not parse as an ONNX model: {exc}", param_hint="MODEL"
        ) from None
    if proto.ir_version <= 0 or not proto.graph.node:
        raise typer.BadParameter(f"{model} holds no ONNX graph", param_hint="MODEL")


@app.command()
def encrypt(
    model: Annotated[
        Path,
        typer.Argument(
            metavar="MODEL",
            help="The model.onnx to encrypt.",
            dir_okay=False,
            exists=True,
            show_default=False,
        ),
    ],
    token: Annotated[
        str, typer.Option(help="Token label.", envvar="INFERWAY_PKCS11_TOKEN", show_default=False)
    ],
    key: Annotated[str, typer.Option(help="Label of the AES key in the token.")],
    module: Annotated[
        str,
        typer.Option(
            help="The PKCS#11 library.", envvar="INFERWAY_PKCS11_MODULE", show_default=False
        ),
    ],
    pin_env: Annotated[
        str, typer.Option(help="Environment variable holding the user PIN.")
    ] = "INFERWAY_PKCS11_PIN",
    pin_file: Annotated[
        Path | None,
        typer.Option(
            help="File holding the user PIN (first line).",
            dir_okay=False,
            envvar="INFERWAY_PKCS11_PIN_FILE",
        ),
    ] = None,
    create_key: Annotated[
        bool,
        typer.Option(
            "--create-key",
            help="Generate the AES-256 key in the token if absent (sensitive, never extractable).",
        ),
    ] = False,
    remove_plaintext: Annotated[
        bool,
        typer.Option(
            "--remove-plaintext",
            help="Delete MODEL once the encrypted file "
            "is verified (else the plain file is served, not the encrypted one).",
        ),
    ] = False,
) -> None:
    """Write MODEL.enc beside MODEL (AES-256-GCM; the data key wrapped in the token). Exit 0
    done, 1 the token, key or PIN cannot be used."""
    from inferway.backends.models.encrypted import (
        ModelDecryptionError,
        decrypt_model_file,
        encrypt_model_bytes,
    )
    from inferway.backends.models.hsm import (
        ModelEncryption,
        TokenKeyError,
        create_token_key,
        resolve_token_key,
    )

    _refuse_non_model(model)
    console, err = make_console(), make_console(stderr=True)
    settings = ModelEncryption(
        module=module,
        token=token,
        key=key,
        pin_env=pin_env,
        pin_file=str(pin_file) if pin_file else None,
    )
    target = model.with_name(model.name + ".enc")
    try:
        ref = resolve_token_key(settings)
        if create_key and create_token_key(ref):
            console.print(Text(f"created {ref.describe()}"))
        plaintext = model.read_bytes()
        blob = encrypt_model_bytes(plaintext, ref)
        temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        temp.write_bytes(blob)
        temp.replace(target)  # atomic: a watching backend never reads half a file
        check = decrypt_model_file(target, settings)
    except (TokenKeyError, ModelDecryptionError, OSError) as e:
        err.print(Text(f"{model}: {e}" if str(model) not in str(e) else str(e), style="red"))
        raise typer.Exit(EXIT_INVALID) from None
    if hashlib.sha256(check).digest() != hashlib.sha256(plaintext).digest():
        target.unlink(missing_ok=True)
        err.print(Text(f"{target}: verification failed; removed", style="red"))
        raise typer.Exit(EXIT_INVALID)
    console.print(Text(f"wrote {target} ({len(blob)} bytes, {ref.describe()})"))
    if remove_plaintext:
        model.unlink()
        console.print(Text(f"removed {model}"))
    else:
        console.print(
            Text(
                f"note: {model} is still there, and a repository serves it instead "
                "of the encrypted file; delete it (or use --remove-plaintext)",
                style="yellow",
            )
        )
