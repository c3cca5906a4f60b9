"""The endpoint picker for real (issue 35): real Envoy, the gateway's own picker (here mostly
asked over ext_proc, answering with GAIE's Endpoint Picker protocol; the default ``transport:
http`` has tests/integration/test_picker_http_lane_envoy.py too) and three real llama.cpp engines
with their prompt cache on (tests/llm_engine.py). Requests sharing a long prefix go to the
engine that holds it until it is saturated; concurrent requests spread by queue depth; a dead
picker fails open (the service's own balancing) or closed (503) without hanging a request;
the same holds over ``transport: http``; and a minimal GAIE picker written here, named as
``external``, steers every request."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import grpc
import httpx
import pytest
from google.protobuf import struct_pb2
from rich.console import Console

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.config.listener.v3 import listener_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_proc.v3 import (
    ext_proc_pb2,
    processing_mode_pb2,
)
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2 as ep_pb2,
)
from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2_grpc as ep_grpc,
)
from inferway.cli.status import render_status
from inferway.resolve import IR
from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.translate import translate
from inferway.xds.translate.picker import ACCESS_LOG_FLUSH_S, picker_filter
from tests.envoy_process import free_port
from tests.llm_engine import LLMEngine, require_llm_engine, start_llm_engine, write_test_model
from tests.traffic_harness import TrafficGateway

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]

POLICY = """
version: 1
listeners:
  - name: ingress
    port: {listener_port}
services:
  - name: llm
    endpoints: [ENDPOINTS]
    health_check:
      path: /v1/models
      interval: 1s
    picker:
      listen: 127.0.0.1:PICKER_PORT
      scorers:
        queue: 2
        kv_cache: 2
        prefix: 3
      queue_limit: 2
      metrics_path: null
      timeout: 2s
      fail: FAIL
      transport: ext_proc
routes:
  - name: chat
    match:
      path:
        prefix: /v1/
    backends:
      - service: llm
