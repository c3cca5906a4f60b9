"""Replicas the gateway starts itself: a service's ``replicas:`` section.

Instead of listing endpoints, a service may name a command that serves it; the gateway's
replica manager runs ``min``..``max`` copies of it on free loopback ports and adds each one
to the service's endpoints only once its readiness URL answers 200.

    replicas:
      command: inferway serve --model-repository ./models --http-port {port} --grpc-port {grpc_port}
      readiness: /v2/health/ready        # a path on {port}, or a URL with placeholders
      min: 1
      max: 4
      devices: ["0", "1", "2", "3"]      # one CUDA_VISIBLE_DEVICES entry per replica

The command is split like a shell would (``shlex``) and each word is filled in; it is never
run through a shell. Placeholders are checked when the policy loads, so a typo is a located
error rather than a replica that fails at start.
"""

from __future__ import annotations

import ipaddress
import shlex
import string
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferway.policies.traffic import DEFAULT_HEALTH_PATH
from inferway.policies.types import Duration

__all__ = [
    "COMMAND_PLACEHOLDERS",
    "Backoff",
    "Replicas",
    "placeholders_in",
]

COMMAND_PLACEHOLDERS: tuple[str, ...] = ("port", "grpc_port", "host", "index", "device", "service")
"""What a command word, an environment value or the readiness URL may contain in braces."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


def placeholders_in(text: str) -> list[str]:
    """The ``{name}`` fields of ``text``; raises ValueError for a malformed one or one that
    is not a plain name (``{port:x}``, ``{0}``, an unmatched brace)."""
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as error:
        raise ValueError(
            f"{error} in {text!r} (write a literal brace as '{{{{' or '}}}}')"
        ) from None
    names: list[str] = []
    for _, field_name, spec, conversion in parts:
        if field_name is None:
            continue
        if spec or conversion or not field_name.isidentifier():
            raise ValueError(
                f"placeholder '{{{field_name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}}' in {text!r}: use a plain name such as "
                "{port}"
            )
        names.append(field_name)
    return names


def _check_placeholders(text: str) -> str:
    unknown = [n for n in placeholders_in(text) if n not in COMMAND_PLACEHOLDERS]
    if unknown:
        raise ValueError(
            f"unknown placeholder '{{{unknown[0]}}}' in {text!r}; known: "
            + ", ".join(f"{{{n}}}" for n in COMMAND_PLACEHOLDERS)
        )
    return text


class Backoff(_Model):
    """Waits between restarts of a replica that crashed or never became ready: ``initial``,
    doubled per consecutive failure up to ``max``. After ``give_up_after`` consecutive
    failures the replica is reported failed and not started again until this ``replicas``
    section is edited (never an endless spawn loop)."""

    initial: Duration = Field(default=1.0, gt=0)
    max: Duration = Field(default=60.0, gt=0)
    give_up_after: int = Field(default=10, ge=1)


class Replicas(_Model):
    """How the replica manager runs a service's replicas (see the module docstring)."""

    command: str = Field(min_length=1)
    readiness: str = DEFAULT_HEALTH_PATH
    """A path (GET http://{host}:{port}<path>) or a full URL with placeholders; 200 = ready."""
    min: int = Field(default=1, ge=0, le=64)
    max: int = Field(default=1, ge=1, le=64)
    initial: int | None = Field(default=None, ge=0, le=64)
    """Replicas to start with; default ``min``. The autoscaler moves it within min..max."""
    host: str = "127.0.0.1"
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(
        default_factory=dict
    )
    cwd: str | None = None
    """Working directory of the command; default: the gateway's."""
    ready_timeout: Duration = Field(default=60.0, gt=0)
    """A replica not ready this long after it started counts as failed (it is stopped and
    retried with backoff)."""
    drain_timeout: Duration = 30.0
    """Longest wait, after a replica left the endpoints, for Envoy to stop routing to it."""
    stop_grace: Duration = 10.0
    """SIGTERM -> this long -> SIGKILL."""
    stable_after: Duration = Field(default=30.0, ge=0)
    """A replica ready this long has its failure count (and backoff) reset."""
    backoff: Backoff = Field(default_factory=Backoff)
    devices: list[Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9:_-]+$")]] | None = None
    """Accelerators to spread replicas over; each replica's CUDA_VISIBLE_DEVICES is one."""
    share_devices: bool = False
    """Allow two replicas on one device (needed when devices are fewer than max)."""

    @field_validator("command")
    @classmethod
    def _command(cls, value: str) -> str:
        try:
            words = shlex.split(value)
        except ValueError as error:
            raise ValueError(f"cannot split the command like a shell: {error}") from None
        if not words:
            raise ValueError("the command is empty")
        names = [n for word in words for n in placeholders_in(_check_placeholders(word))]
        if "port" not in names:
            raise ValueError(
                "the command must contain {port}: each replica listens on a port the "
                f"manager picks, e.g. '--http-port {{port}}'; got {value!r}"
            )
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(
                f"expected the IP address replicas listen on, such as 127.0.0.1, got {value!r}"
            ) from None
        return value

    @field_validator("readiness")
    @classmethod
    def _readiness(cls, value: str) -> str:
        _check_placeholders(value)
        if value.startswith("/"):
            return value
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                "expected a path such as /v2/health/ready or a URL such as "
                f"http://{{host}}:{{port}}/ready, got {value!r}"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for text in value.values():
            _check_placeholders(text)
        return value

    @property
    def start_count(self) -> int:
        return self.min if self.initial is None else self.initial
