"""A job's stored request as the serving core sees it (an InferCall), so a job goes through
exactly the lifecycle of a synchronous request: lookup, limits, decoding, deadline, span,
batcher, outputs, metrics. Its answer is the normal OIP response body, kept as bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferway.backends.protocol.binary_codec import split_binary_body
from inferway.backends.protocol.json_codec import (
    decode_json_request,
    encode_json_response,
    parse_json_header,
)
from inferway.backends.serving.core import Chosen, Transport
from inferway.backends.serving.request import DecodedRequest

if TYPE_CHECKING:
    from inferway.backends.models.served_model import ServedModel

__all__ = ["JOB", "JobAnswer", "JobCall", "decode_job_request"]

JOB = Transport(protocol="job", wire="http", call_request_ids=False)
"""Jobs are counted apart from synchronous HTTP (protocol="job"), with HTTP status codes."""


def decode_job_request(
    model: ServedModel, body: bytes, binary_header: str | None
) -> DecodedRequest:
    """Decode and validate a request as POST .../infer does (InferInputError when bad)."""
    head, binary = split_binary_body(body, binary_header)
    return decode_json_request(parse_json_header(head), binary, model.inputs)


@dataclass(frozen=True, slots=True)
class JobAnswer:
    """The OIP response body, and its JSON header's length when outputs travel as binary."""

    body: bytes
    binary_header: int | None
    version: str


class JobCall:
    """One stored request replayed through the serving core (see InferCall)."""

    __slots__ = ("binary_header", "body", "model_name", "model_version", "timeout_s")
    needs_read = False

    def __init__(
        self,
        model: str,
        version: str | None,
        body: bytes,
        binary_header: str | None,
        timeout_s: float | None,
    ) -> None:
        self.model_name = model
        self.model_version = version
        self.body = body
        self.binary_header = binary_header
        self.timeout_s = timeout_s

    def body_size(self) -> int | None:
        return len(self.body)

    async def read_body(self, limit: int, model: str) -> None:
        return None  # stored whole at submission

    def decode(self, model: ServedModel) -> DecodedRequest:
        return decode_job_request(model, self.body, self.binary_header)

    def transport_timeout_s(self) -> float | None:
        """The job's own deadline (--jobs-timeout): the submitting connection's is over."""
        return self.timeout_s

    def encode(self, model: ServedModel, decoded: DecodedRequest, outputs: Chosen) -> JobAnswer:
        payload, head_len = encode_json_response(
            model_name=model.name,
            model_version=str(model.version),
            request_id=decoded.id,
            outputs=outputs,
            binary_default=decoded.binary_output,
        )
        return JobAnswer(payload, head_len, str(model.version))
