"""The request lane's answers (plain HTTP/1.1 on the processor's reports port): what Envoy's
Lua filter (xds/translate/llm_stream.py) does with a request it asked about.

- admitted: 200, the served model (percent-encoded: a policy's model name may hold any
  character), the stream's id, whether the usage chunk is dropped, and the rewritten body
  when there is one;
- refused: the client's status and OpenAI-style body, ``Retry-After`` for a limit, and
  ``x-inferway-llm-refusal`` (the error's code), which tells the filter the processor refused
  it (any other status means the processor could not be asked: the request fails closed);
- let go (not the processor's request): 200 without a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from inferway.gateway.llm.answers import Refused, error_body
from inferway.gateway.llm.exchange import LlmStream
from inferway.xds.translate.llm_stream import (
    ANSWER_DROP_USAGE,
    ANSWER_ID,
    ANSWER_MODEL,
    ANSWER_REFUSAL,
    ANSWER_REWRITTEN,
    FORWARDED_AUTHORIZATION,
    FORWARDED_KEY,
    FORWARDED_PATH,
)

__all__ = ["admitted", "forwarded_headers", "let_go", "refused"]

_REASONS = {
    400: "Bad Request",
    404: "Not Found",
    413: "Payload Too Large",
    429: "Too Many Requests",
}


def forwarded_headers(forwarded: Mapping[str, str], client_header: str) -> dict[str, str]:
    """The request's headers the Lua filter forwards (``x-inferway-*``), under their own
    names: the path, the client key header, ``Authorization``."""
    return {
        ":path": forwarded.get(FORWARDED_PATH, ""),
        client_header.lower(): forwarded.get(FORWARDED_KEY, ""),
        "authorization": forwarded.get(FORWARDED_AUTHORIZATION, ""),
    }


def _answer(status: int, headers: list[tuple[str, str]], body: bytes) -> bytes:
    head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'OK' if status == 200 else 'Refused')}"]
    head.extend(f"{name}: {value}" for name, value in headers)
    head.append(f"content-length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def admitted(stream: LlmStream) -> bytes:
    request = stream.request
    assert request is not None, "admitted once its body was read"
    headers = [
        (ANSWER_MODEL, quote(request.model, safe="")),
        (ANSWER_ID, stream.id),
        (ANSWER_DROP_USAGE, "1" if stream.drop_usage else "0"),
        (ANSWER_REWRITTEN, "0" if request.body is None else "1"),
    ]
    return _answer(200, headers, request.body or b"")


def refused(refusal: Refused) -> bytes:
    headers = [("content-type", "application/json"), (ANSWER_REFUSAL, refusal.code)]
    if refusal.retry_after_s is not None:
        headers.append(("retry-after", str(refusal.retry_after_s)))
    return _answer(refusal.status, headers, error_body(refusal))


def let_go() -> bytes:
    return _answer(200, [], b"")
