"""The I/O edge of the output-agreement check: read the stable and canary replicas'
recorded answer digests (``GET /v2/debug/outputs``) and feed them to the pure
:class:`AgreementMatcher`, one window at a time.

Each replica keeps its own table, so each has its own cursor (``since``). A replica that
restarted numbers its records from 1 again under a new ``epoch``: the cursor then starts
over (nothing is counted twice: a pair is compared once, when its second half arrives). An
unreachable replica is reported, not guessed around.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from inferway.backends.telemetry.output_digest import OutputDigest
from inferway.controllers.rollout.agreement import AgreementMatcher, Disagreement
from inferway.controllers.rollout.evidence import MirrorCounts

__all__ = ["OUTPUTS_PATH", "AgreementSource", "AgreementWindow"]

OUTPUTS_PATH = "/v2/debug/outputs"
_PAGE = 1000
_MAX_PAGES = 50
"""Per replica and poll: a backlog beyond 50,000 records waits for the next poll."""


@dataclass(frozen=True, slots=True)
class AgreementWindow:
    """What one poll found: the counts for a WindowSample's ``mirror``, a few examples of
    disagreement, and the replicas that could not be read (their records wait)."""

    mirror: MirrorCounts
    examples: tuple[Disagreement, ...]
    unreachable: tuple[str, ...]


@dataclass
class AgreementSource:
    """``stable`` / ``canary``: the replicas' HTTP base URLs (``http://10.0.0.5:8000``)."""

    stable: Sequence[str]
    canary: Sequence[str]
    matcher: AgreementMatcher = field(default_factory=AgreementMatcher)
    timeout_s: float = 5.0
    _cursors: dict[str, tuple[str, int]] = field(default_factory=dict)
    """url -> (epoch, last seq read)."""

    async def poll(self) -> AgreementWindow:
        unreachable: list[str] = []
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
            for urls, add in (
                (self.stable, self.matcher.add_stable),
                (self.canary, self.matcher.add_canary),
            ):
                for url in urls:
                    try:
                        add(await self._read(session, url))
                    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                        unreachable.append(f"{url}: {exc or type(exc).__name__}")
        counts, examples = self.matcher.take()
        return AgreementWindow(counts, tuple(examples), tuple(unreachable))

    async def _read(self, session: aiohttp.ClientSession, url: str) -> list[OutputDigest]:
        out: list[OutputDigest] = []
        for _ in range(_MAX_PAGES):
            epoch, since = self._cursors.get(url, ("", 0))
            params = {"since": str(since), "limit": str(_PAGE)}
            async with session.get(url.rstrip("/") + OUTPUTS_PATH, params=params) as response:
                if response.status != 200:
                    raise ValueError(f"HTTP {response.status}: {(await response.text())[:200]}")
                body = await response.json()
            if epoch and body["epoch"] != epoch and since:  # restarted: numbering began again
                self._cursors[url] = (body["epoch"], 0)
                continue
            records = [OutputDigest.from_json(r) for r in body["records"]]
            self._cursors[url] = (str(body["epoch"]), int(body["next"]))
            out.extend(records)
            if len(records) < _PAGE:
                break
        return out
