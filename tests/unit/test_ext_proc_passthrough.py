"""The no-change answer names the same phase as the message it answers."""

from __future__ import annotations

import pytest

from inferway.gateway.ext_proc_passthrough import passthrough

PHASES = [
    "request_headers",
    "request_body",
    "request_trailers",
    "response_headers",
    "response_body",
    "response_trailers",
]


@pytest.mark.parametrize("kind", PHASES)
def test_each_phase_is_answered_in_its_own_phase_with_no_mutation(kind: str) -> None:
    answer = passthrough(kind)
    assert answer.WhichOneof("response") == kind
    assert not getattr(answer, kind).ListFields()  # nothing changed, nothing to apply


def test_an_unknown_kind_gets_the_last_phase() -> None:
    assert passthrough(None).WhichOneof("response") == "response_trailers"
