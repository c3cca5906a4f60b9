"""Watch the policy file and apply each edit that is valid; refuse, log and record the rest.

The file's directory is watched rather than the file: editors save by writing a temporary
file and renaming it over the original, and Kubernetes ConfigMaps swap a ``..data`` symlink,
both of which replace the inode a file watch would follow. Any change in the directory
triggers a re-read, and unchanged content is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import watchfiles
from opentelemetry import trace

from inferway.gateway.control_plane import ControlPlane, PolicyRefusedError, Refusal
from inferway.policies import PolicyError, PolicyIssue, load_policy_text

__all__ = ["PolicyWatcher", "ReloadResult"]

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("inferway.gateway")
# watchfiles logs every batch of changes at INFO; the directory may hold busy files.
logging.getLogger("watchfiles").setLevel(logging.WARNING)


@dataclass(frozen=True)
class ReloadResult:
    """What one re-read did: applied a version, or refused the edit."""

    version: str | None = None
    refusal: Refusal | None = None


class PolicyWatcher:
    """Re-applies ``path`` through ``control_plane`` whenever its content changes."""

    def __init__(
        self,
        path: str | Path,
        control_plane: ControlPlane,
        *,
        debounce_ms: int = 10,
        on_reload: Callable[[ReloadResult], None] | None = None,
        force_polling: bool | None = None,
        external_endpoints: bool = False,
    ) -> None:
        """``external_endpoints``: the gateway was given an endpoints file, so an edit may
        leave services without inline endpoints (see ``check_policy``)."""
        self.path = Path(path)
        self.external_endpoints = external_endpoints
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
        self._task = asyncio.create_task(self._run(), name=f"policy-watcher {self.path}")
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
        directory = self.path.parent.resolve()
        watch = watchfiles.awatch(
            directory,
            watch_filter=None,
            debounce=self.debounce_ms,
            step=min(50, max(self.debounce_ms, 1)),
            stop_event=self._stop,
            recursive=False,
            force_polling=self.force_polling,
            yield_on_timeout=True,
            rust_timeout=200,
        )
        log.info("watching %s for policy edits", self.path)
        async for changes in watch:
            # The first (timeout) yield means the watch is established.
            self._watching.set()
            if any(self._concerns_policy(changed) for _, changed in changes):
                self.reload()

    def _concerns_policy(self, changed: str) -> bool:
        """The policy file itself, or a Kubernetes ConfigMap ``..data`` symlink swap."""
        name = Path(changed).name
        return name == self.path.name or name.startswith("..")

    def reload(self) -> ReloadResult | None:
        """Re-read the file and apply or refuse it; None when its content has not changed."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            # Mid-rename, or deleted: keep the live policy, say so once.
            if self._last_digest != "missing":
                self._last_digest = "missing"
                log.warning("policy file %s is missing; keeping the live policy", self.path)
            return None
        except OSError as exc:
            log.warning("cannot read policy file %s: %s; keeping the live policy", self.path, exc)
            return None
        digest = _digest(data)
        if digest == self._last_digest:
            return None
        self._last_digest = digest
        self.reloads += 1
        source = str(self.path)
        try:
            text = data.decode("utf-8")
            with _tracer.start_as_current_span(
                "reload policy", attributes={"inferway.policy.source": source}
            ):
                with _tracer.start_as_current_span("load policy"):
                    policy = load_policy_text(
                        text, source, external_endpoints=self.external_endpoints
                    )
                result = ReloadResult(version=self.control_plane.apply_policy(policy, source))
        except UnicodeDecodeError as exc:
            issue = PolicyIssue(source, None, None, "", f"cannot read file: {exc}")
            result = ReloadResult(refusal=self.control_plane.refuse(PolicyError([issue]), source))
        except PolicyError as exc:
            result = ReloadResult(refusal=self.control_plane.refuse(exc, source))
        except PolicyRefusedError as exc:
            result = ReloadResult(refusal=exc.refusal)
        if self.on_reload is not None:
            self.on_reload(result)
        return result


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
