"""What the model repository directory holds right now, fingerprinted by ``stat``.

The layout rules live here and nowhere else: ``<root>/<name>/<version>/model.onnx`` (or an
encrypted ``model.onnx.enc``; the plain file wins when both are there), versions
are positive integers written canonically (``1``, not ``01``), dot-names are ignored. The
fingerprint lets a poll reload only what changed, and skip bytes that already failed to load;
it covers a version's rejection marker too, so removing one retries the version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferway.backends.models.config import resolve_model_config_path
from inferway.backends.models.encrypted import ENCRYPTED_MODEL_FILE
from inferway.backends.models.rejection import REJECTED_FILE

__all__ = ["MODEL_FILE", "Fingerprint", "ScanEntry", "VersionKey", "scan_repository"]

MODEL_FILE = "model.onnx"

VersionKey = tuple[str, str]
Fingerprint = tuple[Any, ...]
ScanEntry = tuple[Path, Path | None, Fingerprint]
"""(model path, config path or None, fingerprint of both)."""


def _stat_key(path: Path | None) -> tuple[Any, ...]:
    if path is None:
        return ()
    st = path.stat()
    return (str(path), st.st_ino, st.st_size, st.st_mtime_ns)


def scan_repository(root: Path) -> dict[VersionKey, ScanEntry]:
    """What the directory holds now: (name, version) -> (model path, config path, stat)."""
    found: dict[VersionKey, ScanEntry] = {}
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if model_dir.name.startswith("."):
            continue
        for vdir in sorted(p for p in model_dir.iterdir() if p.is_dir()):
            if (
                not (vdir.name.isascii() and vdir.name.isdigit())
                or int(vdir.name) < 1
                or vdir.name != str(int(vdir.name))
            ):
                continue
            model = vdir / MODEL_FILE
            try:
                if not model.is_file():
                    model = vdir / ENCRYPTED_MODEL_FILE
                    if not model.is_file():
                        continue
                cfg = resolve_model_config_path(model_dir, vdir)
                marker = vdir / REJECTED_FILE
                fp = (
                    _stat_key(model),
                    _stat_key(cfg),
                    _stat_key(marker if marker.exists() else None),
                )
            except OSError:  # vanished while scanning: the next poll sees the truth
                continue
            found[(model_dir.name, vdir.name)] = (model, cfg, fp)
    return found
