"""IR of OpenAI-compatible routes and of the LLM processor Envoy asks about them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LlmGatewayIR", "LlmRouteIR"]


@dataclass(frozen=True)
class LlmRouteIR:
    model: str
    """The body's ``model`` this route serves (what its backends serve)."""
    aliases: tuple[str, ...]
    """Other names accepted for it (the processor rewrites them to ``model``)."""
    prefix: str
    idle_timeout: float
    timeout: float
    """The whole answer's limit (0: none)."""
    ask_for_usage: bool = True
    """Its streams get ``stream_options.include_usage`` when the client did not ask."""


@dataclass(frozen=True)
class LlmGatewayIR:
    """Where Envoy reaches the LLM processor; set when some route is an ``openai`` one."""

    host: str
    port: int
    reports_port: int
    """Where Envoy's Lua filter sends its reports on each answer (plain HTTP/1.1)."""
    timeout: float
    max_body_bytes: int
    """The per-connection buffer limit of a listener with openai routes."""
    transport: str = "http"
    """``http``: Envoy's Lua filter asks the processor over the reports port; ``ext_proc``:
    Envoy's external processing filter does, over gRPC."""
    stream_reader: str = "lua"
    """Who reads streamed answers in Envoy: ``lua`` (the Lua filter), ``native`` (inferway's
    module after it; only for Envoys that can load it) or ``auto`` (the policy's default:
    ``native`` for the node groups whose Envoys say they can, ``xds/node_groups.py``)."""
    client_header: str = "x-api-key"
    """The client key's header (the Lua filter forwards it when it asks)."""
    limited: bool = False
    """Token limits are set: every request is asked about before it goes upstream (with
    ``http``, no admission inside Envoy)."""