"""
SYSTEM = "You are a careful assistant for tenant {}. " * 60  # ~2.6k characters: 40+ blocks


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LLMEngine]]:
    require_llm_engine()
    model = write_test_model(tmp_path_factory.mktemp("picker"))
    started: list[LLMEngine] = []
    try:
        for _ in range(3):
            started.append(start_llm_engine(model, n_ctx=4096, cache=True))
        yield started
    finally:
        for engine in started:
            engine.stop()


def _policy(
    engines: list[LLMEngine],
    *,
    fail: str = "open",
    picker: str | None = None,
    transport: str = "ext_proc",
) -> str:
    text = (
        POLICY.replace("ENDPOINTS", ", ".join(f'"127.0.0.1:{e.port}"' for e in engines))
        .replace("PICKER_PORT", str(free_port()))
        .replace("FAIL", fail)
    )
    if transport == "http":  # the default, on a port of its own (not listen's next)
        text = text.replace(
            "      transport: ext_proc\n", f"      http_listen: 127.0.0.1:{free_port()}\n"
        )
    if picker is not None:  # an external picker: the own picker's settings go
        head, _, _ = text.partition("    picker:\n")
        _, _, routes = text.partition("routes:\n")
        text = f"{head}    picker:\n{picker}routes:\n{routes}"
    return text


@pytest.fixture
async def gateway(engines: list[LLMEngine]) -> AsyncIterator[TrafficGateway]:
    async with TrafficGateway(_policy(engines), []) as gw:
        await _wait_healthy(gw)
        yield gw


async def _wait_healthy(gw: TrafficGateway) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, _, _ = await _chat(gw, "warm-up", "hello")
        if status == 200:
            return
        await asyncio.sleep(0.2)
    raise AssertionError("no 200 through the gateway within 20 s")


async def _chat(
    gw: TrafficGateway, tenant: str, question: str, max_tokens: int = 4, timeout: float = 30
) -> tuple[int, str, Any]:
    """(status, the replica that served it, the body) of one chat completion."""
    assert gw.session is not None
    body = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": SYSTEM.replace("{}", tenant)},
            {"role": "user", "content": question},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    async with asyncio.timeout(timeout):
        async with gw.session.post(f"{gw.url}/v1/chat/completions", json=body) as response:
            text = await response.text()
            served = response.headers.get("x-inferway-replica", "")
            payload = json.loads(text) if text.startswith("{") else text
            return response.status, served, payload


def _prompt_evals(engine: LLMEngine) -> list[int]:
    """Tokens each request's prompt evaluation took, from llama.cpp's timing lines."""
    return [
        int(n) for n in re.findall(r"prompt eval time =.*?/\s*(\d+) tokens", engine.log_tail(10**8))
    ]


async def test_a_shared_prefix_goes_to_the_engine_holding_it(
    gateway: TrafficGateway, engines: list[LLMEngine]
) -> None:
    gw = gateway
    status, holder, _ = await _chat(gw, "acme", "first question")
    assert status == 200 and holder
    engine = next(e for e in engines if holder.endswith(f":{e.port}"))
    evaluated_before = len(_prompt_evals(engine))
    for i in range(6):  # one at a time: never saturated
        status, served, _ = await _chat(gw, "acme", f"question number {i}")
        assert (status, served) == (200, holder)
    # the engine reused the prefix: it evaluated only each question, not the system prompt
    evaluated = _prompt_evals(engine)[evaluated_before:]
    assert len(evaluated) == 6 and max(evaluated) < 40, evaluated
    assert gw.gateway is not None and gw.gateway.pickers is not None
    pool = gw.gateway.pickers.pool("llm")
    assert pool is not None
    stats = pool.picker.stats()[holder]
    assert stats["prefix_hit_rate"] is not None and stats["prefix_hit_rate"] > 0.5
    explained = pool.last_explained()
    assert explained is not None
    assert explained["picker.winner"] == holder and "prefix 1.00" in explained["picker.reason"]
    # status: per endpoint queue, KV-cache use and prefix hits, and the last pick's reason
    async with httpx.AsyncClient(base_url=gw.gateway.admin.url, timeout=5) as admin:
        document = (await admin.get("/status")).json()
    shown = document["pickers"]["llm"]
    assert shown["endpoints"][holder]["picks"] >= 7 and len(shown["endpoints"]) == len(engines)
    assert shown["endpoints"][holder]["prefix_hit_rate"] > 0.5
    assert shown["last_pick"]["picker.winner"] == holder
    assert shown["asked"]["transport"] == "ext_proc"
    console = Console(record=True, width=240)
    render_status(document, console)
    text = console.export_text()
    assert f"endpoint picker: llm (asked over ext_proc at {shown['asked']['address']})" in text
    assert holder in text and "last pick:" in text


def _picker_body_streamed(ir: IR) -> Resources:
    """What inferway translates, but Envoy streams the request's body to the picker
    (``FULL_DUPLEX_STREAMED``), as a GAIE-style gateway may be configured to."""
    resources = translate(ir)
    listeners = resources.typed(type_urls.LISTENER, listener_pb2.Listener)
    mode = processing_mode_pb2.ProcessingMode
    for listener in listeners.values():
        for chain in listener.filter_chains:
            for network_filter in chain.filters:
                manager = hcm_pb2.HttpConnectionManager()
                network_filter.typed_config.Unpack(manager)
                for http_filter in manager.http_filters:
                    if http_filter.name != picker_filter("llm"):
                        continue
                    config = ext_proc_pb2.ExternalProcessor()
                    http_filter.typed_config.Unpack(config)
                    config.processing_mode.request_body_mode = mode.FULL_DUPLEX_STREAMED
                    config.processing_mode.request_trailer_mode = mode.SEND
                    http_filter.typed_config.Pack(config)
                network_filter.typed_config.Pack(manager)
    by_type = {url: dict(resources.of_type(url)) for url in resources.type_urls()}
    by_type[type_urls.LISTENER] = dict(listeners)
    return Resources.build({url: named.items() for url, named in by_type.items()})


async def test_a_body_streamed_to_the_picker_is_picked_on_and_passed_on_whole(
    engines: list[LLMEngine],
) -> None:
    """A gateway that streams the body (``FULL_DUPLEX_STREAMED``) gets the pick on the
    headers' answer once the body has ended, and the body back whole: the prefix holder is
    picked and the engine reads the request (it answers 200, and its prompt cache holds)."""
    policy = _policy(engines, fail="closed")
    async with TrafficGateway(policy, [], translate=_picker_body_streamed) as gw:
        await _wait_healthy(gw)
        status, holder, _ = await _chat(gw, "streamed", "first question")
        assert status == 200 and holder
        for i in range(4):
            status, served, body = await _chat(gw, "streamed", f"question number {i}")
            assert (status, served) == (200, holder), body
        assert gw.gateway is not None and gw.gateway.pickers is not None
        (server,) = gw.gateway.pickers.servers.values()
        assert server.processor.requests >= 5 and server.processor.errors == 0


async def test_a_saturated_holder_sheds_to_others_and_queues_spread(
    gateway: TrafficGateway,
) -> None:
    gw = gateway
    status, holder, _ = await _chat(gw, "busy", "prime the cache")
    assert status == 200
    # six at once with the same prefix; queue_limit 2: the holder takes 2, the rest spill
    results = await asyncio.gather(
        *(_chat(gw, "busy", f"concurrent {i}", max_tokens=96) for i in range(6))
    )
    assert {r[0] for r in results} == {200}
    served = Counter(r[1] for r in results)
    assert served[holder] >= 2, served
    assert len(served) >= 2, served  # not all to the holder: it was saturated
    # unique prompts at once: each goes to the shallowest queue, so they spread evenly
    spread = await asyncio.gather(
        *(_chat(gw, f"tenant-{i}", "hi", max_tokens=96) for i in range(6))
    )
    counts = Counter(r[1] for r in spread)
    assert len(counts) == 3 and max(counts.values()) - min(counts.values()) <= 1, counts


async def test_a_dead_picker_fails_open_then_closed_without_hanging(
    gateway: TrafficGateway, engines: list[LLMEngine]
) -> None:
    gw = gateway
    assert gw.gateway is not None and gw.gateway.pickers is not None
    (server,) = gw.gateway.pickers.servers.values()
    await server.stop()  # the picker dies; the keeper still believes it runs
    started = time.monotonic()
    results = [await _chat(gw, "acme", f"after death {i}", timeout=10) for i in range(6)]
    assert {r[0] for r in results} == {200}, results  # open: the service's own balancing
    assert len({r[1] for r in results}) >= 2  # round robin, not the prefix holder
    assert time.monotonic() - started < 10
    # the same picker address: the keeper keeps its (stopped) server; Envoy now fails closed
    await gw.apply(gw.template.replace("fail: open", "fail: closed"))
    assert gw.session is not None  # kept-alive connections stay on the old listener: new ones
    await gw.session.close()
    gw.session = aiohttp.ClientSession()
    started = time.monotonic()
    status, _, _ = await _chat(gw, "acme", "closed", timeout=10)
    assert status == 503
    assert time.monotonic() - started < 5


async def test_transport_http_steers_by_prefix_and_queue_and_ends_every_pick(
    engines: list[LLMEngine],
) -> None:
    """``transport: http``: the same picks over ext_authz; the access log ends each one, so
    the queue scorer sees every replica idle again after a burst."""
    policy = _policy(engines, transport="http")
    async with TrafficGateway(policy, []) as gw:
        await _wait_healthy(gw)
        pool = _pool_of(gw)
        status, holder, _ = await _chat(gw, "http-lane", "first question")
        assert status == 200 and holder
        for i in range(4):  # one at a time: the prefix holder every time
            # the access log ends a pick a flush or more after its answer (later on a loaded
            # host): a request sent before sees the last one still in flight, so wait for it
            await _picks_ended(pool)
            assert (await _chat(gw, "http-lane", f"question {i}"))[:2] == (200, holder)
        await _picks_ended(pool)
        # six at once with the same prefix; queue_limit 2: the holder takes 2, the rest spill
        results = await asyncio.gather(
            *(_chat(gw, "http-lane", f"concurrent {i}", max_tokens=96) for i in range(6))
        )
        served = Counter(r[1] for r in results)
        assert {r[0] for r in results} == {200} and served[holder] >= 2, served
        assert len(served) >= 2, served
        await _picks_ended(pool)
        # and no pick is left counted: the next one sees every replica idle
        await asyncio.sleep(3 * ACCESS_LOG_FLUSH_S)
        status, _, _ = await _chat(gw, "http-lane-2", "after the burst")
        assert status == 200 and "; depth 0)" in pool.recent[-1].reason, pool.recent[-1].reason


async def _picks_ended(pool: Any, within_s: float = 5.0) -> None:
    """Until the access log has ended every pick (none counted in flight)."""
    deadline = time.monotonic() + within_s
    while sum(s["in_flight"] or 0 for s in pool.picker.stats().values()) != 0:
        assert time.monotonic() < deadline, pool.picker.stats()
        await asyncio.sleep(0.02)


def _pool_of(gw: TrafficGateway) -> Any:
    assert gw.gateway is not None and gw.gateway.pickers is not None
    pool = gw.gateway.pickers.pool("llm")
    assert pool is not None and gw.gateway.pickers.pools.http_servers
    return pool


class _MinimalGaiePicker(ep_grpc.ExternalProcessorServicer):
    """GAIE's protocol, nothing more: on the request headers (or body), name one endpoint in
    the ``x-gateway-destination-endpoint`` header and the ``envoy.lb`` metadata."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.streams = 0

    def _common(self) -> ep_pb2.CommonResponse:
        header = base_pb2.HeaderValue(
            key="x-gateway-destination-endpoint", raw_value=self.endpoint.encode()
        )
        return ep_pb2.CommonResponse(
            header_mutation=ep_pb2.HeaderMutation(
                set_headers=[base_pb2.HeaderValueOption(header=header)]
            )
        )

    def _metadata(self) -> struct_pb2.Struct:
        metadata = struct_pb2.Struct()
        metadata.update({"envoy.lb": {"x-gateway-destination-endpoint": self.endpoint}})
        return metadata

    async def Process(
        self, request_iterator: AsyncIterator[ep_pb2.ProcessingRequest], context: Any
    ) -> AsyncIterator[ep_pb2.ProcessingResponse]:
        self.streams += 1
        async for request in request_iterator:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                yield ep_pb2.ProcessingResponse(
                    request_headers=ep_pb2.HeadersResponse(
                        response=self._common() if request.request_headers.end_of_stream else None
                    )
                )
            elif kind == "request_body":
                yield ep_pb2.ProcessingResponse(
                    request_body=ep_pb2.BodyResponse(response=self._common()),
                    dynamic_metadata=self._metadata(),
                )


