"""Per-route traffic tools a rollout needs, usable on any route: request mirroring, sticky
splits, fault injection, and matching on a cookie.

* ``mirror``: Envoy copies ``percent`` of the route's requests to another service and throws
  its answers away, so a canary sees real inputs while clients only ever see the primary's
  answers (the output-agreement check compares the two).
* ``hash``: a sticky split. Envoy hashes the header (or cookie) to pick the weighted backend,
  so one user stays on one version; inferway writes weights as parts of a constant 10,000, so
  growing a canary keeps everyone it already had.
* ``fault``: abort or delay a percentage of requests in Envoy, to rehearse a rollback.
* ``match.cookies``: route on a cookie (e.g. force the canary for testers), alongside headers.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferway.policies.types import Duration

__all__ = ["CookieMatch", "Fault", "FaultAbort", "FaultDelay", "Mirror"]

Percent = Annotated[float, Field(ge=0, le=100)]
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


def _resolution(value: float, where: str) -> None:
    """Envoy receives percentages as parts of a million: finer values would be rounded."""
    if abs(value * 10_000 - round(value * 10_000)) > 1e-6:
        raise ValueError(f"{where} has 0.0001 resolution (parts of a million), got {value:g}")


class Mirror(_Model):
    """Shadow ``percent`` of the route's requests to ``service``; its answers are discarded."""

    service: str = Field(min_length=1)
    percent: Percent = 100.0

    @model_validator(mode="after")
    def _fine(self) -> Mirror:
        _resolution(self.percent, "percent")
        return self


class FaultAbort(_Model):
    """Answer ``percent`` of requests with ``status`` from Envoy, without calling upstream."""

    percent: Percent
    status: int = Field(default=503, ge=200, lt=600)

    @model_validator(mode="after")
    def _fine(self) -> FaultAbort:
        _resolution(self.percent, "percent")
        return self


class FaultDelay(_Model):
    """Hold ``percent`` of requests for ``duration`` before sending them upstream."""

    percent: Percent
    duration: Duration = Field(gt=0)

    @model_validator(mode="after")
    def _fine(self) -> FaultDelay:
        _resolution(self.percent, "percent")
        return self


class Fault(_Model):
    """Fault injection on a route; give abort, delay or both (a request may get both)."""

    abort: FaultAbort | None = None
    delay: FaultDelay | None = None

    @model_validator(mode="after")
    def _something(self) -> Fault:
        if self.abort is None and self.delay is None:
            raise ValueError("give abort, delay or both (an empty fault injects nothing)")
        return self


class CookieMatch(_Model):
    """Match one request cookie: exactly one of ``exact`` (its value) or ``present``."""

    name: str = Field(min_length=1)
    exact: str | None = None
    present: bool | None = None

    @field_validator("name")
    @classmethod
    def _token(cls, value: str) -> str:
        if not _TOKEN.fullmatch(value):
            raise ValueError(
                f"invalid cookie name {value!r}: a cookie name is an RFC 6265 token "
                "(letters, digits and !#$%&'*+.^_`|~- ; no spaces, '=' or ';')"
            )
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> CookieMatch:
        given = [k for k in ("exact", "present") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of exact or present (got {', '.join(given) or 'none'})"
            )
        if self.exact is not None and any(c in self.exact for c in ';,"\\ '):
            raise ValueError(
                f"a cookie value cannot hold ';', ',', '\"', '\\\\' or spaces, got {self.exact!r}"
            )
        return self
