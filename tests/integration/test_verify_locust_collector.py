"""The locust run's collector settings end to end: a real locust process (verify's runner)
against a real aiohttp server on loopback, with full collections deferred and without."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from inferway.tools.verify.expect import Probe
from inferway.tools.verify.load import LoadSettings, run_load
from tests.aiohttp_sites import start_site

pytestmark = pytest.mark.integration

PROBE = Probe("infer", "/v2/models/m/infer", (("content-type", "application/json"),), b"{}")


async def _serve() -> tuple[web.AppRunner, str]:
    async def infer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"outputs": []})

    app = web.Application()
    app.router.add_post("/v2/models/m/infer", infer)
    runner, port = await start_site(app)
    return runner, f"http://127.0.0.1:{port}"


async def test_locust_reports_its_collector_with_full_collections_deferred_or_not() -> None:
    runner, url = await _serve()
    try:
        documents = {}
        for defer in (True, False):
            settings = LoadSettings(
                users=20, duration_s=3.0, spawn_rate=20.0, think_time_s=0.05, defer_full_gc=defer
            )
            # run_load blocks on the locust process: off this loop, which serves the requests
            report = await asyncio.to_thread(run_load, url, [PROBE], settings)
            assert report.result["failures"] == 0 and report.result["requests"] > 100
            documents[defer] = report.result["load_generator"]
    finally:
        await runner.cleanup()
    deferred, default = documents[True], documents[False]
    assert deferred["full_collections_deferred"] is True
    assert "2" not in deferred["gc"]  # none during the run (the start-up one is not counted)
    assert isinstance(deferred["uncollected_objects"], int)
    assert default["full_collections_deferred"] is False
    assert default["uncollected_objects"] is None
    assert deferred["gc"]["0"]["collections"] >= 1  # the young collections still run
    for document in (deferred, default):
        assert document["peak_rss_mb"] > 20.0
