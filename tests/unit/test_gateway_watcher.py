"""PolicyWatcher on a real file: valid edits apply, invalid ones are refused with positions."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.watcher import PolicyWatcher
from inferway.policies import load_policy
from inferway.xds.cache import SnapshotCache

POLICY = """\
version: 1
listeners:
  - name: public
    port: 10000
services:
  - name: v1
    endpoints: ["127.0.0.1:8001"]
  - name: v2
    endpoints: ["127.0.0.1:8002"]
routes:
  - name: model
    backends:
      - service: v1
        weight: {v1}
      - service: v2
        weight: {v2}
"""


def replace_atomically(path: Path, text: str) -> None:
    """What editors do: write a temporary file beside it, then rename it over the original."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.02)


async def test_valid_edit_applied_invalid_refused_then_fix_applied(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(v1=90, v2=10))
    plane = ControlPlane(SnapshotCache())
    first = plane.apply_policy(load_policy(path), str(path))
    watcher = PolicyWatcher(path, plane, debounce_ms=20)
    watcher.mark_loaded(path.read_text())
    await watcher.start()
    try:
        replace_atomically(path, POLICY.format(v1=50, v2=50))
        await wait_for(lambda: plane.version != first)
        second = plane.version
        weights = [b.weight for b in plane.policy.routes[0].backends]
        assert weights == [50, 50]

        replace_atomically(path, POLICY.format(v1=50, v2=-5))
        await wait_for(lambda: plane.last_refused is not None)
        refusal = plane.last_refused
        assert plane.version == second  # the last good policy stays live
        assert plane.cache.get_snapshot().version == second
        assert refusal.file == str(path)
        issue = refusal.issues[0]
        assert (issue.line, issue.column, issue.path) == (16, 17, "routes[0].backends[1].weight")
        assert plane.refusal_pending

        path.write_text(POLICY.format(v1=0, v2=100))  # an in-place write is seen too
        await wait_for(lambda: plane.version not in (first, second))
        assert [b.weight for b in plane.policy.routes[0].backends] == [0, 100]
        assert not plane.refusal_pending
    finally:
        await watcher.stop()


async def test_unchanged_content_and_deleted_file_keep_the_live_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    text = POLICY.format(v1=90, v2=10)
    path.write_text(text)
    plane = ControlPlane(SnapshotCache())
    version = plane.apply_policy(load_policy(path), str(path))
    watcher = PolicyWatcher(path, plane)
    watcher.mark_loaded(text)
    assert watcher.reload() is None  # same bytes: nothing to do
    path.unlink()
    assert watcher.reload() is None
    assert plane.version == version and plane.last_refused is None
    path.write_text("listeners: [")
    result = watcher.reload()
    assert result is not None and result.refusal is not None
    assert result.refusal.issues[0].line is not None
    assert plane.version == version
