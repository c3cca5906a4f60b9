"""IR <-> YAML, through pydantic over the stdlib dataclasses (sorted keys, so the text is
deterministic and a golden diff shows only what changed)."""

from __future__ import annotations

from functools import cache

import yaml
from pydantic import TypeAdapter

from inferway.resolve.ir import IR

__all__ = ["ir_from_yaml", "ir_to_yaml"]


@cache
def _adapter() -> TypeAdapter[IR]:
    return TypeAdapter(IR)


def ir_to_yaml(ir: IR) -> str:
    data = _adapter().dump_python(ir, mode="json")
    return yaml.safe_dump(data, sort_keys=True, default_flow_style=False)


def ir_from_yaml(text: str) -> IR:
    """Raises pydantic.ValidationError naming the field path of a bad value."""
    return _adapter().validate_python(yaml.safe_load(text))
