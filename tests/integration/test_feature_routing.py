"""Routes on request features with real Envoy, the real feature router (Envoy's external
processor in the gateway) and real backends: the body's rows, size and JSON fields pick the
pool; malformed bodies go to the default route (``skip``) or are refused (``reject``); a
client cannot forge the features or the served-by headers; with the feature router down,
requests fall back to the default route."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.envoy_process import free_port
from tests.traffic_harness import ControlledBackend, TrafficGateway

pytestmark = pytest.mark.asyncio

POLICY = """
version: 1
listeners:
  - name: ingress
    port: {listener_port}
feature_router:
  port: ROUTER_PORT
  timeout: 5s  # not 200 ms: a loaded CI machine must not turn into the fallback route
services:
  - name: cpu-pool
    endpoints: ["127.0.0.1:{cpu}"]
  - name: gpu-pool
    endpoints: ["127.0.0.1:{gpu}"]
  - name: strict-pool
    endpoints: ["127.0.0.1:{strict}"]
routes:
  - name: small-cpu
    match:
      path:
        prefix: /v2/models/demo/infer
      features:
        rows:
          min: 1
          max: 4
        input_bytes:
          max: 65536
        fields:
          - path: parameters.priority
            exact: high
    backends:
      - service: cpu-pool
  - name: strict
    match:
      path:
        prefix: /v2/models/strict/infer
      features:
        rows:
          max: 100
        on_malformed: reject
    backends:
      - service: strict-pool
  - name: with-context
    match:
      path:
        prefix: /v2/models/ctx/infer
      features:
        fields:
          - path: parameters.context
            present: true
    backends:
      - service: cpu-pool
  - name: default
    match:
      path:
        prefix: /v2/models/
    backends:
      - service: gpu-pool
"""

DEMO = "/v2/models/demo/infer"
STRICT = "/v2/models/strict/infer"


def infer_body(rows: int, priority: str = "high", pad: int = 0) -> bytes:
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": [rows, 2], "datatype": "FP32", "data": [0.0] * rows * 2}],
        "parameters": {"priority": priority, "pad": "p" * pad},
    }
    return json.dumps(body).encode()


async def post(
    gw: TrafficGateway, path: str, body: bytes | None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    assert gw.session is not None
    async with gw.session.post(gw.url + path, data=body, headers=headers) as response:
        text = await response.text()
        payload = json.loads(text) if text.startswith("{") else text
        return response.status, {k.lower(): v for k, v in response.headers.items()}, payload


@pytest.fixture
async def gateway() -> Any:
    backends = [ControlledBackend(n) for n in ("cpu", "gpu", "strict")]
    async with TrafficGateway(POLICY.replace("ROUTER_PORT", str(free_port())), backends) as gw:
        yield gw


async def test_body_features_pick_the_pool_and_answers_name_pool_and_replica(
    gateway: TrafficGateway,
) -> None:
    gw = gateway
    status, headers, payload = await post(gw, DEMO, infer_body(2))
    assert (status, payload["backend"]) == (200, "cpu")
    assert headers["x-inferway-pool"] == "cpu-pool"
    assert headers["x-inferway-replica"] == f"127.0.0.1:{gw.backends['cpu'].port}"
    for body, why in (
        (infer_body(9), "rows above max"),
        (infer_body(0), "rows below min"),
        (infer_body(2, priority="low"), "field differs"),
        (infer_body(2, pad=70_000), "body over input_bytes"),
        (b"this is not json", "malformed, skip"),
        (b'["a", "list"]', "JSON but not an object"),
    ):
        status, headers, payload = await post(gw, DEMO, body)
        assert (status, payload["backend"], headers["x-inferway-pool"]) == (
            200,
            "gpu",
            "gpu-pool",
        ), why


async def test_binary_extension_requests_are_measured_by_their_json_header(
    gateway: TrafficGateway,
) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [3, 2],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 24},
                }
            ],
            "parameters": {"priority": "high"},
        }
    ).encode()
    body = header + bytes(24)
    status, _, payload = await post(
        gateway,
        DEMO,
        body,
        {
            "inference-header-content-length": str(len(header)),
            "content-type": "application/octet-stream",
        },
    )
    assert (status, payload["backend"]) == (200, "cpu")


async def test_reject_refuses_malformed_bodies_with_a_json_400(gateway: TrafficGateway) -> None:
    gw = gateway
    cases = {
        b"{not json": "the body is not JSON: unexpected character, expected a string key at "
        "line 1 column 2",
        b'{"inputs": [{"shape": [1, 2]}],\n "x": 1,}': "the body is not JSON: trailing comma "
        "is not allowed at line 2 column 8",
        b"[1, 2]": "the request body is JSON but not an object (a list)",
        b'{"inputs": "no shape"}': "'inputs' is a string, not a list of inputs",
        b'{"inputs": [{"name": "x"}]}': "inputs[0] has no 'shape'",
        b'{"inputs": [{"shape": [-1, 2]}]}': "inputs[0].shape[0] is a negative number, not a "
        "whole number of rows (0 or more)",
        None: "the request body is empty",
    }
    for body, reason in cases.items():
        status, headers, payload = await post(gw, STRICT, body)
        assert status == 400, body
        assert headers["content-type"] == "application/json"
        assert payload == {
            "error": f"request body is not a JSON inference request (inputs[0].shape): {reason}",
            "route": "strict",
        }, body
        assert "x-inferway-pool" not in headers  # no upstream served it
    assert gw.session is not None
    async with gw.session.get(gw.url + STRICT) as response:
        assert response.status == 400
        assert (await response.json())["error"].endswith(
            "a GET request has no body: send a POST with a JSON body"
        )
    status, _, payload = await post(gw, STRICT, infer_body(50))
    assert (status, payload["backend"]) == (200, "strict")
    status, _, payload = await post(gw, STRICT, infer_body(500))  # well formed, no match
    assert (status, payload["backend"]) == (200, "gpu")
    assert not gw.backends["strict"].seen[1:], "only the one good request reached strict"


async def test_clients_and_upstreams_cannot_forge_features_or_served_by_headers(
    gateway: TrafficGateway,
) -> None:
    gw = gateway
    gw.backends["gpu"].headers = {"x-inferway-pool": "cpu-pool", "x-inferway-replica": "forged"}
    forged = {"x-inferway-pool": "cpu-pool", "x-inferway-replica": "1.2.3.4:5"}
    status, headers, payload = await post(gw, DEMO, infer_body(9), forged)
    assert (status, payload["backend"]) == (200, "gpu")
    assert headers["x-inferway-pool"] == "gpu-pool"
    assert headers["x-inferway-replica"] == f"127.0.0.1:{gw.backends['gpu'].port}"
    seen = gw.backends["gpu"].seen[-1]
    assert "x-inferway-pool" not in seen and "x-inferway-replica" not in seen


async def test_with_the_feature_router_down_requests_take_the_default_route(
    gateway: TrafficGateway,
) -> None:
    gw = gateway
    assert gw.gateway is not None and gw.gateway.features is not None
    router = gw.gateway.features.router
    assert router is not None and router.processor.requests == 0
    status, _, payload = await post(gw, DEMO, infer_body(2))
    assert payload["backend"] == "cpu" and router.processor.requests == 1
    await router.stop()
    for path in (DEMO, STRICT):
        status, headers, payload = await post(gw, path, infer_body(2))
        assert (status, payload["backend"], headers["x-inferway-pool"]) == (200, "gpu", "gpu-pool")
    stats = await gw.stats(r"ext_proc\.failure_mode_allowed")
    assert sum(stats.values()) >= 2, stats


async def test_served_by_headers_turned_off_are_stripped_even_from_upstreams() -> None:
    policy = """
