"""verify's own reading of a policy's routes: which route and pools a request must reach
(first match wins; Envoy's header rules, missing headers included; cookies; feature rules
with their inclusive bounds and malformed bodies), and the routes it reads from a policy
(rollout matches first, listeners, features as plain mappings, located errors)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from inferway.policies.errors import PolicyError
from inferway.tools.verify.expect import Outcome, Probe, expect
from inferway.tools.verify.features import FeatureRule, Verdict, match_features
from inferway.tools.verify.live import rollout_weights
from inferway.tools.verify.routes import VerifyRoute, load_verify_routes

HEAD = """
listeners: [{name: edge, port: 10000}, {name: other, port: 10001}]
services:
  - {name: cpu-pool, endpoints: ["127.0.0.1:9001"]}
  - {name: gpu-pool, endpoints: ["127.0.0.1:9002"]}
  - {name: canary, endpoints: ["127.0.0.1:9003"]}
"""

FEATURES = (
    HEAD
    + """
routes:
  - name: small-cpu
    match:
      path: {prefix: /v2/models/demo/infer}
      features:
        rows: {min: 1, max: 4}
        input_bytes: {max: 300}
        fields:
          - {path: parameters.priority, exact: "high"}
        on_malformed: reject
    backends: [{service: cpu-pool}]
  - name: default
    match: {path: {prefix: /v2/models/demo/infer}}
    backends: [{service: gpu-pool, weight: 90}, {service: canary, weight: 10}]
"""
)


def _routes(tmp_path: Path, text: str, port: int | None = 10000) -> list[VerifyRoute]:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return load_verify_routes(path, port)[1]


def _body(rows: int, priority: str | None = "high", pad: int = 0) -> bytes:
    document: dict[str, object] = {
        "inputs": [{"name": "x", "shape": [rows, 1], "datatype": "FP32", "data": [0] * rows}]
    }
    if priority is not None:
        document["parameters"] = {"priority": priority}
    if pad:
        document["id"] = "x" * pad
    return orjson.dumps(document)


def _probe(path: str = "/v2/models/demo/infer", body: bytes = b"{}", **headers: str) -> Probe:
    pairs = tuple(sorted((k.replace("_", "-"), v) for k, v in headers.items()))
    return Probe("t", path, pairs, body)


@pytest.mark.parametrize(
    ("rows", "priority", "route"),
    [
        (1, "high", "small-cpu"),
        (4, "high", "small-cpu"),
        (0, "high", "default"),
        (5, "high", "default"),
        (2, "low", "default"),
        (2, None, "default"),
    ],
)
def test_feature_rules_hold_at_their_inclusive_bounds_and_fall_through_outside(
    tmp_path: Path, rows: int, priority: str | None, route: str
) -> None:
    routes = _routes(tmp_path, FEATURES)
    assert expect(routes, _probe(body=_body(rows, priority))).route == route


def test_input_bytes_is_the_body_size_and_a_malformed_body_is_rejected_per_rule(
    tmp_path: Path,
) -> None:
    routes = _routes(tmp_path, FEATURES)
    at_max = _body(2, pad=300 - len(_body(2, pad=1)) + 1)
    assert len(at_max) == 300
    assert expect(routes, _probe(body=at_max)).route == "small-cpu"
    assert expect(routes, _probe(body=at_max[:-2] + b'x"}')).route == "default"  # 301 bytes
    rejected = expect(routes, _probe(body=b"not json"))
    assert rejected.outcome is Outcome.reject and rejected.route == "small-cpu"
    skip = FEATURES.replace("on_malformed: reject", "on_malformed: skip")
    assert expect(_routes(tmp_path, skip), _probe(body=b"not json")).route == "default"


def test_a_weighted_route_expects_its_pools_with_their_shares(tmp_path: Path) -> None:
    expected = expect(_routes(tmp_path, FEATURES), _probe(body=_body(9)))
    assert expected.outcome is Outcome.pool
    assert [(p.service, p.share) for p in expected.pools] == [("gpu-pool", 0.9), ("canary", 0.1)]
    assert expect(_routes(tmp_path, FEATURES), _probe("/healthz")).outcome is Outcome.no_route


HEADERS = (
    HEAD
    + """
routes:
  - name: inverted
    match:
      path: {exact: /a}
      headers: [{name: x-tier, exact: gold, invert: true}]
    backends: [{service: cpu-pool}]
  - name: absent
    match:
      path: {exact: /a}
      headers: [{name: x-tier, present: false}]
    backends: [{service: canary}]
  - name: regex
    match:
      path: {regex: "/b/[0-9]+"}
      headers: [{name: x-user, regex: "u[0-9]{2}"}]
      cookies: [{name: cohort, exact: beta}]
    backends: [{service: gpu-pool}]
