"""``inferway verify`` on OpenAI routes through real Envoy and the real LLM processor: against
the real engine (llama.cpp, tests/llm_engine.py) every model and alias reaches its engine,
streamed and not, plain answers carry usage, streams are well-formed and end with [DONE]
with no usage chunk shown, an unknown model gets the 404, and the load run reports TTFT, ITL
and tokens/s; a policy whose alias names another route than the gateway's, and engines that
break their streams (tests/openai_fake.py), fail the run saying what and where."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.envoy_process import with_llm_ports
from tests.integration.test_verify import run_verify_cli
from tests.llm_engine import LLMEngine, require_llm_engine, start_llm_engine, write_test_model
from tests.openai_fake import FakeOpenAI
from tests.traffic_harness import NODE_ID, TrafficGateway

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

POLICY = """
version: 1
listeners:
  - name: ingress
    port: {listener_port}
llm:
  port: LLM_PORT
  reports_port: LLM_REPORTS_PORT
  timeout: 30s
services:
  - name: tiny-pool
    endpoints: ["127.0.0.1:TINY_PORT"]
  - name: other-pool
    endpoints: ["127.0.0.1:OTHER_PORT"]
routes:
  - name: tiny
    openai:
      model: tiny
    backends:
      - service: tiny-pool
  - name: other
    openai:
      model: other
      aliases: [gpt-4o-mini]
    backends:
      - service: other-pool
"""


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LLMEngine, LLMEngine]]:
    require_llm_engine()
    directory = tmp_path_factory.mktemp("llm")
    tiny, other = write_test_model(directory, seed=0), write_test_model(directory, seed=1)
    with start_llm_engine(tiny, model="tiny") as a, start_llm_engine(other, model="other") as b:
        yield a, b


def _policy(tiny: int, other: int) -> str:
    return with_llm_ports(POLICY).replace("TINY_PORT", str(tiny)).replace("OTHER_PORT", str(other))


def _checks(document: dict[str, Any], ok: bool) -> list[dict[str, Any]]:
    return [c for c in document["openai"]["checks"] if c["ok"] is ok]


async def test_verify_passes_openai_routes_on_the_real_engine_and_reports_ttft(
    engines: tuple[LLMEngine, LLMEngine], tmp_path: Path
) -> None:
    tiny, other = engines
    async with TrafficGateway(_policy(tiny.port, other.port), []) as gw:
        policy = tmp_path / "policy.yaml"
        policy.write_text(gw.render(), encoding="utf-8")
        document_file = tmp_path / "verify.json"
        code, out, err = await run_verify_cli(
            "-f", str(policy), "--gateway", gw.url, "--requests", "20",
            "--users", "2", "--duration", "3s", "--json", str(document_file),
        )  # fmt: skip
    assert code == 0, out + err
    assert "openai load: 2 streams" in out and "TTFT" in out and "FAIL" not in out
    document = json.loads(document_file.read_text(encoding="utf-8"))
    assert document["ok"] is True and document["openai"]["ok"] is True
    assert not _checks(document, False)
    passed = {(c["check"], c["where"]) for c in _checks(document, True)}
    for name, route in (("tiny", "tiny"), ("other", "other"), ("gpt-4o-mini", "other")):
        plain = f"model {name} (route {route}) POST /v1/chat/completions"
        assert {
            ("model routing", plain),
            ("usage present", plain),
            ("model routing", plain + " stream"),
            ("stream integrity", plain + " stream"),
        } <= passed
    unknown = "model inferway-verify-no-such-model (no route) POST /v1/chat/completions"
    assert ("unknown model", unknown) in passed
    load = document["openai"]["load"]
    assert load["ok"] is True and load["errors"] == 0 and load["requests"] >= 2
    assert load["tokens"] > 0 and load["tokens_per_s"] > 0
    assert 0 < load["ttft_ms"]["p50"] <= load["ttft_ms"]["p99"] < 3000
    assert load["itl_ms"]["p99"] is not None and load["itl_ms"]["p99"] > 0
    bars = {b["name"]: b for b in document["bars"]}
    assert bars["openai routes (routing, streams, usage, 404)"]["ok"] is True
    assert bars["openai load errors"]["ok"] is True
    assert document["functional"]["requests"] == 0  # openai routes only: nothing else
    assert bars["routed correctly"]["ok"] is None


async def test_verify_fails_an_alias_the_gateway_routes_to_another_engine(
    engines: tuple[LLMEngine, LLMEngine], tmp_path: Path
) -> None:
    tiny, other = engines
    async with TrafficGateway(_policy(tiny.port, other.port), []) as gw:
        # verify's policy moves the alias to route tiny; the gateway serves it on route other
        running = gw.render()
        wrong = running.replace("aliases: [gpt-4o-mini]", "aliases: []").replace(
            "model: tiny\n", "model: tiny\n      aliases: [gpt-4o-mini]\n"
        )
        assert wrong.count("gpt-4o-mini") == 1 and "aliases: [gpt-4o-mini]" in wrong
        policy = tmp_path / "policy.yaml"
        policy.write_text(wrong, encoding="utf-8")
        code, out, err = await run_verify_cli(
            "-f", str(policy), "--gateway", gw.url, "--requests", "5", "-o", "json"
        )  # fmt: skip
    assert code == 4, out + err
    document = json.loads(out)
    assert document["ok"] is False and document["openai"]["ok"] is False
    failed = _checks(document, False)
    assert {(c["check"], c["where"]) for c in failed} == {
        ("model routing", "model gpt-4o-mini (route tiny) POST /v1/chat/completions"),
        ("model routing", "model gpt-4o-mini (route tiny) POST /v1/chat/completions stream"),
    }
    assert all(
        c["detail"].startswith(f"served by pool other-pool (127.0.0.1:{other.port})")
        and c["detail"].endswith("the policy routes it to tiny-pool")
        for c in failed
    ), failed
    bar = next(b for b in document["bars"] if b["name"].startswith("openai routes"))
    assert bar["ok"] is False and bar["measured"].endswith("passed")


BROKEN = """
version: 1
listeners: [{{name: ingress, port: {listener_port}}}]
llm: {{port: LLM_PORT, reports_port: LLM_REPORTS_PORT, timeout: 30s}}
services:
  - name: cut-pool
    endpoints: ["127.0.0.1:{cut}"]
  - name: garbled-pool
    endpoints: ["127.0.0.1:{garbled}"]