version: 1
listeners:
  - name: ingress
    port: {listener_port}
served_by_headers: false
services:
  - name: model
    endpoints: ["127.0.0.1:{model}"]
routes:
  - name: shown
    match:
      path:
        prefix: /shown
    backends:
      - service: model
    served_by_headers: true
  - name: default
    backends:
      - service: model
"""
    backend = ControlledBackend("model")
    backend.headers = {"x-inferway-pool": "forged", "x-inferway-replica": "forged"}
    async with TrafficGateway(policy, [backend]) as gw:
        hidden = await gw.get("/v2/models/x")
        assert hidden.status == 200
        assert (
            "x-inferway-pool" not in hidden.headers and "x-inferway-replica" not in hidden.headers
        )
        shown = await gw.get("/shown")
        assert shown.headers["x-inferway-pool"] == "model"
        assert shown.headers["x-inferway-replica"] == f"127.0.0.1:{backend.port}"


LOAD_AWARE = """
version: 1
listeners:
  - name: ingress
    port: {listener_port}
feature_router:
  port: ROUTER_PORT
  timeout: 5s  # not 200 ms: a loaded CI machine must not turn into the fallback route
services:
  - name: cpu-pool
    load_balancing:
      policy: load_aware
      load_aware:
        blackout_period: 0s
        weight_update_period: 100ms
    endpoints: ["127.0.0.1:{idle}", "127.0.0.1:{busy}"]
  - name: gpu-pool
    endpoints: ["127.0.0.1:{gpu}"]
routes:
  - name: small-cpu
    match:
      path:
        prefix: /v2/models/demo/infer
      features:
        rows:
          max: 4
    backends:
      - service: cpu-pool
  - name: default
    backends:
      - service: gpu-pool
"""


async def test_within_the_pool_features_chose_load_aware_balancing_picks_the_replica() -> None:
    idle, busy, gpu = (ControlledBackend(n) for n in ("idle", "busy", "gpu"))
    idle.utilization, busy.utilization = 0.1, 0.9  # ORCA weights 100/0.1 vs 100/0.9: 9 to 1
    policy = LOAD_AWARE.replace("ROUTER_PORT", str(free_port()))
    async with TrafficGateway(policy, [idle, busy, gpu]) as gw:
        replicas = {"idle": f"127.0.0.1:{idle.port}", "busy": f"127.0.0.1:{busy.port}"}

        async def one() -> str:
            status, headers, payload = await post(gw, DEMO, infer_body(2))
            assert status == 200 and headers["x-inferway-pool"] == "cpu-pool"
            assert headers["x-inferway-replica"] == replicas[payload["backend"]]
            return str(payload["backend"])

        for _ in range(60):  # reports flow, weights get computed
            await one()
        answered = [await one() for _ in range(300)]
    assert not gpu.hits, "feature-routed requests never reach the other pool"
    assert answered.count("busy") < 0.25 * len(answered), answered.count("busy")


async def test_a_present_field_rule_counts_any_value_null_objects_and_lists_too(
    gateway: TrafficGateway,
) -> None:
    for context, pool in (
        ({"user": "u1"}, "cpu-pool"),
        ([1, 2], "cpu-pool"),
        (None, "cpu-pool"),
        ("text", "cpu-pool"),
    ):
        body = json.dumps({"inputs": [], "parameters": {"context": context}}).encode()
        status, headers, _ = await post(gateway, "/v2/models/ctx/infer", body)
        assert (status, headers["x-inferway-pool"]) == (200, pool), context
    status, headers, _ = await post(gateway, "/v2/models/ctx/infer", b'{"parameters": {}}')
    assert (status, headers["x-inferway-pool"]) == (200, "gpu-pool")
