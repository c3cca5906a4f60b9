"""A version that ``inferway optimize`` rejected: its accuracy gate failed, so the repository
must not serve it, yet the files stay for a person to inspect.

The marker is a ``rejected.json`` file in the version directory. The loader refuses such a
version like a broken one (recorded, logged, listed as UNAVAILABLE with the reason, whatever
served before keeps serving); the scanner fingerprints the marker, so deleting it -- a person
overruling the gate -- loads the version on the next poll.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["REJECTED_FILE", "ModelRejectedError", "check_not_rejected", "write_rejection"]

REJECTED_FILE = "rejected.json"


class ModelRejectedError(RuntimeError):
    """The version carries a rejection marker; the message gives the gate's reason."""


def write_rejection(version_dir: Path, reason: str, **details: Any) -> Path:
    """Mark ``version_dir`` rejected with ``reason`` (and any JSON-able details)."""
    path = version_dir / REJECTED_FILE
    body = {"rejected": True, "reason": reason, **details}
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def check_not_rejected(version_dir: Path) -> None:
    """Raise ModelRejectedError when ``version_dir`` holds a rejection marker."""
    path = version_dir / REJECTED_FILE
    if not path.exists():
        return
    try:
        reason = str(json.loads(path.read_text(encoding="utf-8")).get("reason", ""))
    except (OSError, ValueError, AttributeError):
        reason = "(unreadable marker)"
    raise ModelRejectedError(
        f"{path}: rejected by the accuracy gate of `inferway optimize`: {reason or 'no reason'}; "
        f"delete {REJECTED_FILE} to serve this version anyway"
    )
