"""An LLM canary judged on time to first token, end to end (issue 34's acceptance): streamed
chat completions through real Envoy and the real LLM processor, which measures every
stream's TTFT into ``gen_ai_server_time_to_first_token_seconds``; a real Prometheus scrapes
the gateway's admin ``/metrics``; the rollout's ``ttft`` check reads both versions'
histograms from it (``source: prometheus``, examples/llm-canary.yaml). Stable is the real
engine (llama.cpp, tests/llm_engine.py). A canary whose first token comes 300 ms late
(tests/openai_fake.py's ``first_token_delay``) is rolled back with a reason naming ttft; a
canary that is the same engine again advances to 100% (promoted)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.xds.bootstrap import build_bootstrap
from tests.envoy_process import EnvoyProcess, free_port
from tests.helpers import poll_until
from tests.llm_engine import LLMEngine, require_llm_engine, start_llm_engine, write_test_model
from tests.openai_fake import FakeOpenAI
from tests.prometheus_server import PrometheusServer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio,
    pytest.mark.needs_binary("prometheus", "the rollout's ttft from the gateway's histograms"),
]

ROLLOUT = "llama-v2"
POLICY = """version: 1
listeners: [{{name: public, port: {listener}}}]
llm: {{port: {llm}, reports_port: {reports}, timeout: 30s}}
services:
  - {{name: llama-v1, endpoints: ["127.0.0.1:{stable}"]}}
  - {{name: llama-v2, endpoints: ["127.0.0.1:{canary}"]}}
routes:
  - name: chat
    openai: {{model: tiny}}
    backends: [{{service: llama-v1, weight: 100}}, {{service: llama-v2, weight: 0}}]
rollouts:
  - name: llama-v2
    route: chat
    stable: llama-v1
    canary: llama-v2
    steps: [50, 100]
    analysis:
      interval: 2s
      metrics:
        - {{name: ttft, max_increase: 50%}}
      source: prometheus
      prometheus:
        url: {prometheus}
        queries:
          requests: >-
            sum(increase(inferway_llm_requests_total{{backend="{{cluster}}"}}[{{interval}}]))
          errors: >-
            sum(increase(inferway_llm_requests_total{{backend="{{cluster}}",code=~"5..|0"}}[{{interval}}]))
    on_failure: rollback
"""
BODY = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Hello there"}],
    "max_tokens": 4,
    "temperature": 0,
    "stream": True,
}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LLMEngine, LLMEngine]]:
    require_llm_engine()
    directory = tmp_path_factory.mktemp("llm")
    model = write_test_model(directory)
    with start_llm_engine(model) as stable, start_llm_engine(model) as canary:
        yield stable, canary


async def _roll(tmp_path: Path, stable_port: int, canary_port: int) -> dict[str, Any]:
    """Run the rollout under steady streamed traffic until it is decided; its status."""
    listener, admin = free_port(), free_port()
    async with PrometheusServer(
        tmp_path / "prom", targets=[f"127.0.0.1:{admin}"], metrics_path="/metrics"
    ) as prometheus:
        policy = tmp_path / "policy.yaml"
        policy.write_text(
            POLICY.format(
                listener=listener,
                llm=free_port(),
                reports=free_port(),
                stable=stable_port,
                canary=canary_port,
                prometheus=prometheus.url,
            )
        )
        gateway: Gateway = await start_gateway(
            GatewayOptions(
                policy_path=policy, xds_port=0, admin_port=admin, with_envoy=False,
                workdir=tmp_path / "work",
            )
        )  # fmt: skip
        envoy: EnvoyProcess | None = None
        try:
            envoy = await EnvoyProcess(
                build_bootstrap(node_id="llm-canary", xds_port=gateway.xds.port, admin_port=0)
            ).start(wait="ready", timeout=20.0)
            rollouts = gateway.rollouts
            assert rollouts is not None
            statuses: list[int] = []
            timeout = aiohttp.ClientTimeout(total=30)
            async with aiohttp.ClientSession(timeout=timeout) as session:

                async def stream_until_decided() -> dict[str, Any] | None:
                    url = f"http://127.0.0.1:{listener}/v1/chat/completions"
                    try:
                        async with session.post(url, json=BODY) as response:
                            raw = await response.read()
                            statuses.append(response.status)
                            assert response.status != 200 or raw.endswith(b"data: [DONE]\n\n")
                    except aiohttp.ClientError:
                        statuses.append(0)
                    status = dict(rollouts.status(ROLLOUT, history=100))
                    decided = status["phase"] in ("rolled_back", "promoted")
                    return status if decided else None

                status = await poll_until(
                    stream_until_decided, timeout=120, what="the rollout to decide", interval=0.0
                )
        finally:
            if envoy is not None:
                envoy.stop()
            await gateway.stop()
    assert statuses.count(200) >= 0.95 * len(statuses), statuses  # Envoy warming up aside
    return status


def _ttft_verdict(status: dict[str, Any], action: str) -> dict[str, Any]:
    decision = next(d for d in status["history"] if d["action"] == action)
    return dict(next(v for v in decision["verdicts"] if v["check"] == "ttft"))


async def test_a_canary_whose_first_token_is_late_is_rolled_back_on_ttft(
    engines: tuple[LLMEngine, LLMEngine], tmp_path: Path
) -> None:
    stable, _ = engines
    slow = await FakeOpenAI("slow-canary", first_token_delay=0.3).start()
    try:
        status = await _roll(tmp_path, stable.port, slow.port)
    finally:
        await slow.kill()
    assert status["phase"] == "rolled_back", status["reason"]
    assert "ttft" in status["reason"], status["reason"]
    verdict = _ttft_verdict(status, "rollback")
    assert verdict["result"] == "fail", verdict
    inputs = verdict["inputs"]
    assert inputs["canary_p50_ms"] >= 250 > 2 * inputs["stable_p50_ms"], inputs
    assert slow.bodies, "the canary served streams before it was judged"


async def test_a_canary_as_fast_as_stable_advances_to_promotion(
    engines: tuple[LLMEngine, LLMEngine], tmp_path: Path
) -> None:
    stable, canary = engines
    status = await _roll(tmp_path, stable.port, canary.port)
    assert status["phase"] == "promoted", status["reason"]
    actions = [d["action"] for d in status["history"]]
    assert "rollback" not in actions and actions[-1] == "promote", actions
    verdict = _ttft_verdict(status, "promote")  # from the 50% step to 100%, on the evidence
    assert verdict["result"] == "pass" and verdict["inputs"]["canary_samples"] >= 20, verdict
