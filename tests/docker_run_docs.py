"""The ``docker`` commands docs/kubernetes.md gives for running the image, read from the fenced
block after its marker comment: tests/image runs them as written (with its own names, folders
and host ports), and tests/unit/test_docker_run_docs.py checks them against the manifests
without an engine. One reader for both, so the docs cannot drift from what either checks.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DOCS", "MARKER", "RunCommand", "documented_commands", "parse_run"]

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "kubernetes.md"
MARKER = "<!-- docker-run: tests/image runs these commands as written"

_BOOLEAN = {"--rm", "-d", "--detach", "--read-only"}
_VALUED = {
    "--name",
    "--network",
    "--network-alias",
    "--user",
    "--tmpfs",
    "--cap-drop",
    "--security-opt",
    "-v",
    "-e",
    "-p",
    "--entrypoint",
    "--label",
}


def documented_commands(docs: Path = DOCS) -> list[list[str]]:
    """Every command of the block, split as a shell would (``\\`` continuations joined,
    ``#`` comments dropped); ``$PWD`` is left as it is for the caller to replace."""
    text = docs.read_text(encoding="utf-8")
    if MARKER not in text:
        raise ValueError(f"{docs}: no {MARKER!r} comment")
    after = text.split(MARKER, 1)[1]
    fence = after.index("```")
    body = after[fence:].split("\n", 1)[1]
    block = body[: body.index("```")]
    commands = [
        shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()
    ]
    return [c for c in commands if c]


@dataclass
class RunCommand:
    """One ``docker run``: its boolean flags, its options in order, the image and what follows
    it (the arguments given to the image's entry point)."""

    flags: set[str] = field(default_factory=set)
    options: list[tuple[str, str]] = field(default_factory=list)
    image: str = ""
    args: list[str] = field(default_factory=list)

    def values(self, name: str) -> list[str]:
        return [value for option, value in self.options if option == name]

    def value(self, name: str) -> str:
        (value,) = self.values(name)
        return value

    @property
    def env(self) -> dict[str, str]:
        """The ``-e NAME=VALUE`` variables."""
        return dict(item.split("=", 1) for item in self.values("-e") if "=" in item)

    @property
    def passed_env(self) -> list[str]:
        """The ``-e NAME`` variables: the value is the calling shell's (a secret the command
        line must not show)."""
        return [item for item in self.values("-e") if "=" not in item]

    @property
    def volumes(self) -> dict[str, tuple[str, bool]]:
        """Container path -> (host path, read-only)."""
        mounts: dict[str, tuple[str, bool]] = {}
        for spec in self.values("-v"):
            host, container, *mode = spec.split(":")
            mounts[container] = (host, mode == ["ro"])
        return mounts


def parse_run(argv: list[str]) -> RunCommand:
    """``docker run ...`` split into a :class:`RunCommand`; an option this reader does not know
    is an error (it could not tell whether the next word is its value or the image)."""
    if argv[:2] != ["docker", "run"]:
        raise ValueError(f"not a docker run command: {shlex.join(argv)}")
    run = RunCommand()
    words = iter(argv[2:])
    for word in words:
        if word in _BOOLEAN:
            run.flags.add(word)
        elif word in _VALUED:
            run.options.append((word, next(words)))
        elif word.startswith("-"):
            raise ValueError(f"{word}: an option tests/docker_run_docs.py does not know")
        else:
            run.image = word
            run.args = list(words)
    if not run.image:
        raise ValueError(f"no image in: {shlex.join(argv)}")
    return run
