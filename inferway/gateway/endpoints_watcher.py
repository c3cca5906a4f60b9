"""Watch the endpoints file on its own and push each valid edit as new runtime state.

A deploy system rewrites the endpoints file as replicas come and go; each valid version
reaches Envoy as ClusterLoadAssignments only (the policy, clusters and listeners stay as they
are, so no connection is dropped). A bad file is refused with its location, like a bad policy
edit, and the last good endpoints keep serving. As with the policy, the file's directory is
watched (editors and ConfigMaps replace the inode a file watch would follow).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import Callable, Collection
from pathlib import Path

import watchfiles

from inferway.gateway.control_plane import ControlPlane, PolicyRefusedError
from inferway.gateway.watcher import ReloadResult
from inferway.policies import PolicyError, PolicyIssue
from inferway.policies.endpoints import ServiceEndpoints, load_endpoints_text

__all__ = ["EndpointsWatcher", "load_initial_endpoints"]

log = logging.getLogger(__name__)


def load_initial_endpoints(path: Path, services: Collection[str]) -> tuple[str, ServiceEndpoints]:
    """Read the endpoints file once at start, checked against the policy's ``services``;
    returns the text (for ``mark_loaded``) and the endpoints. Raises PolicyError: a gateway
    refuses to start on a bad endpoints file."""
    text = _read_text(path)
    return text, load_endpoints_text(text, str(path), services=services)


class EndpointsWatcher:
    """Re-reads ``path`` whenever its directory changes and applies it through
    ``control_plane.update_state`` (keeping every other runtime source as it is)."""

    def __init__(
        self,
        path: str | Path,
        control_plane: ControlPlane,
        *,
        debounce_ms: int = 10,
        on_reload: Callable[[ReloadResult], None] | None = None,
        force_polling: bool | None = None,
    ) -> None:
        self.path = Path(path)
        self.control_plane = control_plane
        self.debounce_ms = debounce_ms
        self.on_reload = on_reload
        self.force_polling = force_polling
        self.reloads = 0
        self._last_digest: str | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watching = asyncio.Event()

    def mark_loaded(self, text: str) -> None:
        """Tell the watcher which content is already live, so it is not re-applied."""
        self._last_digest = _digest(text.encode("utf-8"))

    async def start(self) -> None:
        """Start watching; returns once the directory watch is in place."""
        if self._task is not None:
            raise RuntimeError("this watcher is already started")
        self._stop.clear()
        self._task = asyncio.create_task(self._run(), name=f"endpoints-watcher {self.path}")
        waiter = asyncio.create_task(self._watching.wait())
        await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task.done():
            self._task.result()

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
        log.info("watching %s for endpoint changes", self.path)
        async for changes in watch:
            self._watching.set()  # the first (timeout) yield: the watch is in place
            names = {Path(changed).name for _, changed in changes}
            if self.path.name in names or any(n.startswith("..") for n in names):
                self.reload()

    def reload(self) -> ReloadResult | None:
        """Re-read the file and apply or refuse it; None when its content has not changed."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            if self._last_digest != "missing":
                self._last_digest = "missing"
                log.warning("endpoints file %s is missing; keeping the live endpoints", self.path)
            return None
        except OSError as exc:
            log.warning(
                "cannot read endpoints file %s: %s; keeping the live endpoints", self.path, exc
            )
            return None
        digest = _digest(data)
        if digest == self._last_digest:
            return None
        self._last_digest = digest
        self.reloads += 1
        source = str(self.path)
        plane = self.control_plane
        try:
            endpoints = load_endpoints_text(data.decode("utf-8"), source, services=_services(plane))
            state = dataclasses.replace(plane.state, endpoints=endpoints)
            result = ReloadResult(version=plane.update_state(state, source))
        except UnicodeDecodeError as exc:
            issue = PolicyIssue(source, None, None, "", f"cannot read file: {exc}")
            result = ReloadResult(refusal=plane.refuse(PolicyError([issue]), source))
        except PolicyError as exc:
            result = ReloadResult(refusal=plane.refuse(exc, source))
        except PolicyRefusedError as exc:
            result = ReloadResult(refusal=exc.refusal)
        if result.refusal is not None:
            log.warning("endpoints file %s refused; the last good endpoints keep serving", source)
        if self.on_reload is not None:
            self.on_reload(result)
        return result


def _services(control_plane: ControlPlane) -> list[str] | None:
    policy = control_plane.policy
    return None if policy is None else [service.name for service in policy.services]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise PolicyError(
            [PolicyIssue(str(path), None, None, "", f"cannot read file: {reason}")]
        ) from None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
