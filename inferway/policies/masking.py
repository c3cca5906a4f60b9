"""The policy's ``mask``: sensitive request data kept out of everything inferway logs or
traces (docs/routing.md#masking).

.. code-block:: yaml

    mask:
      fields: [parameters.user_email, inputs.0.data]   # JSON body fields, by dotted path
      patterns: ["ACC-[0-9]{6}"]                       # RE2, anywhere in a logged string
      builtins: [email, phone, id_number]              # the default: all three
      sink: {address: 127.0.0.1, port: 18096}          # where Envoy's logs and spans go first

Matches are replaced by ``replacement``. The built-ins are deliberately narrow (a date or a
request id must not look like a phone number): e-mail addresses; phone numbers written with
a country code (``+44 20 7946 0958``, ``+14155550100``) or as ``(555) 123-4567`` /
``555-123-4567``; ID numbers as US social security numbers (``123-45-6789``), 18-character
resident ID numbers and 16-digit card numbers.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferway.policies.features import FIELD_PATH_PATTERN

__all__ = ["BUILTIN_NAMES", "DEFAULT_MASK_SINK_PORT", "Mask", "MaskSink"]

DEFAULT_MASK_SINK_PORT = 18096
Builtin = Literal["email", "phone", "id_number"]
BUILTIN_NAMES: tuple[Builtin, ...] = ("email", "phone", "id_number")
"""The built-in patterns (observability/masking.py holds their regexes)."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


class MaskSink(_Model):
    """Where the gateway receives Envoy's access log lines and spans to mask them before they
    are written (or forwarded to the collector)."""

    address: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_MASK_SINK_PORT, ge=1, le=65535)


class Mask(_Model):
    fields: list[str] = Field(default_factory=list)
    """JSON body fields whose values are never shown, whatever they hold."""
    patterns: list[str] = Field(default_factory=list)
    """RE2 patterns (checks_ranges compiles them); every match is masked."""
    builtins: list[Builtin] = Field(default_factory=lambda: list(BUILTIN_NAMES))
    replacement: str = Field(default="[MASKED]", min_length=1, max_length=64)
    sink: MaskSink = Field(default_factory=MaskSink)

    @field_validator("fields")
    @classmethod
    def _dotted(cls, values: list[str]) -> list[str]:
        for value in values:
            if not re.match(FIELD_PATH_PATTERN, value):
                raise ValueError(
                    f"field {value!r}: dotted keys such as parameters.user_email or inputs.0.data"
                )
        return values
