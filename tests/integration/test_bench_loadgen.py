"""The batching benchmark's load generator against a real backend: every protocol's client
gets well-formed answers, and a wrong model name counts as an error instead of a success."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from inferway.devtools.demo_models import write_demo_repository

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from loadgen import PROTOCOLS, LoadSpec, run_spec

from tests.backend_helpers import running_backend

pytestmark = pytest.mark.integration


@pytest.fixture
async def backend(tmp_path: Path):
    write_demo_repository(tmp_path, "mlp", sizes=(8, 16, 4))
    async with running_backend(tmp_path) as handle:
        yield handle


def _spec(backend, protocol: str, model: str = "mlp", **kw) -> LoadSpec:
    base = dict(
        protocol=protocol,
        host="127.0.0.1",
        http_port=backend.http_port,
        grpc_port=backend.grpc_port,
        model=model,
        width=8,
        kind="closed",
        duration_s=0.3,
        concurrency=4,
    )
    base.update(kw)
    return LoadSpec(**base)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_closed_and_open_loop_get_answers_on_every_protocol(backend, protocol) -> None:
    closed = await run_spec(_spec(backend, protocol))
    # every one of the 4 clients gets answers (how many in 0.3 s depends on the machine's load)
    assert closed["errors"] == [] and len(closed["latencies_s"]) >= 4
    opened = await run_spec(_spec(backend, protocol, kind="open", rate=200.0))
    assert opened["errors"] == []
    assert len(opened["latencies_s"]) == opened["sent"] > 20


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_failed_requests_are_counted_as_errors(backend, protocol) -> None:
    result = await run_spec(_spec(backend, protocol, model="missing", concurrency=1))
    assert result["latencies_s"] == [] and len(result["errors"]) > 0
