"""Decoding plans for binary-extension requests, by JSON head.

A client of the binary tensor extension sends the same JSON head with every request of one
shape (input names, datatypes, shapes, ``binary_data_size``, options); only the tensor bytes
after it change. Decoding that head (parse it, check every field, check it against the model)
is the largest part of what such a request costs the front end, so the first request with a
given head is decoded the full way (``decode_json_request``) and leaves a plan: where each
input's bytes lie and the request's options. A later request with the same head bytes, for the
same model, takes its tensors straight from its body: the same arrays, from the same checks.

Only heads whose every input is a numeric binary tensor are kept (a head with JSON ``data``
carries the tensor itself and never repeats; BYTES tensors are parsed element by element), and
at most ``capacity`` of them (the oldest is dropped first). A request that does not decode is
never planned: every bad request takes the full path and gets its own error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferway.backends.protocol.binary_codec import split_binary_body
from inferway.backends.protocol.json_codec import decode_json_request, parse_json_header
from inferway.backends.runners.base import TensorSpec
from inferway.backends.serving.input_validation import DATATYPES
from inferway.backends.serving.request import DecodedRequest, RequestedOutput

__all__ = ["DEFAULT_CAPACITY", "DecodePlans"]

DEFAULT_CAPACITY = 256
"""Distinct heads kept: a client's few request shapes, for every model, with room to spare."""


@dataclass(frozen=True, slots=True)
class _Tensor:
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    start: int  # the offset in the whole body (its head included); the size is the shape's


@dataclass(frozen=True, slots=True)
class _Plan:
    specs: Sequence[TensorSpec]  # the model's inputs it was checked against (by identity)
    body_size: int
    tensors: tuple[_Tensor, ...]
    request_id: str | None
    parameters: Mapping[str, Any]
    outputs: tuple[RequestedOutput, ...] | None
    binary_output: bool


class DecodePlans:
    """Plans by (model, version, head bytes); one per front end, used from its event loop."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._plans: dict[tuple[str, str, bytes], _Plan] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._plans)

    def decode(
        self,
        model: str,
        version: str,
        body: bytes,
        header_length: str | None,
        specs: Sequence[TensorSpec],
    ) -> DecodedRequest:
        """The request in ``body`` decoded for the model whose inputs are ``specs``; raises
        InferInputError, as ``decode_json_request`` does, for one that does not fit."""
        if header_length is not None and header_length.isascii() and header_length.isdigit():
            length = int(header_length)
            key = (model, version, body[:length])
            plan = self._plans.get(key)
            if plan is not None and plan.specs is specs and plan.body_size == len(body):
                self.hits += 1
                return _apply(plan, body)
        else:
            key = None
        self.misses += 1
        head, binary = split_binary_body(body, header_length)
        doc = parse_json_header(head)
        decoded = decode_json_request(doc, binary, specs)
        if key is not None and self.capacity:
            plan = _plan_of(doc, decoded, specs, len(head), len(body))
            if plan is not None:
                self._keep(key, plan)
        return decoded

    def _keep(self, key: tuple[str, str, bytes], plan: _Plan) -> None:
        plans = self._plans
        plans.pop(key, None)
        while len(plans) >= self.capacity:
            del plans[next(iter(plans))]  # the oldest
        plans[key] = plan


def _apply(plan: _Plan, body: bytes) -> DecodedRequest:
    inputs: dict[str, np.ndarray] = {}
    for t in plan.tensors:
        arr = np.ndarray(t.shape, t.dtype, body, t.start)  # a read-only view of its bytes
        if not arr.flags.aligned:  # the head's length put it off its alignment: copy it
            arr = arr.copy()
            arr.flags.writeable = False  # read-only, as every tensor from a request body is
        inputs[t.name] = arr
    return DecodedRequest(
        inputs=inputs,
        id=plan.request_id,
        parameters=dict(plan.parameters),
        outputs=plan.outputs,
        binary_output=plan.binary_output,
    )


def _plan_of(
    doc: Mapping[str, Any],
    decoded: DecodedRequest,
    specs: Sequence[TensorSpec],
    head_size: int,
    body_size: int,
) -> _Plan | None:
    """The plan of a request that decoded, or None when it is not all numeric binary."""
    if any(isinstance(v, dict | list) for v in decoded.parameters.values()):
        return None  # shared between requests, a nested value could be changed by one
    tensors = []
    offset = head_size
    for item in doc["inputs"]:  # decode_json_request checked every field of each
        size = (item.get("parameters") or {}).get("binary_data_size")
        datatype = item["datatype"]
        if size is None or datatype == "BYTES":
            return None
        name = item["name"]
        tensors.append(_Tensor(name, DATATYPES[datatype], decoded.inputs[name].shape, offset))
        offset += size
    return _Plan(
        specs=specs,
        body_size=body_size,
        tensors=tuple(tensors),
        request_id=decoded.id,
        parameters=dict(decoded.parameters),
        outputs=decoded.outputs,
        binary_output=decoded.binary_output,
    )
