"""Reading an autoscale block: typed values with bounds, every problem collected with its field.

``build_autoscale_config`` (config.py) and the issue's rule form (rule.py) both read through
``ConfigReader``, so an error names the field the same way in either form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

__all__ = ["AutoscaleConfigError", "ConfigReader"]


class AutoscaleConfigError(ValueError):
    """Invalid autoscaling configuration; ``problems`` holds every (field, message) found."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = list(problems)
        self.field = problems[0][0]
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))


class ConfigReader:
    """Typed reads from a mapping that collect problems instead of stopping at the first."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.problems: list[tuple[str, str]] = []

    def fail(self, name: str, message: str) -> None:
        self.problems.append((f"{self.prefix}.{name}", message))

    def mapping(self, data: Any, name: str, allowed: set[str]) -> Mapping[str, Any]:
        if not isinstance(data, Mapping):
            self.fail(name, f"expected a mapping, got {type(data).__name__}")
            return {}
        for key in sorted(set(data) - allowed, key=str):
            self.fail(
                f"{name}.{key}" if name else str(key),
                f"unknown key; expected one of {', '.join(sorted(allowed))}",
            )
        return data

    @overload
    def number(
        self,
        data: Mapping[str, Any],
        key: str,
        default: float,
        *,
        name: str | None = None,
        minimum: float = 0.0,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float: ...

    @overload
    def number(
        self,
        data: Mapping[str, Any],
        key: str,
        default: float | None,
        *,
        name: str | None = None,
        minimum: float = 0.0,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float | None: ...

    def number(
        self,
        data: Mapping[str, Any],
        key: str,
        default: float | None,
        *,
        name: str | None = None,
        minimum: float = 0.0,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float | None:
        name = name or key
        value = data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(name, f"expected a number, got {value!r}")
            return default
        if (
            (positive and value <= 0)
            or value < minimum
            or (maximum is not None and value > maximum)
        ):
            bound = f"> {minimum}" if positive else f">= {minimum}"
            bound += f" and <= {maximum}" if maximum is not None else ""
            self.fail(name, f"must be {bound}, got {value}")
            return default
        return float(value)

    def integer(
        self,
        data: Mapping[str, Any],
        key: str,
        default: int | None,
        *,
        name: str | None = None,
        minimum: int = 0,
    ) -> int | None:
        name = name or key
        value = data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(name, f"expected an integer, got {value!r}")
            return default
        if value < minimum:
            self.fail(name, f"must be >= {minimum}, got {value}")
            return default
        return value

    def pair(
        self, data: Mapping[str, Any], key: str, default: tuple[Any, Any], integer: bool
    ) -> tuple[Any, Any]:
        """``key: N`` (both directions) or ``key: {up: N, down: M}``."""
        value = data.get(key)
        if value is None:
            return default
        if isinstance(value, Mapping):
            part = self.mapping(value, key, {"up", "down"})
            read = self.integer if integer else self.number
            up = read(part, "up", default[0], name=f"{key}.up")
            down = read(part, "down", default[1], name=f"{key}.down")
            return up, down
        read = self.integer if integer else self.number
        both = read(data, key, None)
        return (both, both) if both is not None else default
