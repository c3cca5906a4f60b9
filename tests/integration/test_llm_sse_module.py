"""inferway's native SSE reader (an Envoy dynamic module, ``inferway/xds/sse_module``) in real
Envoy: an Envoy that says it can load the module is in its own node group and gets the module
after the Lua filter; it counts streams exactly (equal to the engine's usage, the usage chunk
the gateway asked for kept from the client, a client gone mid-stream counted from what it
saw); an Envoy without the module, or a policy that says ``stream_reader: lua``, gets the Lua
reader only. The same answers through every reader: tests/integration/test_llm_gateway.py."""

from __future__ import annotations

import json

import pytest

from inferway.xds.sse_module_build import c_compiler
from inferway.xds.translate.llm_stream import SSE_MODULE_FILTER
from tests.components import unavailable
from tests.envoy_process import with_llm_ports
from tests.integration.test_llm_gateway import (
    POLICY,
    chat,
    engines,
    events,
    on_transport,
    post,
    sample,
)
from tests.openai_fake import FakeOpenAI
from tests.traffic_harness import NODE_ID, TrafficGateway, poll_until

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True)
def _compiler() -> None:
    if c_compiler() is None:
        unavailable("cc", "no C compiler (cc, gcc, clang or CC) to build the SSE reader")


async def _has_module_filter(gw: TrafficGateway) -> bool:
    assert gw.envoy is not None
    dump = await gw.envoy.config_dump("dynamic_listeners")
    return f'"name": "{SSE_MODULE_FILTER}"' in json.dumps(dump)


def _group(gw: TrafficGateway) -> str:
    node = gw.cache.node(NODE_ID)
    assert node is not None
    return node.group


async def test_an_envoy_that_can_load_the_module_reads_streams_with_it() -> None:
    async with TrafficGateway(with_llm_ports(POLICY), engines()) as gw:
        assert _group(gw) == "default|sse"
        assert await _has_module_filter(gw)
        qwen = gw.gateway.llm.processor if gw.gateway and gw.gateway.llm else None
        assert qwen is not None
        status, _, raw = await post(gw, chat("qwen", stream=True, max_tokens=20))
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        got = events(raw)
        assert len(got) == 20 and not any(e.get("usage") for e in got)
        # one report, at the answer's end, with what the module counted
        assert qwen.reports == 1
        assert sample(gw, "inferway_llm_tokens_total", type="output", estimated="false") == 20
        assert sample(gw, "gen_ai_server_time_to_first_token_seconds_count", route="qwen") == 1
        status, _, raw = await post(gw, chat("qwen", stream=True, usage=True, max_tokens=3))
        assert events(raw)[-1]["usage"]["completion_tokens"] == 3


async def test_a_client_gone_mid_stream_is_counted_from_what_the_module_saw() -> None:
    slow = FakeOpenAI("qwen", token_delay=0.2)
    async with TrafficGateway(with_llm_ports(POLICY), [*engines()[:2], slow]) as gw:
        assert _group(gw) == "default|sse"
        assert gw.session is not None
        body = json.dumps(chat("qwen", stream=True, max_tokens=50)).encode()
        response = await gw.session.post(
            gw.url + "/v1/chat/completions",
            data=body,
            headers={"content-type": "application/json"},
        )
        assert b"t0" in await response.content.readany()
        response.close()

        async def recorded() -> bool:
            return sample(gw, "inferway_llm_requests_total", route="qwen") == 1

        await poll_until(recorded, timeout=10, what="the abandoned stream recorded")
        output = sample(gw, "inferway_llm_tokens_total", type="output", estimated="true")
        assert 1 <= output < 50, output


@pytest.mark.parametrize(
    ("modules", "reader"), [(False, "auto"), (True, "lua")], ids=["no-module", "policy-lua"]
)
async def test_otherwise_the_lua_filter_reads_the_streams(modules: bool, reader: str) -> None:
    policy = with_llm_ports(on_transport(POLICY, "http", reader))
    async with TrafficGateway(policy, engines(), envoy_modules=modules) as gw:
        assert _group(gw) == ("default|sse" if modules else "default")
        assert not await _has_module_filter(gw)
        status, _, raw = await post(gw, chat("qwen", stream=True, max_tokens=5))
        assert status == 200 and len(events(raw)) == 5
        assert sample(gw, "inferway_llm_tokens_total", type="output", estimated="false") == 5
