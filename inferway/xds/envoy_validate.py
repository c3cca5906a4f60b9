"""Run translated resources through the real Envoy binary (``envoy --mode validate``).

The policy checks catch what they know of; Envoy's own validation is the last word, and
``inferway validate --envoy`` asks it before anything is pushed. The resources are put into a
static bootstrap (``build_envoy_validation_bootstrap``) in a temporary directory; Envoy parses
and validates it without opening a socket.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from inferway.xds.envoy_binary import find_envoy
from inferway.xds.resources import Resources
from inferway.xds.translate.validation import build_envoy_validation_bootstrap

__all__ = ["EnvoyVerdict", "validate_with_envoy"]

_CONFIG_PREFIX = re.compile(r"^.*?error initializing configuration '[^']*':\s*", re.IGNORECASE)
_DUMP_FIELD = re.compile(r"^[a-z_0-9]+: ")  # a top-level line of the proto dump Envoy prints
_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*(\[[^\]]*\]\s*)*")


@dataclass(frozen=True)
class EnvoyVerdict:
    """``ok``, or Envoy's complaint in ``message`` (its log prefix and file path removed)."""

    ok: bool
    message: str = ""


def validate_with_envoy(
    resources: Resources, *, envoy: str | None = None, timeout: float = 60.0
) -> EnvoyVerdict:
    """Raises FileNotFoundError when no Envoy binary is found, ValueError when the resources
    cannot form a bootstrap (a dangling route or endpoint reference)."""
    binary = envoy or find_envoy()
    bootstrap = build_envoy_validation_bootstrap(resources)
    with tempfile.TemporaryDirectory(prefix="inferway-validate-") as workdir:
        config = Path(workdir) / "bootstrap.yaml"
        config.write_text(yaml.safe_dump(bootstrap), encoding="utf-8")
        result = subprocess.run(
            [binary, "--mode", "validate", "-c", str(config), "--log-level", "warn"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=workdir,
        )
    if result.returncode == 0:
        return EnvoyVerdict(True)
    return EnvoyVerdict(False, envoy_error_text(result.stderr + "\n" + result.stdout))


def envoy_error_text(output: str) -> str:
    """What Envoy says is wrong, without its log prefix, the file path and the proto dump it
    prints in between ("...: Proto constraint validation failed (... caused by ...)")."""
    start = output.lower().find("error initializing configuration")
    if start < 0:
        lines = [_LOG_PREFIX.sub("", line.strip()) for line in output.splitlines()]
        return "\n".join(line for line in lines if line)[:2000] or "envoy --mode validate failed"
    text = (
        _CONFIG_PREFIX.sub("", output[start:].split("\n", 1)[0])
        + "\n"
        + (output[start:].split("\n", 1)[1] if "\n" in output[start:] else "")
    )
    said = []
    for line in text.splitlines():
        if not line.strip() or line.startswith((" ", "\t", "}")) or line.rstrip().endswith("{"):
            continue
        if line.startswith("goo.gle/") or _DUMP_FIELD.match(line):
            continue
        said.append(line.lstrip(": ").strip())
    message = " ".join(said).strip()
    if "caused by" in message:  # the innermost cause names the field
        head = message.split("(", 1)[0].strip()
        cause = message.rsplit("caused by", 1)[1].strip().rstrip(")").strip()
        message = f"{head}: {cause}" if head else cause
    return message or "envoy --mode validate failed without saying why"
