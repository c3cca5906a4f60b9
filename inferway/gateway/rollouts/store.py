"""Rollout state on disk: ``<dir>/<name>.json``, written atomically (temp file, fsync,
rename), so a control plane killed mid-write leaves the previous state, never half of one,
and a restart resumes at the same step with the same evidence.

The file holds the controller's state and the rollout's target (route, stable, canary): a
rollout pointed elsewhere under the same name starts over instead of resuming someone
else's evidence.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from inferway.controllers.rollout.state import RolloutState, RolloutStateError

__all__ = ["RolloutStateStore", "RolloutStore", "RolloutTarget"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutTarget:
    route: str
    stable: str
    canary: str


class RolloutStateStore(Protocol):
    """Where the driver keeps each rollout's state: this folder on one node, the fleet's store
    (``gateway/fleet/shared_rollouts.py``) on many."""

    def load(self, name: str) -> tuple[RolloutTarget, RolloutState] | None: ...

    def save(self, target: RolloutTarget, state: RolloutState) -> None: ...


class RolloutStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def load(self, name: str) -> tuple[RolloutTarget, RolloutState] | None:
        """The saved target and state, or None when there is none. Raises
        RolloutStateError naming the file when it cannot be read back."""
        path = self.path(name)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RolloutStateError(f"{path}: {exc}") from None
        try:
            data = json.loads(text)
            target = RolloutTarget(**data["target"])
            state = RolloutState.from_json(json.dumps(data["state"]))
        except (ValueError, KeyError, TypeError) as exc:  # RolloutStateError is a ValueError
            raise RolloutStateError(f"{path}: {exc}") from None
        return target, state

    def save(self, target: RolloutTarget, state: RolloutState) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(
            {"target": vars(target), "state": json.loads(state.to_json())}, sort_keys=True
        )
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
