"""A certificate bundle on disk: ``<name>.pem`` and ``<name>-key.pem``, written atomically.

Each file is written to a temporary name and renamed over the old one, so a watcher never sees
a half-written file and a rotation is one rename per file; private keys get mode 0600.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from inferway.pki.mint import CertBundle

__all__ = ["BundlePaths", "bundle_paths", "load_bundle", "write_bundle"]


@dataclass(frozen=True)
class BundlePaths:
    """Where ``write_bundle`` put a bundle."""

    certificate: Path
    private_key: Path


def bundle_paths(directory: Path, name: str) -> BundlePaths:
    """``<dir>/<name>.pem`` and ``<dir>/<name>-key.pem``."""
    return BundlePaths(directory / f"{name}.pem", directory / f"{name}-key.pem")


def write_bundle(directory: str | Path, name: str, bundle: CertBundle) -> BundlePaths:
    """Write ``<name>.pem`` (0644) and ``<name>-key.pem`` (0600) atomically into ``directory``.

    Each file is written to a temporary name and renamed over the old one, so a watcher never
    sees a half-written file and a rotation is one rename per file.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = bundle_paths(directory, name)
    _write_atomic(paths.private_key, bundle.key_pem, 0o600)
    _write_atomic(paths.certificate, bundle.cert_pem, 0o644)
    return paths


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is masked by umask and ignored for existing files
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_bundle(directory: str | Path, name: str) -> CertBundle:
    """Read back what ``write_bundle`` wrote (e.g. the CA, to issue more certificates)."""
    paths = bundle_paths(Path(directory), name)
    return CertBundle(paths.certificate.read_bytes(), paths.private_key.read_bytes())
