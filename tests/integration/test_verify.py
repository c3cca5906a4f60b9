"""``inferway verify`` against a real gateway (real Envoy, the real control plane, real HTTP
backends, the real locust): the policy the gateway runs passes; a policy that differs from it
in one rule is caught and fails the run with exit 4; the load part runs on loopback only."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from aiohttp import web

from inferway.policies.model import Policy
from tests.traffic_harness import ControlledBackend, TrafficGateway

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


GATEWAY_NAMES_THE_POOL = "served_by_headers" in Policy.model_fields
"""Whether this gateway sets ``x-inferway-pool`` / ``x-inferway-replica`` itself (and strips
whatever an upstream sends under those names)."""


class PoolBackend(ControlledBackend):
    """A replica that names its pool and itself in the served-by headers on a gateway that
    does not set them yet; where the gateway does, Envoy's own headers are what verify
    reads (it replaces the upstream's)."""

    def __init__(self, name: str, pool: str) -> None:
        super().__init__(name)
        self.pool = pool

    async def _answer(self, request: web.Request) -> web.Response:
        response = await super()._answer(request)
        if not GATEWAY_NAMES_THE_POOL:
            response.headers["x-inferway-pool"] = self.pool
            response.headers["x-inferway-replica"] = f"127.0.0.1:{self.port}"
        return response


POLICY = """
listeners: [{{name: edge, port: {listener_port}}}]
services:
  - name: cpu-pool
    endpoints: ["127.0.0.1:{cpu}"]
  - name: gpu-pool
    endpoints: ["127.0.0.1:{gpu1}", "127.0.0.1:{gpu2}"]
  - name: canary
    endpoints: ["127.0.0.1:{canary}"]
routes:
  - name: gold-tier
    match:
      path: {{prefix: /v2/models/demo/infer}}
      headers: [{{name: x-tier, exact: gold}}]
    backends: [{{service: {gold_pool}}}]
  - name: beta-testers
    match:
      path: {{prefix: /v2/models/demo/infer}}
      cookies: [{{name: cohort, exact: beta}}]
    backends: [{{service: canary}}]
  - name: default
    match: {{path: {{prefix: /v2/models/demo/infer}}}}
    backends: [{{service: gpu-pool, weight: 80}}, {{service: canary, weight: 20}}]
"""


def _backends() -> list[ControlledBackend]:
    return [
        PoolBackend("cpu", "cpu-pool"),
        PoolBackend("gpu1", "gpu-pool"),
        PoolBackend("gpu2", "gpu-pool"),
        PoolBackend("canary", "canary"),
    ]


async def run_verify_cli(*args: str) -> tuple[int, str, str]:
    """``inferway verify ARGS`` as a process (exit code, stdout, stderr); the test's event
    loop, which runs the gateway, keeps turning meanwhile."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "inferway.cli.main",
        "verify",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_verify_passes_against_the_policy_the_gateway_runs_and_its_load_run(
    tmp_path: Path,
) -> None:
    template = POLICY.replace("{gold_pool}", "cpu-pool")
    async with TrafficGateway(template, _backends()) as gw:
        policy = tmp_path / "policy.yaml"
        policy.write_text(gw.render(), encoding="utf-8")
        png, document_file = tmp_path / "latency.png", tmp_path / "verify.json"
        code, out, err = await run_verify_cli(
            # a correct gateway fails a chi-square test at --alpha A with probability A
            "-f", str(policy), "--gateway", gw.url, "--requests", "600", "--alpha", "1e-6",
            "--users", "20", "--duration", "5s", "--sla-p99", "2s",
            "--png", str(png), "--json", str(document_file),
        )  # fmt: skip
        assert code == 0, out + err
        assert "pass" in out and "FAIL" not in out
        document = json.loads(document_file.read_text(encoding="utf-8"))
        functional = document["functional"]
        assert functional["correctness_percent"] == 100.0
        assert functional["requests"] >= 600 and not functional["mismatches"]
        assert set(functional["routes"]) == {"gold-tier", "beta-testers", "default", "no route"}
        split = functional["splits"]["default"]
        assert split["ok"] is True and split["p_value"] >= 1e-6
        assert set(split["pools"]) == {"gpu-pool", "canary"}
        assert set(functional["replicas"]["gpu-pool"]) == {
            f"127.0.0.1:{gw.backends['gpu1'].port}",
            f"127.0.0.1:{gw.backends['gpu2'].port}",
        }
        load = document["load"]
        assert load["ok"] is True and load["users"] == 20 and load["requests"] > 0
        assert load["failures"] == 0 and load["throughput_rps"] > 0
        assert 0 < load["latency_ms"]["p50"] <= load["latency_ms"]["p99"] <= 2000
        assert len(load["timeline"]) >= 3
        # what locust itself added: its loop's lateness, second by second and in all
        generator = load["load_generator"]
        assert generator["loop_lag_ms"]["tick_ms"] == 5.0
        assert 0 <= generator["loop_lag_ms"]["p50"] <= generator["loop_lag_max_ms"]
        assert all(t["loop_lag_max_ms"] is not None for t in load["timeline"][1:-1])
        assert generator["frozen_objects"] > 10_000  # locust's start-up heap, then its users
        assert generator["full_collections_deferred"] is False  # the default
        assert generator["peak_rss_mb"] > 20.0  # locust, gevent and their users
        assert "load generator: its loop ran late by p99" in out
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert document["cost"]["available"] is False  # no Prometheus, no admin API given
        assert document["ok"] is True


async def test_verify_can_judge_the_load_after_the_ramp_with_locust_on_chosen_cpus(
    tmp_path: Path,
) -> None:
    template = POLICY.replace("{gold_pool}", "cpu-pool")
    cpu = min(os.sched_getaffinity(0))
    async with TrafficGateway(template, _backends()) as gw:
        policy = tmp_path / "policy.yaml"
        policy.write_text(gw.render(), encoding="utf-8")
        document_file = tmp_path / "verify.json"
        code, out, err = await run_verify_cli(
            "-f", str(policy), "--gateway", gw.url, "--requests", "200", "--alpha", "1e-6",
            "--users", "20", "--spawn-rate", "10", "--duration", "5s", "--sla-p99", "2s",
            "--exclude-ramp", "--load-cpus", str(cpu), "--json", str(document_file),
        )  # fmt: skip
        assert code == 0, out + err
        assert "judged after the ramp" in out
        load = json.loads(document_file.read_text(encoding="utf-8"))["load"]
        assert load["exclude_ramp"] is True and load["failures"] == 0
        # 20 users at 10 a second: the first ten start requests before the last one starts
        assert load["ramp"]["requests"] > 0
        assert load["ramp"]["latency_ms"]["p99"] is not None
        assert load["latency_ms"]["p99"] is not None and load["ok"] is True


async def test_verify_refuses_load_cpus_it_may_not_use(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(listener_port=10000, cpu=1, gpu1=2, gpu2=3, canary=4,
                                    gold_pool="cpu-pool"))  # fmt: skip
    for bad in ("x", "4096"):
        code, _, err = await run_verify_cli(
            "-f", str(policy), "--gateway", "http://127.0.0.1:10000", "--users", "5",
            "--load-cpus", bad,
        )  # fmt: skip
        assert code == 2 and "--load-cpus" in err, err


async def test_verify_catches_a_rule_the_gateway_routes_elsewhere(tmp_path: Path) -> None:
    # The gateway sends gold-tier requests to gpu-pool; the policy given to verify says cpu-pool.
    async with TrafficGateway(POLICY.replace("{gold_pool}", "gpu-pool"), _backends()) as gw:
        policy = tmp_path / "policy.yaml"
        policy.write_text(gw.render().replace("service: gpu-pool}]", "service: cpu-pool}]"))
        assert policy.read_text().count("cpu-pool}]") == 1
        code, out, err = await run_verify_cli(
            "-f", str(policy), "--gateway", gw.url, "--requests", "300", "-o", "json"
        )  # fmt: skip
    assert code == 4, out + err
    document = json.loads(out)
    assert document["ok"] is False
    functional = document["functional"]
    assert functional["correctness_percent"] < 99.9
    assert functional["routes"]["gold-tier"]["correct"] == 0
    mismatched = {m["covers"] for m in functional["mismatches"]}
    assert mismatched == {"gold-tier: every condition holds"}
    assert {m["observed"] for m in functional["mismatches"]} == {"gpu-pool (HTTP 200)"}
    bar = next(b for b in document["bars"] if b["name"] == "routed correctly")
    assert bar["ok"] is False


async def test_verify_catches_a_split_whose_frequencies_are_off_the_weights(
    tmp_path: Path,
) -> None:
    # Both pools are the route's, so every request is "correct"; only the frequencies tell.
    async with TrafficGateway(POLICY.replace("{gold_pool}", "cpu-pool"), _backends()) as gw:
        policy = tmp_path / "policy.yaml"
        policy.write_text(
            gw.render().replace("weight: 80", "weight: 50").replace("weight: 20", "weight: 50")
        )
        code, out, err = await run_verify_cli(
            "-f", str(policy), "--gateway", gw.url, "--requests", "600", "-o", "json"
        )  # fmt: skip
    assert code == 4, out + err
    document = json.loads(out)
    assert document["functional"]["correctness_percent"] == 100.0
    split = document["functional"]["splits"]["default"]
    assert split["ok"] is False and split["p_value"] < 1e-6
    failed = {b["name"] for b in document["bars"] if b["ok"] is False}
    assert failed == {"activation frequency (all pools)", "activation frequency (default)"}


async def test_verify_refuses_load_on_a_remote_gateway(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(listener_port=10000, cpu=1, gpu1=2, gpu2=3, canary=4,
                                    gold_pool="cpu-pool"))  # fmt: skip
    code, _, err = await run_verify_cli(
        "-f", str(policy), "--gateway", "http://192.0.2.1:10000", "--users", "5"
    )  # fmt: skip
    assert code == 2, err
    assert "not a loopback address" in err and "--allow-remote" in err
