"""OpenAI-compatible routes: a route's ``openai`` block, and the policy's ``llm`` settings.

.. code-block:: yaml

    llm:                                # the gateway's LLM processor (docs/llm.md)
      port: 18092
      client_key: {header: x-api-key}   # else Authorization: Bearer; always hashed
      limits: {tokens_per_minute: 20000, tokens_per_day: 1000000}   # per client key
    routes:
      - name: llama
        openai:
          model: llama-3-8b             # the body's "model"; what the backends serve
          aliases: [gpt-4o-mini]        # also accepted, rewritten to `model`
        backends:                       # weights, rollouts, mirror: as for any route
          - {service: llama-a, weight: 90}
          - {service: llama-b, weight: 10}

An ``openai`` route serves ``<prefix>/chat/completions``, ``/completions`` and
``/embeddings`` for the requests whose body names its model; ``<prefix>/models`` lists every
model. Streams pass through unbuffered; the route has no total timeout unless it sets one,
only ``idle_timeout`` between bytes (``openai.timeout`` sets one).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferway.policies.types import Duration

__all__ = ["DEFAULT_LLM_PORT", "ClientKey", "LlmGateway", "OpenAIRoute", "TokenLimits"]

DEFAULT_LLM_PORT = 18092


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


class OpenAIRoute(_Model):
    """What makes a route an OpenAI-compatible one."""

    model: str = Field(min_length=1, max_length=256)
    aliases: list[str] = Field(default_factory=list)
    prefix: str = "/v1"
    """Where the API lives: ``/v1`` (vLLM, llama.cpp), ``/openai/v1`` (KServe)."""
    idle_timeout: Duration = Field(default=60.0, gt=0)
    """The longest silence between two bytes of an answer; a stream may last longer."""
    timeout: Duration = Field(default=0.0, ge=0)
    """The longest a whole answer may take (0: no limit, the default: streams are long).
    The route's own ``timeout`` is not used for an openai route."""
    ask_for_usage: bool = True
    """Ask the engine for the usage chunk of a stream (``stream_options.include_usage``)
    when the client did not; false for an engine that refuses the option (its streams are
    then counted by chunks, marked estimated)."""

    @field_validator("aliases")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for alias in value:
            if not alias or len(alias) > 256:
                raise ValueError(f"an alias is a model name of 1 to 256 characters, got {alias!r}")
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.startswith("/") or value.endswith("/") or "//" in value:
            raise ValueError(f"prefix is a path such as /v1 (no trailing '/'), got {value!r}")
        return value

    @model_validator(mode="after")
    def _distinct(self) -> OpenAIRoute:
        if self.model in self.aliases:
            raise ValueError(f"alias {self.model!r} is the model's own name")
        return self


class ClientKey(_Model):
    """Which header says who the client is, for limits and the ``client`` label."""

    header: str = Field(default="x-api-key", min_length=1, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
    hash: bool = True
    """Hash the value (a credential never becomes a label); false for a header that names a
    client (``x-tenant``). The ``Authorization: Bearer`` fallback is always hashed."""


class TokenLimits(_Model):
    """Per client key; prompt and completion tokens both count."""

    tokens_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_day: int | None = Field(default=None, ge=1)


class LlmGateway(_Model):
    """Where the LLM processor listens (an Envoy external processor in the gateway) and what
    it enforces."""

    address: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_LLM_PORT, ge=1, le=65535)
    reports_port: int | None = Field(default=None, ge=1, le=65535)
    """Where the processor takes Envoy's reports on each answer (plain HTTP/1.1 from the
    Lua filter, docs/llm.md) on ``address``; default ``port + 1``."""
    transport: Literal["http", "ext_proc"] = "http"
    """How Envoy asks the processor about a request: ``http``, Envoy's Lua filter posts the
    whole body to the reports port and acts on the answer (one plain HTTP/1.1 call); or
    ``ext_proc``, Envoy's external processing filter over gRPC (two round trips, several
    times the processor's CPU: docs/llm.md, Overhead)."""
    stream_reader: Literal["auto", "lua"] = "auto"
    """Who reads streamed answers inside Envoy (``transport: http``): ``auto``, inferway's
    native module (C, ``inferway/xds/sse_module``) in every Envoy that says it can load it
    (those inferway starts, when a C compiler built the module), the Lua filter in the
    others; ``lua``, the Lua filter in every Envoy. ``ext_proc`` always uses the Lua filter."""
    timeout: Duration = Field(default=5.0, gt=0, le=60)
    """How long Envoy waits for each answer of the processor (the request then fails: the
    processor is what enforces limits, so it fails closed)."""
    client_key: ClientKey = Field(default_factory=ClientKey)
    limits: TokenLimits = Field(default_factory=TokenLimits)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024 * 1024, le=2**32 - 1)
    """The largest request body an openai route takes: Envoy holds the whole body while the
    processor reads it, so a listener with openai routes buffers up to this much per
    connection (Envoy's default, 1 MiB, would refuse a long prompt with 413)."""

    @property
    def report_port(self) -> int:
        """``reports_port``, or ``port + 1`` (``port - 1`` at the top of the range)."""
        if self.reports_port is not None:
            return self.reports_port
        return self.port + 1 if self.port < 65535 else self.port - 1
