"""GET /policy never shows API keys: access rules' header values, and route-match values of
credential headers or of headers named in redact_headers, read ``<redacted>``; the live
policy keeps its values."""

from __future__ import annotations

import httpx
import yaml

from inferway.gateway.admin import build_admin_app, start_admin_server
from inferway.gateway.control_plane import ControlPlane
from inferway.policies import load_policy_text
from inferway.policies.redact import REDACTED_VALUE, build_redacted_policy
from inferway.xds.cache import SnapshotCache

POLICY = """\
listeners: [{name: public, port: 10000}]
services: [{name: model, endpoints: ["127.0.0.1:8001"]}]
redact_headers: [x-tenant-secret]
routes:
  - name: tenant
    match:
      headers:
        - {name: x-tenant-secret, exact: tenant-s3cret}
        - {name: authorization, prefix: "Bearer abc"}
        - {name: x-model, exact: llama}
    backends: [{service: model}]
  - name: keyed
    access:
      allow:
        - headers: [{name: x-api-key, exact: key-s3cret}]
        - headers: [{name: x-team, prefix: team-s3cret}, {name: x-debug, present: true}]
      deny:
        - headers: [{name: x-old-key, exact: revoked-s3cret}]
          source_ips: [10.0.0.0/8]
    backends: [{service: model}]
"""


def test_redacted_copy_masks_secret_values_only() -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    shown = build_redacted_policy(policy)
    tenant, keyed = shown.routes
    assert [h.exact or h.prefix for h in tenant.match.headers] == [
        REDACTED_VALUE,
        REDACTED_VALUE,
        "llama",  # not a credential header: the value is routing, shown as written
    ]
    assert keyed.access is not None
    allow, team = keyed.access.allow
    assert allow.headers is not None and allow.headers[0].exact == REDACTED_VALUE
    assert team.headers is not None and team.headers[0].prefix == REDACTED_VALUE
    assert team.headers[1].present is True and team.headers[1].exact is None
    [deny] = keyed.access.deny
    assert deny.headers is not None and deny.headers[0].exact == REDACTED_VALUE
    assert deny.source_ips == ["10.0.0.0/8"]
    # The live policy is untouched.
    assert policy.routes[1].access.allow[0].headers[0].exact == "key-s3cret"  # type: ignore[union-attr,index]
    assert policy.routes[0].match.headers[0].exact == "tenant-s3cret"


async def test_admin_policy_endpoint_never_shows_api_keys() -> None:
    plane = ControlPlane(SnapshotCache())
    plane.apply_policy(load_policy_text(POLICY, "p.yaml"), "p.yaml")
    server = await start_admin_server(build_admin_app(plane), port=0)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            response = await client.get("/policy")
    finally:
        await server.stop()
    assert response.status_code == 200
    assert "s3cret" not in response.text
    assert "Bearer abc" not in response.text
    shown = yaml.safe_load(response.text)
    assert shown["routes"][1]["access"]["allow"][0]["headers"][0] == {
        "name": "x-api-key",
        "exact": REDACTED_VALUE,
    }
    assert shown["routes"][0]["match"]["headers"][2]["exact"] == "llama"
    assert shown["redact_headers"] == ["x-tenant-secret"]
