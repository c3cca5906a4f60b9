"""The requests verify generates from a policy: every route reached, each feature bound hit
on both sides, each condition broken once, regex conditions given real values; and the
verdict pieces (judging an answer, the chi-square activation test, the report's bars)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import re2

from inferway.policies.model import PathMatch
from inferway.tools.verify.cases import Coverage, generate_probes
from inferway.tools.verify.expect import Expected, Outcome, expect
from inferway.tools.verify.features import body_document, rows_of
from inferway.tools.verify.functional import Observation, judge, summarize
from inferway.tools.verify.load import is_loopback
from inferway.tools.verify.routes import Pool, VerifyRoute, load_verify_routes
from inferway.tools.verify.stats import chi_square

POLICY = """
listeners: [{name: edge, port: 10000}]
services:
  - {name: cpu-pool, endpoints: ["127.0.0.1:9001"]}
  - {name: gpu-pool, endpoints: ["127.0.0.1:9002"]}
  - {name: canary, endpoints: ["127.0.0.1:9003"]}
routes:
  - name: small-cpu
    match:
      path: {prefix: /v2/models/demo/infer}
      headers: [{name: x-user, regex: "u-[0-9]{3}"}]
      features:
        rows: {min: 2, max: 4}
        input_bytes: {max: 4096}
        fields:
          - {path: parameters.priority, exact: "high"}
          - {path: parameters.temperature, min: 0, max: 2}
          - {path: model, regex: "demo-[a-z]+"}
    backends: [{service: cpu-pool}]
  - name: beta
    match:
      path: {regex: "/v2/models/[a-z]+/infer"}
      cookies: [{name: cohort, exact: beta}]
    backends: [{service: canary}]
  - name: default
    match: {path: {prefix: /v2/models/demo/infer}}
    backends: [{service: gpu-pool, weight: 90}, {service: canary, weight: 10}]
"""


def _routes(tmp_path: Path) -> list[VerifyRoute]:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return load_verify_routes(path, 10000)[1]


def test_every_route_is_reached_and_every_bound_hit_on_both_sides(tmp_path: Path) -> None:
    routes = _routes(tmp_path)
    probes, coverage = generate_probes(routes)
    assert coverage.uncovered == []
    reached = Counter(expect(routes, p).route for p in probes)
    assert set(reached) == {"small-cpu", "beta", "default", None}
    small = [p for p in probes if expect(routes, p).route == "small-cpu"]
    rows = {rows_of(body_document(p.body) or {}) for p in small}
    assert rows == {2, 4}
    fallen = [p for p in probes if p.covers.startswith("small-cpu") and p not in small]
    fallen_rows = {rows_of(body_document(p.body) or {}) for p in fallen}
    assert {1, 5} <= fallen_rows
    sizes = {len(p.body): expect(routes, p).route for p in probes}
    assert sizes[4096] == "small-cpu" and sizes[4097] == "default"
    malformed = next(p for p in probes if p.body == b"not json {")
    assert expect(routes, malformed).route == "default"  # on_malformed: skip (the default)


def test_regex_conditions_get_values_their_pattern_matches(tmp_path: Path) -> None:
    routes = _routes(tmp_path)
    probes, _ = generate_probes(routes, seed=7)
    base = next(p for p in probes if p.covers == "small-cpu: every condition holds")
    assert expect(routes, base).route == "small-cpu"
    assert re2.fullmatch("u-[0-9]{3}", base.header_map()["x-user"])
    document = body_document(base.body)
    assert document is not None and re2.fullmatch("demo-[a-z]+", document["model"])
    beta = next(p for p in probes if p.covers == "beta: every condition holds")
    assert re2.fullmatch("/v2/models/[a-z]+/infer", beta.path)
    assert expect(routes, beta).route == "beta"
    assert generate_probes(routes, seed=7)[0] == probes  # deterministic for a seed


def test_each_broken_condition_falls_to_a_later_route(tmp_path: Path) -> None:
    routes = _routes(tmp_path)
    probes, _ = generate_probes(routes)
    broken = {p.covers: expect(routes, p).route for p in probes if "small-cpu:" in p.covers}
    assert broken["small-cpu: header x-user absent"] == "default"
    assert broken["small-cpu: field parameters.priority not 'high'"] == "default"
    assert broken["small-cpu: field parameters.temperature = 3 (above max)"] == "default"
    assert broken["small-cpu: field model absent"] == "default"
    assert broken["small-cpu: path does not match"] is None


def test_an_answer_is_judged_by_its_pool_or_by_the_refusal_the_policy_asks_for() -> None:
    pools = Expected(Outcome.pool, "r", (Pool("a", 0.5), Pool("b", 0.5)))
    assert judge(pools, 200, "a") and judge(pools, 404, "b")  # a backend's own 4xx: right pool
    assert not judge(pools, 200, "c") and not judge(pools, 503, "a") and not judge(pools, 0, None)
    assert judge(Expected(Outcome.reject, "r"), 400, None)
    assert not judge(Expected(Outcome.reject, "r"), 400, "a")
    assert judge(Expected(Outcome.no_route, None), 404, None)


def test_chi_square_passes_a_fair_split_fails_a_skewed_one_and_abstains_when_thin() -> None:
    fair = chi_square({"a": 905, "b": 95}, {"a": 900.0, "b": 100.0}, alpha=0.001)
    assert fair.ok is True and fair.p_value is not None and fair.p_value > 0.5
    skewed = chi_square({"a": 500, "b": 500}, {"a": 900.0, "b": 100.0}, alpha=0.001)
    assert skewed.ok is False and skewed.p_value is not None and skewed.p_value < 1e-10
    thin = chi_square({"a": 9, "b": 1}, {"a": 9.0, "b": 1.0}, alpha=0.001)
    assert thin.ok is None and "too few requests" in thin.note
    assert chi_square({"a": 10}, {"a": 10.0}, alpha=0.001).ok is None


def test_summary_counts_mismatches_per_request_kind_and_fails_the_bar() -> None:
    route = VerifyRoute("r", PathMatch(prefix="/"), (), (), None, (Pool("a", 0.5), Pool("b", 0.5)))
    wanted = Expected(Outcome.pool, "r", route.pools)
    observations = [Observation("r: ok", wanted, 200, "ab"[i % 2], None, True) for i in range(998)]
    observations += [Observation("r: bad", wanted, 200, "c", "h:1", False)] * 2
    report = summarize(observations, [route], Coverage(), bar=99.9)
    assert report.correctness == 99.8 and not report.ok
    assert report.mismatches == [
        {"covers": "r: bad", "expected": "r -> a | b", "observed": "c (HTTP 200)", "count": 2}
    ]
    assert report.per_route["r"].ok is True and report.replicas["c"] == {"h:1": 2}


def test_load_is_aimed_at_loopback_only() -> None:
    assert is_loopback("http://127.0.0.1:10000") and is_loopback("http://[::1]:80/")
    assert is_loopback("http://localhost:8080") and is_loopback("http://127.3.4.5")
    assert not is_loopback("http://10.0.0.1:80") and not is_loopback("https://example.com")
