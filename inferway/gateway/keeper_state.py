"""What the keeper knows about the processes it keeps, as a small JSON file in its workdir.

The keeper (``inferway run``) owns Envoy and the control-plane process; the admin API runs in
the control-plane process. The keeper writes this file whenever something changes and the
admin API reads it for ``GET /status``, so ``inferway status`` shows Envoy's pid and restarts,
and how often the control plane itself was restarted, across control-plane restarts. A file
rather than a socket: it needs no protocol, and a restarted control plane reads it at once.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferway.gateway.admin_documents import KeeperRecord

__all__ = [
    "KEEPER_STATE_FILE",
    "KeeperState",
    "KeeperView",
    "ProcessRecord",
    "write_keeper_state",
]

KEEPER_STATE_FILE = "keeper-state.json"


@dataclass(frozen=True)
class ProcessRecord:
    """One kept process: running now or not, how often it was restarted, how it last ended."""

    pid: int | None = None
    running: bool = False
    restarts: int = 0
    last_exit_code: int | None = None
    last_exit_at: float | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class KeeperState:
    keeper_pid: int
    envoy_admin_port: int
    envoy: ProcessRecord = field(default_factory=ProcessRecord)
    control_plane: ProcessRecord = field(default_factory=ProcessRecord)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def write_keeper_state(path: Path, state: KeeperState) -> None:
    """Write-then-rename, so a reader never sees half a file."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(state.to_json(), encoding="utf-8")
    os.replace(temp, path)


class KeeperView:
    """The admin API's view of the keeper's Envoy: the attributes ``EnvoySupervisor`` offers
    (``pid``, ``running``, ``restarts``, ``last_exit_code``, ``admin_port``), read from the
    file on each access, plus the control plane's own record, and ``concurrency`` (the
    keeper's ``--envoy-concurrency``; None: Envoy's default)."""

    def __init__(
        self, path: Path, *, envoy_admin_port: int, concurrency: int | None = None
    ) -> None:
        self.path = path
        self._admin_port = envoy_admin_port
        self.concurrency = concurrency

    def read(self) -> dict[str, Any]:
        """The file's content; empty while the keeper has not written it (or it is unreadable)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _envoy(self) -> dict[str, Any]:
        envoy = self.read().get("envoy")
        return envoy if isinstance(envoy, dict) else {}

    @property
    def pid(self) -> int | None:
        return self._envoy().get("pid")

    @property
    def running(self) -> bool:
        return bool(self._envoy().get("running"))

    @property
    def restarts(self) -> int:
        return int(self._envoy().get("restarts") or 0)

    @property
    def last_exit_code(self) -> int | None:
        return self._envoy().get("last_exit_code")

    @property
    def admin_port(self) -> int:
        return int(self.read().get("envoy_admin_port") or self._admin_port)

    def keeper_status(self) -> KeeperRecord | None:
        """``{"pid": ..., "control_plane": {pid, restarts, last_exit_code, ...}}``, or None
        before the keeper wrote its file."""
        data = self.read()
        if not data:
            return None
        return KeeperRecord(pid=data.get("keeper_pid"), control_plane=data.get("control_plane"))