"""
)


def test_a_missing_header_matches_only_present_false_as_in_envoy(tmp_path: Path) -> None:
    routes = _routes(tmp_path, HEADERS)
    # inverted exact: a missing header does not match it (Envoy's HeaderUtility)
    assert expect(routes, _probe("/a")).route == "absent"
    assert expect(routes, _probe("/a", x_tier="silver")).route == "inverted"
    assert expect(routes, _probe("/a", x_tier="gold")).outcome is Outcome.no_route


def test_regex_paths_and_headers_match_whole_values_and_cookies_by_name(tmp_path: Path) -> None:
    routes = _routes(tmp_path, HEADERS)
    good = {"x_user": "u42", "cookie": "a=1; cohort=beta"}
    assert expect(routes, _probe("/b/12", **good)).route == "regex"
    assert expect(routes, _probe("/b/12x", **good)).outcome is Outcome.no_route
    assert expect(routes, _probe("/b/1", x_user="u421", cookie="cohort=beta")).route is None
    assert expect(routes, _probe("/b/1", x_user="u42", cookie="cohort=betax")).route is None


def test_rollout_matches_come_before_their_route_and_listeners_filter(tmp_path: Path) -> None:
    text = (
        HEAD
        + """
routes:
  - name: elsewhere
    listeners: [other]
    match: {path: {prefix: /other}}
    backends: [{service: cpu-pool}]
  - name: infer
    backends: [{service: gpu-pool, weight: 100}, {service: canary, weight: 0}]
rollouts:
  - name: r
    route: infer
    stable: gpu-pool
    canary: canary
    steps: [10, 50]
    match: [{headers: [{name: x-canary, exact: "1"}]}]
"""
    )
    routes = _routes(tmp_path, text)
    assert [r.name for r in routes] == ["infer-canary-0", "infer"]
    assert [p.service for p in routes[1].pools] == ["gpu-pool"]  # weight 0: never expected
    assert expect(routes, _probe("/x", x_canary="1")).services == {"canary"}
    on_other = _routes(tmp_path, text, 10001)
    assert [r.name for r in on_other] == ["elsewhere", "infer-canary-0", "infer"]


def test_a_bad_feature_rule_is_a_located_error(tmp_path: Path) -> None:
    bad = FEATURES.replace('{path: parameters.priority, exact: "high"}', "{path: p}")
    with pytest.raises(PolicyError) as error:
        _routes(tmp_path, bad)
    (issue,) = error.value.issues
    assert issue.path == "routes[0].match.features.fields[0]"
    assert issue.line == bad.splitlines().index("          - {path: p}") + 1
    assert "one of exact, regex, present or min/max" in issue.message  # either schema


def test_numeric_fields_and_present_rules() -> None:
    rule = FeatureRule.model_validate(
        {"fields": [{"path": "a.b", "min": 0, "max": 2}, {"path": "c", "present": False}]}
    )
    assert match_features(rule, b'{"a": {"b": 2}}') is Verdict.match
    assert match_features(rule, b'{"a": {"b": 2.5}}') is Verdict.miss
    assert match_features(rule, b'{"a": {"b": true}}') is Verdict.miss
    assert match_features(rule, b'{"a": {"b": 1}, "c": 1}') is Verdict.miss
    assert match_features(rule, b"[1, 2]") is Verdict.malformed


def test_a_live_rollout_weight_replaces_the_policy_split(tmp_path: Path) -> None:
    document = {"rollouts": [{"route": "default", "stable": "gpu-pool", "canary": "canary",
                              "weight_percent": 25.0}]}  # fmt: skip
    weights = rollout_weights(document)
    assert weights == {"default": {"gpu-pool": 75.0, "canary": 25.0}}
    path = tmp_path / "policy.yaml"
    path.write_text(FEATURES, encoding="utf-8")
    routes = load_verify_routes(path, 10000, weights)[1]
    shares = {p.service: p.share for p in routes[1].pools}
    assert shares == {"gpu-pool": 0.75, "canary": 0.25}
    assert [p.share for p in routes[0].pools] == [1.0]  # other routes keep the policy's


def test_exact_matches_a_field_of_its_own_type_and_numbers_index_lists() -> None:
    rule = FeatureRule.model_validate(
        {"fields": [{"path": "n", "exact": 2}, {"path": "b", "exact": True},
                    {"path": "inputs.0.datatype", "exact": "FP32"}]}
    )  # fmt: skip
    good = b'{"n": 2.0, "b": true, "inputs": [{"datatype": "FP32"}]}'
    assert match_features(rule, good) is Verdict.match
    assert match_features(rule, good.replace(b"2.0", b'"2"')) is Verdict.miss
    assert match_features(rule, good.replace(b"true", b"1")) is Verdict.miss
    assert match_features(rule, good.replace(b"FP32", b"INT8")) is Verdict.miss


def test_a_rows_rule_needs_an_inference_request_else_the_body_is_malformed() -> None:
    rows = FeatureRule.model_validate({"rows": {"max": 4}, "on_malformed": "reject"})
    assert match_features(rows, b'{"parameters": {}}') is Verdict.malformed
    assert match_features(rows, _body(2)) is Verdict.match
    size = FeatureRule.model_validate({"input_bytes": {"max": 100}})
    assert match_features(size, b'{"parameters": {}}') is Verdict.match
