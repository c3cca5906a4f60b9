"""One request through the LLM processor, from its headers to the end of its answer.

Holds what a stream needs between ext_proc messages: who the client is, which model it
asked for, whether the gateway added ``include_usage`` (then the usage chunk is dropped
before this client sees it), the SSE splitter and the tally of the answer. Plain values in,
plain values out: the gRPC servicer (processor.py) does the protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from inferway.gateway.llm.accounting import StreamTally, Usage, estimate_prompt_tokens, usage_of
from inferway.gateway.llm.limits import TokenBudget
from inferway.gateway.llm.metrics import Exchange
from inferway.gateway.llm.request import LlmRequest
from inferway.gateway.llm.sse import SseSplitter

__all__ = ["MAX_PLAIN_ANSWER", "LlmSettings", "LlmStream", "counted_so_far"]

MAX_PLAIN_ANSWER = 16 * 1024 * 1024
"""A non-streamed answer is read for its ``usage`` up to this size (embeddings can be
large); past it the answer still passes whole, and its tokens are estimated."""


@dataclass(frozen=True)
class LlmSettings:
    """What the live policy tells the processor (swapped whole on every apply)."""

    models: Mapping[str, str] = field(default_factory=dict)
    """Every model name and alias an openai route serves -> the name its backends serve."""
    routes: Mapping[str, str] = field(default_factory=dict)
    """Served model -> its route (the label when Envoy does not name the route)."""
    ask_for_usage: frozenset[str] | None = None
    """Served models whose streams get ``include_usage`` added (``openai.ask_for_usage``;
    None: every model)."""
    prefixes: tuple[str, ...] = ("/v1",)
    """The openai routes' path prefixes: a request outside all of them is not the
    processor's (a route of another kind, or none: Envoy's own 404)."""
    client_header: str = "x-api-key"
    hash_client: bool = True
    budget: TokenBudget | None = None


class LlmStream:
    """``started``: monotonic seconds when the request's headers reached the processor."""

    def __init__(self, client: str, operation: str, started: float) -> None:
        self.client = client
        self.operation = operation
        self.started = started
        self.request: LlmRequest | None = None
        self.prompt_bytes = 0
        self.status = 0
        self.route = ""
        self.backend = ""
        self.sse = False
        self.drop_usage = False
        self.splitter = SseSplitter()
        self.tally = StreamTally()
        self._plain = bytearray()
        self._plain_overflow = False
        self.finished = False
        self.id = ""
        """Names the stream in the Lua filter's reports (set when the body is read)."""
        self.wall_started = 0.0
        """``time.time()`` when ``started`` was taken: the filter's times are wall-clock."""

    def on_request(self, request: LlmRequest, prompt_bytes: int, route: str) -> None:
        self.request, self.prompt_bytes, self.route = request, prompt_bytes, route
        self.drop_usage = request.stream and not request.shows_usage

    def on_response_headers(
        self, status: int, content_type: str, route: str | None, backend: str | None
    ) -> None:
        self.status = status
        self.sse = content_type.split(";", 1)[0].strip().lower() == "text/event-stream"
        self.route = route or self.route
        self.backend = backend or self.backend

    def on_response_chunk(self, chunk: bytes, end: bool, now: float) -> bytes | None:
        """What replaces ``chunk`` for the client (None: pass it as it is)."""
        if not self.sse:
            if len(self._plain) + len(chunk) <= MAX_PLAIN_ANSWER:
                self._plain += chunk
            else:
                self._plain_overflow = True
            return None
        events = self.splitter.feed(chunk)
        if end:
            events += self.splitter.finish()
        kept: list[bytes] = []
        for event in events:
            usage_only = event.data is not None and self.tally.on_data(event.data, now)
            if not (usage_only and self.drop_usage):
                kept.append(event.raw)
        if not self.drop_usage:
            return None
        return b"".join(kept)  # an unfinished event waits for the next chunk

    def on_envoy_report(self, report: Mapping[str, object], plain: bytes) -> None:
        """What Envoy's Lua filter saw of the answer (llm_stream.py): its status, route and
        backend; for a stream the chunks with text, the first and last of their times
        (wall-clock microseconds), usage and model; for a plain answer its bytes (``plain``,
        on the final report; none when it was too large: estimated)."""
        if not self.status:
            status, route, backend = (
                report.get("status"),
                report.get("route"),
                report.get("backend"),
            )
            self.on_response_headers(
                status if isinstance(status, int) else 0,
                "text/event-stream" if report.get("sse") is True else "",
                route if isinstance(route, str) and route else None,
                backend if isinstance(backend, str) and backend else None,
            )
        if not self.sse:
            if report.get("final") is True:
                self._plain_overflow = report.get("overflow") is True
                if not self._plain_overflow:
                    self._plain = bytearray(plain)
            return
        tally = self.tally
        chunks, first, last = report.get("chunks"), report.get("first"), report.get("last")
        if isinstance(chunks, int):
            tally.chunks = chunks
        if isinstance(first, int):
            tally.first_token_at = self.started + first / 1e6 - self.wall_started
        if isinstance(last, int):
            tally.last_token_at = self.started + last / 1e6 - self.wall_started
        prompt, completion = report.get("prompt"), report.get("completion")
        if isinstance(prompt, int) and isinstance(completion, int):
            tally.usage = (prompt, completion)
        model = report.get("model")
        if isinstance(model, str) and model:
            tally.response_model = model
        tally.done = report.get("done") is True

    def started_at_wall(self, micros: str) -> None:
        """The stream started at ``micros`` (Envoy's wall clock, microseconds), when sane: not in
        the future, and less than a minute ago."""
        try:
            wall = int(micros) / 1e6
        except ValueError:
            return
        ago = self.wall_started - wall
        if 0.0 <= ago < 60.0:
            self.wall_started = wall
            self.started -= ago

    def usage(self) -> Usage:
        if self.sse:
            return self.tally.result(self.prompt_bytes)
        counted = None
        if self._plain and not self._plain_overflow:
            try:
                document = orjson.loads(bytes(self._plain))
            except orjson.JSONDecodeError:
                document = None
            counted = usage_of(document)
            if isinstance(document, dict) and isinstance(document.get("model"), str):
                self.tally.response_model = document["model"]
        if counted is not None:
            return Usage(counted[0], counted[1], estimated=False)
        if self.status and self.status >= 400:
            return Usage(0, 0, estimated=False)  # refused: nothing was generated
        return Usage(estimate_prompt_tokens(self.prompt_bytes), 0, estimated=True)

    def outcome(self) -> tuple[Exchange, Usage]:
        """The finished request's record (call once, at the end of the answer or stream)."""
        self.finished = True
        usage = self.usage()
        request = self.request
        model = request.model if request else ""
        ttft = None
        tally = self.tally
        if self.sse and tally.first_token_at is not None:
            ttft = tally.first_token_at - self.started
        exchange = Exchange(
            route=self.route,
            model=model,
            requested_model=request.requested_model if request else "",
            response_model=tally.response_model or model,
            backend=self.backend,
            client=self.client,
            operation=self.operation,
            stream=bool(request and request.stream),
            code=self.status,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            estimated=usage.estimated,
            ttft_s=ttft,
            time_per_output_token_s=(
                tally.time_per_output_token(usage.output_tokens) if self.sse else None
            ),
        )
        return exchange, usage


def counted_so_far(tags: Mapping[str, object]) -> dict[str, object]:
    """The Lua filter's metadata as a progress report (Struct numbers are floats, its token
    times and usage strings)."""

    def number(key: str) -> int | None:
        value = tags.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return None
        try:
            return int(value)
        except (ValueError, OverflowError):
            return None

    return {
        "final": False,
        "status": number("status") or 0,
        "route": tags.get("route"),
        "backend": tags.get("backend"),
        "sse": tags.get("sse") is True,
        "chunks": number("chunks"),
        "first": number("first"),
        "last": number("last"),
        "prompt": number("prompt"),
        "completion": number("completion"),
        "model": tags.get("model_answered"),
        "done": tags.get("done") is True,
    }
