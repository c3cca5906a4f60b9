"""Policy fuzzing shared by the bounded run in the tests (tests/integration/test_policy_fuzz.py)
and the long run (bench/fuzz_policies.py), issue 33.

Policies are the valid ones of examples/ mutated: values swapped for hostile ones of other
types and ranges (booleans, infinities, huge and negative numbers, unicode, paths to devices
and to other files), containers wrapped in deep nesting, keys dropped, duplicated or invented,
references pointed at other names, and the text itself truncated (a half-saved file). Two
targets: ``inferway validate``'s in-process path (:func:`check_validate`) and a live gateway's
policy watcher (:class:`WatcherTarget`, edits written to its file). What each asserts: no
traceback, every refusal located, the last good config still served, the watcher alive.
"""

from __future__ import annotations

import asyncio
import copy
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from inferway.cli.validate import check_policy_file
from inferway.gateway.runtime import Gateway
from inferway.policies.errors import PolicyIssue

__all__ = [
    "FuzzStats",
    "WatcherTarget",
    "check_validate",
    "load_seeds",
    "mutate",
    "policy_texts",
    "unlocated",
]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WATCHER_UNSAFE_KEYS = ("replicas", "autoscale", "features", "feature_router", "tls", "rollouts")
"""Seeds for the live watcher leave these out: a valid edit with them would start replica
processes, a feature router, certificate reads or a rollout that changes the live
version by itself: what the watcher target is not about."""

HOSTILE_SCALARS: tuple[Any, ...] = (
    True,
    False,
    None,
    0,
    -1,
    1,
    65535,
    65536,
    2**31,
    2**32,
    2**64,
    -(2**63),
    10**400,
    0.05,
    -0.0,
    1e20,
    1e308,
    -1e308,
    math.inf,
    -math.inf,
    math.nan,
    "",
    " ",
    "1e400",
    "1e308",
    ".inf",
    "NaN",
    "true",
    "yes",
    "off",
    "10s",
    "-5ms",
    "1000000h",
    "evil host:80",
    "127.0.0.1:0",
    "127.0.0.1:99999",
    "[::1]:80",
    "::",
    "/dev/zero",
    "/dev/urandom",
    "/proc/self/environ",
    "../../../../etc/passwd",
    "/etc/shadow",
    "/",
    "x" * 5000,
    "\u0000",
    "é",
    "\u202e",
    "💥",
    "a\nb",
    "*",
    "(((",
    "[a-",
    "%s%n",
    "{{.}}",
    "${HOME}",
)


@dataclass
class FuzzStats:
    """What a run did: cases tried, accepted and refused, and the failures found (each with
    the text that caused it, for a test to replay)."""

    tried: int = 0
    accepted: int = 0
    refused: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tried": self.tried,
            "accepted": self.accepted,
            "refused": self.refused,
            "failures": len(self.failures),
        }


def load_seeds(*, for_watcher: bool = False) -> list[dict[str, Any]]:
    """The examples' policies as plain data (for the watcher: without the unsafe keys)."""
    seeds = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or "listeners" not in data:
            continue
        if for_watcher:
            if _mentions(data, WATCHER_UNSAFE_KEYS):
                continue
            data.pop("endpoints_file", None)
        seeds.append(data)
    return seeds


def _mentions(data: Any, keys: tuple[str, ...]) -> bool:
    if isinstance(data, dict):
        return any(k in keys or _mentions(v, keys) for k, v in data.items())
    if isinstance(data, list):
        return any(_mentions(v, keys) for v in data)
    return False


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += _paths(value, (*prefix, index))
    return found


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def _strings(data: Any) -> list[str]:
    return [v for p in _paths(data) if isinstance(v := _get(data, p), str)]


def _unicode(rng: random.Random) -> str:
    ranges = ((0x20, 0x7E), (0xA0, 0x2FF), (0x370, 0x3FF), (0x4E00, 0x4E80), (0x1F300, 0x1F64F))
    low, high = rng.choice(ranges)
    return "".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1, 24)))


def _hostile(rng: random.Random, data: Any, current: Any) -> Any:
    roll = rng.random()
    if roll < 0.45:
        return rng.choice(HOSTILE_SCALARS)
    if roll < 0.55:
        return _unicode(rng)
    if roll < 0.7:
        strings = _strings(data)
        return rng.choice(strings) if strings else current  # a reference to another name
    if roll < 0.8:
        factor = rng.choice([-1, 1, 10, 0.1, 1e6])
        try:
            return factor * (current if _number(current) else 1)
        except OverflowError:  # an integer beyond any float, times a float
            return current
    if roll < 0.9:
        return [current] if rng.random() < 0.5 else {_unicode(rng): current}
    return str(current)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _nest(rng: random.Random, value: Any) -> Any:
    for _ in range(rng.choice([2, 10, 63, 64, 65])):
        value = [value] if rng.random() < 0.7 else {"k": value}
    return value


