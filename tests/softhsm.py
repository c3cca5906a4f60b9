"""A SoftHSM2 (Debian's ``softhsm2``) token directory of the test's own, initialised with
``softhsm2-util`` under a private ``SOFTHSM2_CONF``, so tests never touch a system token.

SoftHSM reads its config when the PKCS#11 library is initialised, once per process, so an
in-process test session uses one ``SoftHsm`` (session fixture) and subprocesses get its
``env``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.components import require_binary, unavailable

__all__ = ["SOFTHSM_MODULE", "SoftHsm", "init_softhsm", "require_softhsm"]

_CANDIDATES = (
    "/usr/lib/softhsm/libsofthsm2.so",
    "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
)
SOFTHSM_MODULE = next((p for p in _CANDIDATES if Path(p).is_file()), _CANDIDATES[0])
PIN = "4321"
SO_PIN = "87654321"


def require_softhsm() -> str:
    """``softhsm2-util``'s path once SoftHSM2 is usable here: the tool, the PKCS#11 library and
    python-pkcs11; without one the test skips, or fails under CI=true (tests/components.py)."""
    util = require_binary("softhsm2-util", "initialising a SoftHSM2 token")
    if not Path(SOFTHSM_MODULE).is_file():
        unavailable("softhsm2 library", f"{SOFTHSM_MODULE} missing (Debian package softhsm2)")
    try:
        import pkcs11  # noqa: F401
    except ImportError:
        unavailable("python-pkcs11", "python-pkcs11 not installed (pip install 'inferway[hsm]')")
    return util


@dataclass(frozen=True)
class SoftHsm:
    conf: Path
    module: str = SOFTHSM_MODULE
    pin: str = PIN

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to use the tokens (PIN from the environment, as in prod)."""
        return {
            "SOFTHSM2_CONF": str(self.conf),
            "INFERWAY_PKCS11_MODULE": self.module,
            "INFERWAY_PKCS11_PIN": self.pin,
        }


def init_softhsm(directory: Path, tokens: tuple[str, ...]) -> SoftHsm:
    """Initialise ``tokens`` (labels, user PIN ``PIN``) in a fresh token directory."""
    util = require_softhsm()
    (directory / "tokens").mkdir(parents=True)
    conf = directory / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {directory / 'tokens'}\nobjectstore.backend = file\n"
        "log.level = ERROR\n"
    )
    env = {**os.environ, "SOFTHSM2_CONF": str(conf)}
    for label in tokens:
        command = [util, "--init-token", "--free", "--label", label]
        subprocess.run(
            [*command, "--so-pin", SO_PIN, "--pin", PIN],
            env=env,
            check=True,
            capture_output=True,
            timeout=60,
        )
    return SoftHsm(conf)