async def test_an_external_gaie_picker_named_in_the_policy_steers(
    engines: list[LLMEngine],
) -> None:
    target = f"127.0.0.1:{engines[2].port}"
    external = _MinimalGaiePicker(target)
    server = grpc.aio.server()
    ep_grpc.add_ExternalProcessorServicer_to_server(external, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        policy = _policy(engines, picker=f"      external: 127.0.0.1:{port}\n")
        async with TrafficGateway(policy, []) as gw:
            await _wait_healthy(gw)
            assert gw.gateway is not None and gw.gateway.pickers is not None
            assert not gw.gateway.pickers.servers  # inferway's own picker does not run
            results = [await _chat(gw, f"t{i}", "where do I go") for i in range(6)]
            assert [(s, r) for s, r, _ in results] == [(200, target)] * 6
            assert external.streams >= 6
    finally:
        await server.stop(0)


class _HangingPicker(ep_grpc.ExternalProcessorServicer):
    """Accepts the stream and never answers: Envoy's ``timeout`` must end the wait."""

    async def Process(
        self, request_iterator: AsyncIterator[ep_pb2.ProcessingRequest], context: Any
    ) -> AsyncIterator[ep_pb2.ProcessingResponse]:
        async for _ in request_iterator:
            await asyncio.sleep(3600)
        yield ep_pb2.ProcessingResponse()  # never reached: makes this an async generator


@pytest.mark.parametrize(("fail", "expected"), [("open", 200), ("closed", 504)])
async def test_a_hanging_picker_costs_its_timeout_and_no_more(
    engines: list[LLMEngine], fail: str, expected: int
) -> None:
    server = grpc.aio.server()
    ep_grpc.add_ExternalProcessorServicer_to_server(_HangingPicker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        picker = f"      external: 127.0.0.1:{port}\n      timeout: 500ms\n      fail: {fail}\n"
        async with TrafficGateway(_policy(engines, picker=picker), []) as gw:
            for _ in range(40):  # until Envoy's health checks pass (open) / config is in (closed)
                status, _, _ = await _chat(gw, "warm", "up", timeout=10)
                if status == expected:
                    break
                await asyncio.sleep(0.25)
            started = time.monotonic()
            status, _, _ = await _chat(gw, "hang", "still there?", timeout=10)
            took = time.monotonic() - started
            assert status == expected
            assert 0.45 < took < 3.0, took  # the picker's timeout, then on (or Envoy's 504)
    finally:
        await server.stop(0)


@pytest.mark.parametrize("transport", ["http", "ext_proc"])
async def test_the_picker_steers_behind_an_openai_route(
    engines: list[LLMEngine], transport: str
) -> None:
    """The LLM processor (model routing, token counts) runs first, the picker after it."""
    head, _, _ = _policy(engines, transport=transport).partition("routes:\n")
    policy = head + "routes:\n  - name: chat\n    openai:\n      model: tiny\n"
    policy += "    backends:\n      - service: llm\n"
    async with TrafficGateway(policy, []) as gw:
        await _wait_healthy(gw)
        served = {(await _chat(gw, "openai-tenant", f"q{i}"))[:2] for i in range(5)}
        assert len(served) == 1 and next(iter(served))[0] == 200, served


def _in_envoy_policy(engines: list[LLMEngine], extra: str = "") -> str:
    return _policy(engines, picker=f"      process: envoy\n{extra}")


async def _wait_all_serving(gw: TrafficGateway, count: int) -> None:
    """Until ``count`` replicas have answered (each passed its first health check): until
    then Maglev's table, built over the healthy ones, still changes."""
    served: set[str] = set()
    deadline = time.monotonic() + 30
    for i in range(10_000):
        if len(served) == count:
            return
        assert time.monotonic() < deadline, f"only {sorted(served)} answered within 30 s"
        status, replica, _ = await _chat(gw, f"warm-{i}", "hello", max_tokens=1)
        if status == 200:
            served.add(replica)


async def test_in_envoy_a_shared_prefix_meets_on_one_engine_and_tenants_spread(
    engines: list[LLMEngine],
) -> None:
    """``process: envoy``: no picker runs; Envoy's prefix hash sends one tenant's requests to
    one engine, which reuses its prompt, and different tenants over the pool."""
    async with TrafficGateway(_in_envoy_policy(engines), []) as gw:
        await _wait_all_serving(gw, len(engines))
        assert gw.gateway is not None and gw.gateway.pickers is not None
        assert gw.gateway.pickers.pool("llm") is None and not gw.gateway.pickers.sidecars
        status, holder, _ = await _chat(gw, "in-envoy", "first question")
        assert status == 200 and holder
        engine = next(e for e in engines if holder.endswith(f":{e.port}"))
        evaluated_before = len(_prompt_evals(engine))
        for i in range(5):
            assert (await _chat(gw, "in-envoy", f"question number {i}"))[:2] == (200, holder)
        evaluated = _prompt_evals(engine)[evaluated_before:]
        assert len(evaluated) == 5 and max(evaluated) < 40, evaluated
        served = Counter([(await _chat(gw, f"tenant-{i}", "hi"))[1] for i in range(12)])
        assert len(served) >= 2 and "" not in served, served
