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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import watchfiles

from inferway.gateway.control_plane import PolicyRefusedError, Refusal
from inferway.gateway.sources import StateSink
from inferway.gateway.watch_health import WatchHealth, supervise
from inferway.policies import PolicyError, PolicyIssue
from inferway.policies.errors import read_limited

__all__ = ["DEFAULT_SETTLE_MS", "MAX_SETTLE_S", "ReloadResult", "WatchedFile"]

DEFAULT_SETTLE_MS = 100
"""How long a changed file must stay unchanged before it is read."""
MAX_SETTLE_S = 2.0
"""A file that keeps changing is read after this long anyway (a log-like writer)."""

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
        settle_ms: int = DEFAULT_SETTLE_MS,
    ) -> None:
        """``settle_ms``: after the file is written in place, it is read once its size and
        modification time have not changed for this long (a writer part-way through a save is
        waited for; at most :data:`MAX_SETTLE_S`). A file renamed into place (an atomic save,
        a ConfigMap swap) is read at once."""
        self.path = Path(path)
        self.sink = sink
        """Where refusals are recorded and new state goes (the control plane)."""
        self.debounce_ms = debounce_ms
        self.on_reload = on_reload
        self.force_polling = force_polling
        self.settle_ms = settle_ms
        self.reloads = 0
        self.health = WatchHealth(self.kind, str(self.path))
        self._last_digest: str | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
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
        self._stopped = False
        self._stop.clear()  # watchfiles sets it when its task is cancelled
        self._watching.clear()
        self._task = asyncio.create_task(
            supervise(self._run, self.health, self._stop, self._watching),
            name=f"{self.kind}-watcher {self.path}",
        )
        waiter = asyncio.create_task(self._watching.wait())
        await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task.done():
            self._task.result()  # surface a failure to start watching

    @property
    def running(self) -> bool:
        """The watch task is alive (it restarts itself after a failure)."""
        return self._task is not None and not self._task.done()

    async def ensure_running(self) -> bool:
        """Start the watch again if its task has ended (``POST /reload`` calls this); True
        when it had to be started."""
        if self._task is None or not self._task.done() or self._stopped:
            return False
        log.warning("%s watcher of %s was not running; starting it again", self.kind, self.path)
        self._task = None
        self.health.restarts += 1
        await self.start()
        return True

    async def stop(self) -> None:
        self._stopped = True
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
            self.health.running = True
            if any(self._concerns_file(changed) for _, changed in changes):
                written_in_place = any(
                    change == watchfiles.Change.modified and Path(changed).name == self.path.name
                    for change, changed in changes
                )
                if written_in_place:  # an atomic rename is whole at once: no wait
                    await self._settle()
                self.reload()

    async def _settle(self) -> None:
        """Wait until the file has stopped changing: a save in several writes is read once,
        whole (an atomic rename, as the docs recommend, settles at once)."""
        if self.settle_ms <= 0:
            return
        deadline = time.monotonic() + MAX_SETTLE_S
        seen = _stat_key(self.path)
        while time.monotonic() < deadline:
            await asyncio.sleep(self.settle_ms / 1000)
            now = _stat_key(self.path)
            if now == seen:
                return
            seen = now

    def _concerns_file(self, changed: str) -> bool:
        """The file itself, or a Kubernetes ConfigMap ``..data`` symlink swap."""
        name = Path(changed).name
        return name == self.path.name or name.startswith("..")

    def _problem(self, message: str | None) -> None:
        self.sink.set_file_problem(str(self.path), self.kind, message)

    def reload(self) -> ReloadResult | None:
        """Re-read the file and apply or refuse it; None when its content has not changed.
        Never raises: an unexpected failure is a refused edit (logged, with the file)."""
        try:
            return self._reload()
        except Exception as error:
            log.error(
                "%s file %s: unexpected failure while reading an edit; refused, the last good "
                "%s keeps serving",
                self.kind,
                self.path,
                self.kind,
                exc_info=True,
            )
            self.health.failed(error)
            message = (
                f"this edit could not be processed ({type(error).__name__}); it is refused "
                f"and the last good {self.kind} keeps serving"
            )
            issue = PolicyIssue(str(self.path), None, None, "", message)
            try:
                refusal = self.sink.refuse(PolicyError([issue]), str(self.path))
            except Exception:
                log.error("cannot record the refusal of %s", self.path, exc_info=True)
                return None
            return ReloadResult(refusal=refusal)

    def _reload(self) -> ReloadResult | None:
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
        self.health.read_ok()
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


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
