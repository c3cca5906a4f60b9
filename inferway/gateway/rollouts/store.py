"""Rollout state on disk: ``<dir>/<name>.json``, written atomically (temp file, fsync,
rename), so a control plane killed mid-write leaves the previous state, never half of one,
and a restart resumes at the same step with the same evidence."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from inferway.gateway.controllers.rollout.state import RolloutState, RolloutStateError

__all__ = ["RolloutStore"]

log = logging.getLogger(__name__)


class RolloutStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def load(self, name: str) -> RolloutState | None:
        """The saved state, or None when there is none. Raises RolloutStateError naming the
        file when it cannot be read back."""
        path = self.path(name)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RolloutStateError(f"{path}: {exc}") from None
        try:
            return RolloutState.from_json(text)
        except RolloutStateError as exc:
            raise RolloutStateError(f"{path}: {exc}") from None

    def save(self, state: RolloutState) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        text = state.to_json()
        fd, temp = tempfile.mkstemp(prefix=f".{state.name}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.path(state.name))
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        try:  # the rename itself survives a power cut only once the directory is synced
            dir_fd = os.open(self.directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            log.debug("could not fsync %s", self.directory)
        finally:
            os.close(dir_fd)