routes:
  - name: cut
    openai: {{model: cut}}
    backends: [{{service: cut-pool}}]
  - name: garbled
    openai: {{model: garbled}}
    backends: [{{service: garbled-pool}}]
"""


async def test_verify_fails_engines_that_break_their_streams_saying_which(
    tmp_path: Path,
) -> None:
    engines = [
        FakeOpenAI("cut", stream_fault="no_done"),
        FakeOpenAI("garbled", stream_fault="bad_json"),
    ]
    async with TrafficGateway(with_llm_ports(BROKEN), engines) as gw:
        policy = tmp_path / "policy.yaml"
        policy.write_text(gw.render(), encoding="utf-8")
        code, out, err = await run_verify_cli(
            "-f", str(policy), "--gateway", gw.url, "--requests", "5", "-o", "json"
        )  # fmt: skip
        text_code, text, _ = await run_verify_cli(
            "-f", str(policy), "--gateway", gw.url, "--requests", "5"
        )  # fmt: skip
    assert code == text_code == 4, out + err
    assert "FAIL" in text and "stream integrity" in text
    failed = {c["where"]: c for c in _checks(json.loads(out), False)}
    assert set(failed) == {
        "model cut (route cut) POST /v1/chat/completions stream",
        "model garbled (route garbled) POST /v1/chat/completions stream",
    }, failed
    cut = failed["model cut (route cut) POST /v1/chat/completions stream"]
    assert cut["check"] == "stream integrity" and "without [DONE]" in cut["detail"]
    garbled = failed["model garbled (route garbled) POST /v1/chat/completions stream"]
    assert garbled["check"] == "stream integrity"
    assert garbled["detail"].startswith("event ") and "is not JSON" in garbled["detail"]


async def test_verify_of_one_envoy_named_by_the_control_plane_checks_its_openai_routes(
    tmp_path: Path,
) -> None:
    engines = [FakeOpenAI("cut"), FakeOpenAI("garbled", stream_fault="bad_json")]
    async with TrafficGateway(with_llm_ports(BROKEN), engines) as gw:
        assert gw.gateway is not None
        policy = tmp_path / "policy.yaml"
        policy.write_text(gw.render(), encoding="utf-8")
        code, out, err = await run_verify_cli(
            "-f", str(policy), "--admin", gw.gateway.admin.url, "--envoy", NODE_ID,
            "--requests", "5", "-o", "json",
        )  # fmt: skip
    assert code == 4, out + err
    document = json.loads(out)
    (row,) = document["envoys"]
    assert row["node"] == NODE_ID and row["reachable"] is True, row
    failed = [c["where"] for c in row["run"]["openai"]["checks"] if not c["ok"]]
    assert failed == ["model garbled (route garbled) POST /v1/chat/completions stream"], row
    assert "bar 'openai routes (routing, streams, usage, 404)' missed" in document["verdict"]
