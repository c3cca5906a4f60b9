"""The watch loop shared by every file the gateway follows (the policy, the endpoints file).

The file's directory is watched rather than the file: editors save by writing a temporary
file and renaming it over the original, and Kubernetes ConfigMaps swap a ``..data`` symlink,
both of which replace the inode a file watch would follow. Any change in the directory
triggers a re-read; unchanged content is ignored; a bad version is refused through the
control plane (recorded, logged) and the last good one keeps serving.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import watchfiles

from inferway.gateway.control_plane import PolicyRefusedError, Refusal
from inferway.gateway.sources import StateSink
from inferway.policies import PolicyError, PolicyIssue
from inferway.policies.errors import read_limited

__all__ = ["ReloadResult", "WatchedFile"]

log = logging.getLogger(__name__)
# watchfiles logs every batch of changes at INFO; the directory may hold busy files.


@dataclass(frozen=True)
class ReloadResult:
    """What one re-read did: applied a version, or refused the edit."""

    version: str | None = None
    refusal: Refusal | None = None


class WatchedFile(abc.ABC):
    """Re-reads ``path`` whenever its directory changes and hands new content to
    :meth:`apply`, which subclasses implement (raising PolicyError or PolicyRefusedError to
    refuse it)."""

    kind = "file"
    """What the file holds, for log lines: 'policy', 'endpoints'."""

    def __init__(
        self,
        path: str | Path,
        sink: StateSink,
        *,
        debounce_ms: int = 10,
        on_reload: Callable[[ReloadResult], None] | None = None,
        force_polling: bool | None = None,
    ) -> None:
        self.path = Path(path)
        self.sink = sink
        """Where refusals are recorded and new state goes (the control plane)."""
        self.debounce_ms = debounce_ms
        self.on_reload = on_reload
        self.force_polling = force_polling
        self.reloads = 0
        self._last_digest: str | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watching = asyncio.Event()

    @abc.abstractmethod
    def apply(self, text: str, source: str) -> str | None:
        """Make ``text`` live; returns the snapshot version."""

    def mark_loaded(self, text: str) -> None:
        """Tell the watcher which content is already live, so it is not re-applied."""
        self._last_digest = _digest(text.encode("utf-8"))

    async def start(self) -> None:
        """Start watching; returns once the directory watch is in place."""
        if self._task is not None:
            raise RuntimeError("this watcher is already started")
        self._stop.clear()
        self._task = asyncio.create_task(self._run(), name=f"{self.kind}-watcher {self.path}")
        waiter = asyncio.create_task(self._watching.wait())
        await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task.done():
            self._task.result()  # surface a failure to start watching

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        watch = watchfiles.awatch(
            self.path.parent.resolve(),
            watch_filter=None,
            debounce=self.debounce_ms,
            step=min(50, max(self.debounce_ms, 1)),
            stop_event=self._stop,
            recursive=False,
            force_polling=self.force_polling,
            yield_on_timeout=True,
            rust_timeout=200,
        )
        log.info("watching %s for %s changes", self.path, self.kind)
        async for changes in watch:
            self._watching.set()  # the first (timeout) yield: the watch is in place
            if any(self._concerns_file(changed) for _, changed in changes):
                self.reload()

    def _concerns_file(self, changed: str) -> bool:
        """The file itself, or a Kubernetes ConfigMap ``..data`` symlink swap."""
        name = Path(changed).name
        return name == self.path.name or name.startswith("..")

    def _problem(self, message: str | None) -> None:
        self.sink.set_file_problem(str(self.path), self.kind, message)

    def reload(self) -> ReloadResult | None:
        """Re-read the file and apply or refuse it; None when its content has not changed."""
        try:
            data = read_limited(self.path)
        except FileNotFoundError:
            # Mid-rename, or deleted: keep what is live, say so once (and in status).
            if self._last_digest != "missing":
                self._last_digest = "missing"
                log.warning(
                    "%s file %s is missing; keeping the live %s", self.kind, self.path, self.kind
                )
            self._problem(f"the file is missing; the live {self.kind} keeps serving")
            return None
        except OSError as exc:
            log.warning(
                "cannot read %s file %s: %s; keeping the live %s",
                self.kind,
                self.path,
                exc,
                self.kind,
            )
            reason = exc.strerror or str(exc)
            self._problem(f"cannot read the file ({reason}); the live {self.kind} keeps serving")
            return None
        self._problem(None)
        digest = _digest(data)
        if digest == self._last_digest:
            return None
        self._last_digest = digest
        self.reloads += 1
        source = str(self.path)
        try:
            result = ReloadResult(version=self.apply(data.decode("utf-8"), source))
        except UnicodeDecodeError as exc:
            issue = PolicyIssue(source, None, None, "", f"cannot read file: {exc}")
            result = ReloadResult(refusal=self.sink.refuse(PolicyError([issue]), source))
        except PolicyError as exc:
            result = ReloadResult(refusal=self.sink.refuse(exc, source))
        except PolicyRefusedError as exc:
            result = ReloadResult(refusal=exc.refusal)
        if result.refusal is not None:
            log.warning(
                "%s file %s refused; the last good %s keeps serving", self.kind, source, self.kind
            )
        if self.on_reload is not None:
            self.on_reload(result)
        return result


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
