"""Top frames from folded stacks (py-spy's ``--format raw``, Brendan Gregg's collapsed format:
one ``frame;frame;...;leaf COUNT`` line per distinct stack, root first).

Pure, so the table ``inferway profile`` prints is tested without a process to profile. A frame's
*self* samples are those where it is the leaf (it was running); its *total* samples are those
where it is anywhere on the stack, counted once per stack even when it recurses.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = ["FoldedStacks", "FrameStat", "parse_folded"]


@dataclass(frozen=True)
class FrameStat:
    frame: str
    self_samples: int
    total_samples: int
    self_percent: float
    total_percent: float

    def as_dict(self) -> dict[str, object]:
        return {
            "frame": self.frame,
            "self_samples": self.self_samples,
            "total_samples": self.total_samples,
            "self_percent": round(self.self_percent, 2),
            "total_percent": round(self.total_percent, 2),
        }


@dataclass(frozen=True)
class FoldedStacks:
    stacks: dict[tuple[str, ...], int]

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())

    def top(self, limit: int = 15) -> list[FrameStat]:
        """The ``limit`` frames with the most self samples (ties: most total, then name)."""
        own: Counter[str] = Counter()
        anywhere: Counter[str] = Counter()
        for stack, count in self.stacks.items():
            own[stack[-1]] += count
            for frame in set(stack):
                anywhere[frame] += count
        total = self.samples or 1
        ranked = sorted(anywhere, key=lambda f: (-own[f], -anywhere[f], f))
        return [
            FrameStat(f, own[f], anywhere[f], 100.0 * own[f] / total, 100.0 * anywhere[f] / total)
            for f in ranked[:limit]
        ]


def parse_folded(text: str) -> FoldedStacks:
    """Parse collapsed stacks; a line that is not ``STACK COUNT`` raises ValueError naming its
    line number (a truncated file must not become a quietly wrong table)."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not (count.isascii() and count.isdigit()):
            raise ValueError(f"line {number}: expected 'frame;frame;... COUNT', got {line!r}")
        stacks[tuple(stack.split(";"))] += int(count)
    return FoldedStacks(dict(stacks))
