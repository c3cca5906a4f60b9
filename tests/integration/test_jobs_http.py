"""Asynchronous jobs with the embedded store, as a user runs them: a real ``inferway serve``
over a real ONNX Runtime repository, driven over HTTP; callbacks to a real aiohttp receiver.
The store limit is checked on an in-process backend (the same servers, a small limit)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from inferway.backends.app import start_backend
from inferway.backends.jobs.settings import JobSettings
from inferway.devtools.demo_models import mlp_reference
from tests.backend_helpers import http_session, running_backend
from tests.jobs_support import (
    SIZES,
    CallbackReceiver,
    ServeProcess,
    metric,
    slow_body,
    submit,
    wait_for_job,
    write_job_repository,
)

pytestmark = pytest.mark.integration

X = np.linspace(-1, 1, SIZES[0], dtype=np.float32).reshape(1, -1)
MLP_BODY = {
    "id": "req-1",
    "inputs": [
        {"name": "x", "shape": [1, SIZES[0]], "datatype": "FP32", "data": X.ravel().tolist()}
    ],
}


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("jobs")
    serve = ServeProcess(
        write_job_repository(root), root / "serve.log", ["--jobs-concurrency", "1"]
    )
    try:
        yield serve.wait_ready()
    finally:
        serve.stop()


@pytest.fixture
async def session(backend: ServeProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=backend.url) as s:
        yield s


async def test_a_submitted_job_is_accepted_at_once_and_answers_what_the_request_would(
    session: aiohttp.ClientSession,
) -> None:
    status, doc, headers = await submit(session, "demo", MLP_BODY)
    assert status == 202, doc
    assert headers["Location"] == f"/v2/jobs/{doc['id']}"
    assert headers["Preference-Applied"] == "respond-async"
    assert doc["status"] == "queued" and doc["created_at"].endswith("+00:00")
    done = await wait_for_job(session, doc["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 1 and done["started_at"] and done["finished_at"]
    assert done["expires_at"] > done["finished_at"]
    (output,) = done["result"]["outputs"]
    expected = mlp_reference(X, sizes=SIZES, seed=0)
    np.testing.assert_allclose(
        np.array(output["data"]).reshape(expected.shape), expected, rtol=1e-4, atol=1e-5
    )
    async with session.post("/v2/models/demo/infer", json=MLP_BODY) as sync:
        assert sync.status == 200
        sync_answer = await sync.read()
    async with session.get(done["result_url"]) as result:
        assert result.status == 200
        assert await result.read() == sync_answer
    assert await metric(session, "inferway_backend_requests_total", protocol="job", code="200") >= 1


async def test_a_binary_answer_is_fetched_from_the_result_url_as_the_request_would_get_it(
    session: aiohttp.ClientSession,
) -> None:
    body = {**MLP_BODY, "parameters": {"binary_data_output": True}}
    _, doc, _ = await submit(session, "demo", body)
    done = await wait_for_job(session, doc["id"], {"succeeded"})
    assert "result" not in done and done["result_url"] == f"/v2/jobs/{doc['id']}/result"
    async with session.post("/v2/models/demo/infer", json=body) as sync:
        sync_header = sync.headers["Inference-Header-Content-Length"]
        sync_answer = await sync.read()
    async with session.get(done["result_url"]) as result:
        assert result.content_type == "application/octet-stream"
        assert result.headers["Inference-Header-Content-Length"] == sync_header
        assert await result.read() == sync_answer


async def test_a_bad_request_is_refused_at_submission_as_the_synchronous_one_is(
    session: aiohttp.ClientSession,
) -> None:
    bad = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    async with session.post("/v2/models/demo/infer", json=bad) as sync:
        sync_error = await sync.json()
        assert sync.status == 400
    status, doc, _ = await submit(session, "demo", bad)
    assert (status, doc) == (400, sync_error)
    status, doc, _ = await submit(session, "nope", MLP_BODY)
    assert status == 404 and "not found" in doc["error"]
    status, doc, _ = await submit(session, "demo", MLP_BODY, {"Inferway-Callback": "ftp://x/y"})
    assert status == 400 and "Inferway-Callback" in doc["error"]
    async with session.get("/v2/jobs/" + "0" * 32) as resp:
        assert resp.status == 404 and "no job" in (await resp.json())["error"]


async def test_a_cancelled_queued_job_is_never_computed_and_a_running_one_is_abandoned(
    session: aiohttp.ClientSession,
) -> None:
    rows_before = await metric(session, "inferway_backend_batch_size_sum", model="slow")
    # one job at a time (--jobs-concurrency 1): the first waits in the slow model's window,
    # the second waits in the job queue behind it
    _, running, _ = await submit(session, "slow", slow_body(1.0))
    await wait_for_job(session, running["id"], {"running"})
    _, queued, _ = await submit(session, "slow", slow_body(2.0))
    async with session.delete(f"/v2/jobs/{queued['id']}") as resp:
        assert resp.status == 200
        assert (await resp.json())["status"] == "cancelled"
    async with session.delete(f"/v2/jobs/{running['id']}") as resp:
        assert resp.status == 200
    async with session.delete(f"/v2/jobs/{running['id']}") as again:  # idempotent
        assert again.status == 200
    # the next job (two rows: a full batch, computed at once) runs once the abandoned one has
    # freed the worker; it is all that is ever computed
    _, after, _ = await submit(session, "slow", slow_body(3.0, rows=2))
    done = await wait_for_job(session, after["id"], {"succeeded"})
    assert done["result"]["outputs"][0]["data"] == [6.0] * 8
    rows = await metric(session, "inferway_backend_batch_size_sum", model="slow") - rows_before
    assert rows == 2, "a cancelled job was computed"
    never = await wait_for_job(session, queued["id"], {"cancelled"})
    assert never["started_at"] is None and never["attempts"] == 0
    abandoned = await wait_for_job(session, running["id"], {"cancelled"})
    assert abandoned["attempts"] == 1
    assert await metric(session, "inferway_backend_requests_total", protocol="job", code="499") >= 1
    async with session.get(f"/v2/jobs/{queued['id']}/result") as resp:
        assert resp.status == 409
    async with session.delete(f"/v2/jobs/{done['id']}") as resp:  # finished: too late
        assert resp.status == 409 and "already succeeded" in (await resp.json())["error"]


async def test_the_finished_job_is_posted_to_its_callback_again_after_a_failed_delivery(
    session: aiohttp.ClientSession,
) -> None:
    async with CallbackReceiver(statuses=[503]) as receiver:
        _, doc, _ = await submit(session, "demo", MLP_BODY, {"Inferway-Callback": receiver.url})
        assert doc["callback"] == {
            "url": receiver.url,
            "status": "pending",
            "attempts": 0,
            "last_error": None,
            "delivered_at": None,
        }
        done = await wait_for_job(
            session,
            doc["id"],
            {"succeeded"},
            until=lambda d: d["callback"]["status"] != "pending",
        )
    assert done["callback"]["status"] == "delivered", done
    assert done["callback"]["attempts"] == 2 and done["callback"]["last_error"] is None
    assert receiver.answered == [503, 200]
    posted = receiver.received[-1]
    assert posted["id"] == doc["id"] and posted["status"] == "succeeded"
    assert posted["result"]["outputs"][0]["name"] == "y"
    delivered = await metric(session, "inferway_backend_jobs_callbacks_total", outcome="delivered")
    assert delivered >= 1


async def test_the_store_refuses_a_job_past_its_limit_with_429(tmp_path: Path) -> None:
    models = write_job_repository(tmp_path)
    async with (
        running_backend(models, jobs=JobSettings(max_jobs=2, concurrency=1)) as handle,
        http_session(handle) as s,
    ):
        for value in (1.0, 2.0):
            status, _, _ = await submit(s, "slow", slow_body(value))
            assert status == 202
        status, doc, headers = await submit(s, "slow", slow_body(3.0))
        assert status == 429 and "job store full: 2 jobs held" in doc["error"]
        assert headers["Retry-After"] == "1"
        assert await metric(s, "inferway_backend_jobs_refused_total", reason="full") == 1
        assert await metric(s, "inferway_backend_jobs_submitted_total") == 2


async def test_a_job_runs_under_its_own_span_linked_to_the_submitting_request(
    tmp_path: Path,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    traceparent = {"traceparent": f"00-{client_trace}-{client_span}-01"}
    handle = await start_backend(
        write_job_repository(tmp_path), watch=False, jobs=JobSettings(), tracer_provider=provider
    )
    try:
        async with http_session(handle) as s:
            status, doc, _ = await submit(s, "demo", MLP_BODY, traceparent)
            assert status == 202
            await wait_for_job(s, doc["id"], {"succeeded"})
    finally:
        await handle.stop()
    by_name = {span.name: span for span in exporter.get_finished_spans()}
    submitted, job, infer = by_name["submit demo"], by_name["job demo"], by_name["infer demo"]
    assert submitted.kind is SpanKind.SERVER and submitted.parent is not None
    assert f"{submitted.context.trace_id:032x}" == client_trace
    assert f"{submitted.parent.span_id:016x}" == client_span
    assert job.kind is SpanKind.CONSUMER and job.parent is None  # a trace of its own ...
    assert [link.context.span_id for link in job.links] == [submitted.context.span_id]  # ... linked
    assert job.attributes["inferway.job_id"] == submitted.attributes["inferway.job_id"] == doc["id"]
    assert infer.parent is not None and infer.parent.span_id == job.context.span_id
    assert infer.attributes["inferway.status_code"] == "200"
