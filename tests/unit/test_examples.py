"""Every policy in examples/ is what a user starts from, so each must load cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.policies import Policy, dump_policy, load_policy, load_policy_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FILES = sorted(EXAMPLES.glob("*.yaml"))


def test_the_documented_examples_exist() -> None:
    assert {"minimal.yaml", "canary.yaml", "demo.yaml"} <= {p.name for p in FILES}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_validates(path: Path) -> None:
    policy = load_policy(path)
    assert isinstance(policy, Policy)
    assert policy.listeners and policy.routes


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_uses_only_loopback_endpoints(path: Path) -> None:
    policy = load_policy(path)
    hosts = {e.host for s in policy.services for e in s.endpoints}
    assert hosts <= {"127.0.0.1", "::1", "localhost"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_round_trips_through_dump(path: Path) -> None:
    policy = load_policy(path)
    assert load_policy_text(dump_policy(policy)) == policy


def test_demo_example_is_what_the_demo_expects() -> None:
    policy = load_policy(EXAMPLES / "demo.yaml")
    (listener,) = policy.listeners
    assert (listener.address, listener.port) == ("127.0.0.1", 10000)
    endpoints = {s.name: [(e.host, e.port) for e in s.endpoints] for s in policy.services}
    assert endpoints == {"model-v1": [("127.0.0.1", 8081)], "model-v2": [("127.0.0.1", 8082)]}
    (route,) = policy.routes
    assert route.match.path.prefix == "/"
    assert [(b.service, b.weight) for b in route.backends] == [("model-v1", 90), ("model-v2", 10)]


def test_canary_example_splits_999_to_1_sticky_and_forces_v2_by_header_or_cookie() -> None:
    policy = load_policy(EXAMPLES / "canary.yaml")
    forced, by_cookie, split = policy.routes
    (header,) = forced.match.headers
    assert (header.name, header.exact) == ("x-canary", "true")
    (cookie,) = by_cookie.match.cookies
    assert (cookie.name, cookie.exact) == ("canary", "true")
    assert [b.service for b in forced.backends] == [b.service for b in by_cookie.backends]
    assert [b.service for b in forced.backends] == ["model-v2"]
    assert split.hash is not None and split.hash.header == "x-user-id"
    assert [(b.service, b.permille) for b in split.backends] == [
        ("model-v1", 999),
        ("model-v2", 1),
    ]
    assert split.retries is not None and split.retries.attempts >= 1


def test_rollout_example_walks_v1_to_v2_with_forced_testers() -> None:
    policy = load_policy(EXAMPLES / "rollout.yaml")
    (rollout,) = policy.rollouts
    assert (rollout.route, rollout.stable, rollout.canary) == ("inference", "model-v1", "model-v2")
    assert [s.weight for s in rollout.steps] == [0.1, 1, 5, 25, 50, 100]
    assert rollout.steps[3].pause == 600.0
    assert [m.name for m in rollout.analysis.metrics] == [
        "error-rate",
        "latency-p99",
        "latency-quantile",
    ]
    (forced,) = rollout.match
    assert [(h.name, h.exact) for h in forced.headers] == [("x-canary", "true")]
