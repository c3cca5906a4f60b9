"""A bounded fuzzing run against a live ``inferway serve`` (issue 33): generated inference
requests (tests/request_fuzz.py) each get exactly one whole 2xx/4xx answer, strict JSON when
JSON; afterwards the server still answers and its log holds no traceback. One server for the
whole module, real sockets on loopback; the long run is bench/fuzz_requests.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from tests.request_fuzz import FuzzServer, RequestCase, check_answer, fuzz_server, requests, send

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["fast", "aiohttp"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[FuzzServer]:
    with fuzz_server(tmp_path_factory.mktemp(f"fuzz-{request.param}"), request.param) as running:
        yield running
        assert running.healthy(), "the server stopped answering"
        log = running.log_text()
        assert "Traceback" not in log, log[-4000:]


def test_every_generated_request_gets_one_good_answer(server: FuzzServer) -> None:
    @settings(
        max_examples=250,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=requests())
    def one(case: RequestCase) -> None:
        _, wrong = check_answer(case, send(server, case))
        assert wrong is None, f"{case!r}: {wrong}"

    one()
    assert server.healthy(), "the server stopped answering"
    assert "Traceback" not in server.log_text(), server.log_text()[-4000:]
