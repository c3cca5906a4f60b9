"""A decoded inference request and the outputs it asked for, independent of transport.

The JSON and gRPC codecs both produce a :class:`DecodedRequest`, so the servers pick outputs
and honour ``binary_data`` the same way whichever wire the request came in on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferway.backends.serving.input_validation import InferInputError

__all__ = ["DecodedRequest", "RequestedOutput", "check_requested_outputs", "select_outputs"]


@dataclass(frozen=True)
class RequestedOutput:
    """One entry of the request's ``outputs``; ``binary`` None means "use the default"."""

    name: str
    binary: bool | None = None


@dataclass
class DecodedRequest:
    """An inference request after decoding and validation."""

    inputs: dict[str, np.ndarray]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: tuple[RequestedOutput, ...] | None = None
    binary_output: bool = False


def select_outputs(
    results: Mapping[str, np.ndarray],
    requested: Sequence[RequestedOutput] | None,
    output_names: Sequence[str],
) -> list[tuple[str, np.ndarray, bool | None]]:
    """The outputs to return, in order, with each one's binary flag (None: use the default)."""
    if requested is None:
        names = [n for n in output_names if n in results] or list(results)
        return [(n, results[n], None) for n in names]
    check_requested_outputs(requested, output_names or list(results), have=results)
    return [(out.name, results[out.name], out.binary) for out in requested]


def check_requested_outputs(
    requested: Sequence[RequestedOutput],
    output_names: Sequence[str],
    *,
    have: Mapping[str, object] | None = None,
) -> None:
    """Refuse an output the model does not have (before computing, with ``have`` None: the
    model's declared ``output_names``; after, the outputs it produced)."""
    present = have if have is not None else output_names
    for out in requested:
        if out.name not in present:
            known = ", ".join(output_names)
            raise InferInputError(f"unknown output '{out.name}'; the model's outputs are: {known}")
