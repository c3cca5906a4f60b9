"""Located policy errors: what went wrong, and where in which file.

A person fixing a policy needs the file, line, column and field of every problem at once,
so loading collects every issue into one :class:`PolicyError` instead of stopping early.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_FILE_BYTES", "PolicyError", "PolicyIssue", "read_limited", "read_source_text"]

MAX_FILE_BYTES = 8 * 1024 * 1024
"""The most inferway reads of any file a policy names (the policy, its endpoints file, its
certificates): a path such as ``/dev/zero`` or a runaway file must not exhaust memory."""


@dataclass(frozen=True)
class PolicyIssue:
    """One problem in a policy file.

    ``line``/``column`` are 1-based and ``None`` when no position applies (an unreadable
    file). ``path`` names the field, e.g. ``routes[0].backends[1].weight``; ``""`` is the
    document itself.
    """

    file: str
    line: int | None
    column: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        if self.path:
            return f"{where}: {self.path}: {self.message}"
        return f"{where}: {self.message}"


class PolicyError(Exception):
    """A policy was refused. ``issues`` lists every problem found, in file order."""

    def __init__(self, issues: Iterable[PolicyIssue]) -> None:
        self.issues: list[PolicyIssue] = list(issues)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(issue) for issue in self.issues)


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
)


def read_limited(path: str | Path, *, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Raises OSError whose ``strerror`` says why in words: the file is not a regular file (a
    device, a pipe, a directory: reading one could block or never end) or is larger than
    ``limit``. Opened non-blocking so that naming a FIFO cannot hang the caller.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except ValueError:  # "embedded null byte"
        raise OSError(errno.EINVAL, "the path contains a NUL character", str(path)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), "special")
            raise OSError(errno.EINVAL, f"not a regular file ({kind})", str(path))
        if info.st_size > limit:
            raise OSError(errno.EFBIG, _too_large(info.st_size, limit), str(path))
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while being read
            raise OSError(errno.EFBIG, _too_large(size, limit), str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _too_large(size: int, limit: int) -> str:
    return f"the file is larger than the limit of {limit} bytes ({size} bytes or more)"


def read_source_text(path: str | Path) -> str:
    """The UTF-8 text of a file the user gave us, or a PolicyError naming it and why not."""
    try:
        return read_limited(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise PolicyError(
            [PolicyIssue(str(path), None, None, "", f"cannot read file: {reason}")]
        ) from None
