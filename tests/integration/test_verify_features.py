"""``inferway verify`` on feature routes with the gateway's real feature router (Envoy's
external processor), real Envoy and real backends, read through the gateway's own served-by
headers: every bound and broken condition of each feature rule lands where the policy says
(rows, input size, JSON fields, malformed bodies skipped or refused with 400); a gateway
whose rule differs from the policy verify is given (a bound moved) is caught, exit 4."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.envoy_process import free_port
from tests.integration.test_verify import run_verify_cli
from tests.traffic_harness import ControlledBackend, TrafficGateway

pytestmark = pytest.mark.integration

# The router's timeout is raised from 200 ms: past it Envoy routes without features (the
# documented failure mode), and on a loaded 2-core CI machine a probe may wait that long;
# these tests are about what verify sees, not the router's latency.
POLICY = """
listeners: [{{name: edge, port: {listener_port}}}]
feature_router: {{port: ROUTER_PORT, timeout: 5s}}
services:
  - name: cpu-pool
    endpoints: ["127.0.0.1:{cpu}"]
  - name: gpu-pool
    endpoints: ["127.0.0.1:{gpu1}", "127.0.0.1:{gpu2}"]
  - name: strict-pool
    endpoints: ["127.0.0.1:{strict}"]
routes:
  - name: small-cpu
    match:
      path: {{prefix: /v2/models/demo/infer}}
      features:
        rows: {{min: 1, max: ROWS_MAX}}
        input_bytes: {{max: 2048}}
        fields:
          - {{path: parameters.priority, exact: high}}
          - {{path: parameters.temperature, min: 0, max: 2}}
    backends: [{{service: cpu-pool}}]
  - name: strict
    match:
      path: {{prefix: /v2/models/strict/infer}}
      features:
        rows: {{max: 100}}
        on_malformed: reject
    backends: [{{service: strict-pool}}]
  - name: default
    match: {{path: {{prefix: /v2/models/}}}}
    backends: [{{service: gpu-pool}}]
"""


def _backends() -> list[ControlledBackend]:
    return [ControlledBackend(n) for n in ("cpu", "gpu1", "gpu2", "strict")]


def _template(rows_max: int) -> str:
    return POLICY.replace("ROUTER_PORT", str(free_port())).replace("ROWS_MAX", str(rows_max))


async def test_verify_covers_every_feature_bound_through_the_feature_router(
    tmp_path: Path,
) -> None:
    async with TrafficGateway(_template(4), _backends()) as gw:
        policy = tmp_path / "policy.yaml"
        policy.write_text(gw.render(), encoding="utf-8")
        code, out, err = await run_verify_cli(
            "-f", str(policy), "--gateway", gw.url, "--requests", "400", "-o", "json"
        )  # fmt: skip
    assert code == 0, out + err
    document = json.loads(out)
    functional = document["functional"]
    assert functional["correctness_percent"] == 100.0 and not functional["uncovered"]
    routes = functional["routes"]
    assert set(routes) == {"small-cpu", "strict", "default", "no route"}
    assert routes["strict"]["correct"] == routes["strict"]["requests"] > 0
    assert set(functional["replicas"]["gpu-pool"]) == {
        f"127.0.0.1:{gw.backends['gpu1'].port}",
        f"127.0.0.1:{gw.backends['gpu2'].port}",
    }


async def test_verify_catches_a_feature_bound_the_gateway_has_elsewhere(tmp_path: Path) -> None:
    # The gateway takes up to 8 rows on the CPU pool; the policy given to verify says 4.
    async with TrafficGateway(_template(8), _backends()) as gw:
        policy = tmp_path / "policy.yaml"
        policy.write_text(gw.render().replace("max: 8}", "max: 4}"), encoding="utf-8")
        code, out, err = await run_verify_cli(
            "-f", str(policy), "--gateway", gw.url, "--requests", "400", "-o", "json"
        )  # fmt: skip
    assert code == 4, out + err
    mismatches = json.loads(out)["functional"]["mismatches"]
    assert {m["covers"] for m in mismatches} == {"small-cpu: rows 5 (above max)"}
    assert {m["observed"] for m in mismatches} == {"cpu-pool (HTTP 200)"}