def mutate(seed: dict[str, Any], rng: random.Random) -> str:
    """One hostile policy text from ``seed`` (a valid policy's data)."""
    data = copy.deepcopy(seed)
    nested = False  # once: deeper nesting is written as text below (the dumper recurses)
    for _ in range(rng.randint(1, 4)):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = rng.choice(paths)
        parent, last = _get(data, path[:-1]), path[-1]
        action = rng.random()
        if action < 0.5:
            parent[last] = _hostile(rng, data, parent[last])
        elif action < 0.62:
            del parent[last]
        elif action < 0.7 and not nested:
            parent[last], nested = _nest(rng, parent[last]), True
        elif action < 0.8 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))  # a duplicate name or endpoint
        elif action < 0.9 and isinstance(parent, dict):
            parent[rng.choice([_unicode(rng), "allow_disruptive", "weight", "routes"])] = _hostile(
                rng, data, None
            )
        elif isinstance(parent, dict) and isinstance(parent[last], str):
            names = _strings(data)
            parent[last] = rng.choice(names) + rng.choice(["", "x", "-2", "."])
    text = yaml.safe_dump(data, allow_unicode=rng.random() < 0.5, sort_keys=False)
    roll = rng.random()
    if roll < 0.08:
        text = text[: rng.randint(0, len(text))]  # a half-saved file
    elif roll < 0.12:
        lines = text.splitlines(keepends=True)
        if lines:
            del lines[rng.randrange(len(lines))]
        text = "".join(lines)
    elif roll < 0.14:
        depth = rng.choice([65, 500, 5000])
        opening, closing = ("[", "]") if rng.random() < 0.5 else ("{a: ", "}")
        text += f"zz: {opening * depth}1{closing * depth}\n"
    return text


def policy_texts(seeds: list[dict[str, Any]]) -> st.SearchStrategy[str]:
    """Hypothesis strategy: a seed and a random source drawn by Hypothesis, mutated."""
    return st.builds(mutate, st.sampled_from(seeds), st.randoms(use_true_random=False))


def unlocated(issues: list[PolicyIssue], source: str) -> list[PolicyIssue]:
    """Refusals that do not say where: an issue of the policy file itself needs a line (or,
    for the file as a whole, a reason naming it); an issue of another file names that file."""
    return [issue for issue in issues if not _located(issue, source)]


def _located(issue: PolicyIssue, source: str) -> bool:
    if not issue.file or not issue.message:
        return False
    whole_file = issue.message.startswith("cannot read file")
    return issue.file != source or issue.line is not None or whole_file


def check_validate(text: str, directory: Path, stats: FuzzStats) -> None:
    """``inferway validate``'s path on ``text``; records a failure for a traceback or a
    refusal without a location."""
    path = directory / "policy.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    stats.tried += 1
    try:
        issues, _ = check_policy_file(path, None, envoy=False)
    except Exception as error:  # a traceback for the user of `inferway validate`
        stats.failures.append({"target": "validate", "error": repr(error), "text": text})
        return
    if not issues:
        stats.accepted += 1
        return
    stats.refused += 1
    missing = unlocated(issues, str(path))
    if missing:
        stats.failures.append(
            {"target": "validate", "unlocated": [str(i) for i in missing], "text": text}
        )


class WatcherTarget:
    """Edits written to a running gateway's policy file, each checked once the watcher has
    read it: applied, or refused with the last good snapshot still served."""

    def __init__(self, gateway: Gateway, good: dict[str, Any]) -> None:
        self.gateway = gateway
        self.good = good
        """A policy that applies (the gateway's own), used as a checkpoint after each batch."""
        self.edits = 0

    def _write(self, text: str) -> None:
        self.edits += 1
        path = self.gateway.options.policy_path
        temporary = path.with_name(f".{path.name}.fuzz")
        temporary.write_text(f"{text}\n# edit {self.edits}\n", encoding="utf-8")
        os.replace(temporary, path)

    async def _processed(self, before: int, timeout: float = 10.0) -> bool:
        watcher = self.gateway.watcher
        deadline = time.monotonic() + timeout
        while watcher.reloads <= before:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    async def edit(self, text: str, stats: FuzzStats) -> None:
        plane, watcher = self.gateway.control_plane, self.gateway.watcher
        version, refusal = plane.version, plane.last_refused
        reloads = watcher.reloads
        stats.tried += 1
        self._write(text)
        if not await self._processed(reloads):
            stats.failures.append({"target": "watcher", "error": "edit never read", "text": text})
            return
        if plane.last_refused is not refusal and plane.last_refused is not None:
            stats.refused += 1
            issues = list(plane.last_refused.issues)
            source = str(self.gateway.options.policy_path)
            broken = [i for i in issues if "could not be processed" in i.message]
            if broken or unlocated(issues, source):
                stats.failures.append(
                    {"target": "watcher", "issues": [str(i) for i in issues], "text": text}
                )
            if plane.version != version or plane.cache.get_snapshot().version != version:
                stats.failures.append(
                    {
                        "target": "watcher",
                        "error": "good config lost",
                        "issues": [str(i) for i in issues],
                        "text": text,
                    }
                )
        else:
            stats.accepted += 1
        if not watcher.running or watcher.health.restarts:
            stats.failures.append({"target": "watcher", "error": "watcher died", "text": text})

    async def checkpoint(self, stats: FuzzStats, serial: int) -> None:
        """A known-good edit must apply: the watcher is alive and applying edits."""
        good = copy.deepcopy(self.good) | {"allow_disruptive": True}
        good["routes"][0]["timeout"] = f"{serial % 1000 + 1}ms"
        version = self.gateway.control_plane.version
        reloads = self.gateway.watcher.reloads
        self._write(yaml.safe_dump(good, sort_keys=False))
        applied = await self._processed(reloads) and (self.gateway.control_plane.version != version)
        if not applied:
            stats.failures.append({"target": "watcher", "error": "checkpoint not applied"})
