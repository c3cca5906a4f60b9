"""Reading one YAML file of a model repository (a model's ``config.yaml``, a pipeline's
``pipeline.yaml``): its data and its node tree, so later problems can be placed on their
lines, or one ``file:line:column`` problem for a file that cannot be read or parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["read_yaml_file"]


def read_yaml_file(path: Path) -> tuple[Any, yaml.Node | None, str | None]:
    """``(data, tree, None)``, or ``(None, None, problem)`` when ``path`` cannot be read or
    is not YAML; the caller raises its own error type with the problem."""
    try:
        text = path.read_text()
    except OSError as e:
        return None, None, f"{path}: cannot read: {e.strerror or e}"
    try:
        return yaml.safe_load(text), yaml.compose(text), None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        return None, None, f"{where}: invalid YAML: {e}"
