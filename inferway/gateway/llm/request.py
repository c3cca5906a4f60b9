"""An OpenAI-compatible request body: which model it names, whether it streams, and the body
the backend gets.

Pure. Two rewrites, and only when needed (an untouched body is passed on as is): an alias
becomes the model name the backends serve, and a stream whose client did not ask for
``stream_options.include_usage`` asks for it, so the gateway can count the engine's own
usage (the processor then drops that chunk before the client sees it).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["OPERATIONS", "BadRequest", "LlmRequest", "operation_of", "prepare_request"]

OPERATIONS = {
    "chat/completions": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}
"""The path's last part -> OpenTelemetry's ``gen_ai.operation.name``."""


class BadRequest(Exception):
    """A request the gateway answers itself (status, OpenAI-style error code, message)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class LlmRequest:
    model: str
    """The model the backends serve (the alias resolved)."""
    requested_model: str
    """What the client wrote."""
    stream: bool
    shows_usage: bool
    """The client sees any usage chunk: it asked for it itself, or the gateway did not ask
    (so there is nothing of the gateway's to drop)."""
    body: bytes | None
    """The rewritten body (None: send the client's unchanged)."""


def operation_of(path: str) -> str:
    """``/v1/chat/completions?x`` -> ``chat``; unknown paths -> ``chat``'s sibling ``other``."""
    path = path.split("?", 1)[0].rstrip("/")
    for suffix, operation in OPERATIONS.items():
        if path.endswith("/" + suffix):
            return operation
    return "other"


def prepare_request(
    body: bytes, models: Mapping[str, str], *, ask_for_usage: Container[str] | None = None
) -> LlmRequest:
    """``models``: every name and alias a route serves -> the name its backends serve;
    ``ask_for_usage``: the served models whose streams get ``include_usage`` (None: all).
    Raises BadRequest for a body that is not a JSON object or names no served model."""
    try:
        document: Any = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(400, "invalid_json", f"request body is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise BadRequest(400, "invalid_request", "request body must be a JSON object")
    requested = document.get("model")
    if not isinstance(requested, str) or not requested:
        raise BadRequest(400, "missing_model", "request body has no 'model' string")
    model = models.get(requested)
    if model is None:
        raise BadRequest(
            404, "model_not_found", f"model {requested!r} is not served here (GET /v1/models)"
        )
    stream = document.get("stream") is True
    options = document.get("stream_options")
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    changed = model != requested
    if changed:
        document["model"] = model
    asks = ask_for_usage is None or model in ask_for_usage
    if stream and not wants_usage and asks:
        merged = dict(options) if isinstance(options, dict) else {}
        merged["include_usage"] = True
        document["stream_options"] = merged
        changed = True
    return LlmRequest(
        model=model,
        requested_model=requested,
        stream=stream,
        shows_usage=wants_usage or not asks,
        body=orjson.dumps(document) if changed else None,
    )
