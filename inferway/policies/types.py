"""Field types every schema module shares (durations, names, host:port), in a module that imports no
other schema module, so feature schemas (traffic, access, ...) and model.py can all use
them without an import cycle."""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

__all__ = [
    "NAME_PATTERN",
    "RESERVED_NAME_PREFIX",
    "Duration",
    "FilePath",
    "Name",
    "is_ip_address",
    "join_host_port",
    "parse_duration",
    "split_host_port",
]

NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
"""Names become Envoy resource names and stat prefixes: lowercase DNS-label-like."""

RESERVED_NAME_PREFIX = "inferway_"
"""Envoy clusters inferway adds itself (the xDS server, the tracing collector) are named with
this prefix; a service may not be, or its cluster would collide with one of them."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> object:
    """Turn ``"250ms"``/``"2s"``/``"1m"``/a number into seconds; leave the rest to pydantic."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '250ms', '2s' or '1m', not a boolean")
    if isinstance(value, int | float):
        seconds = _seconds(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"expected a duration such as '250ms', '2s' or '1m', got {value!r}")
        seconds = _seconds(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        return value
    if not math.isfinite(seconds):
        raise ValueError("expected a finite duration")
    return seconds


def _seconds(value: int | float | str) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float
        raise ValueError("this duration is too large") from None


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
"""Seconds, as a float. Written in YAML as '250ms', '2s', '1m' or a plain number."""

Name = Annotated[str, Field(pattern=NAME_PATTERN)]


def _file_path(value: str) -> str:
    if "\0" in value:
        raise ValueError("a file path cannot contain a NUL character")
    if not value:
        raise ValueError("a file path cannot be empty")
    return value


FilePath = Annotated[str, AfterValidator(_file_path)]
"""A path to a file the gateway reads (relative to the policy file's directory)."""


def is_ip_address(host: str) -> bool:
    """An IPv4 or IPv6 address (not a name to resolve)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def join_host_port(host: str, port: int) -> str:
    """``(host, port)`` -> ``"10.0.0.1:80"`` / ``"[::1]:80"`` (split_host_port's inverse)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: object) -> tuple[str, int]:
    """``"10.0.0.1:80"`` / ``"[::1]:80"`` / ``"name:80"`` -> ``(host, port)``."""
    if not isinstance(address, str):
        raise ValueError(f"expected 'host:port', got {address!r}")
    text = address.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()):
        raise ValueError(f"expected 'host:port' such as 127.0.0.1:8000, got {address!r}")
    if ":" in host and not text.startswith("["):
        raise ValueError(
            "expected 'host:port' with an IPv6 host in brackets, e.g. '[::1]:8000', "
            f"got {address!r}"
        )
    return host, int(port)
