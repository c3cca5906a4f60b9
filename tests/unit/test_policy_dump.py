"""dump_policy writes YAML that loads back into an equal Policy (the demo rewrites weights)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from inferway.policies import Policy, dump_policy, load_policy_text

RICH: dict[str, object] = {
    "listeners": [
        {"name": "v4", "address": "127.0.0.1", "port": 10000},
        {"name": "v6", "address": "::1", "port": 10001},
    ],
    "services": [
        {
            "name": "model-v1",
            "protocol": "http2",
            "connect_timeout": 0.25,
            "endpoints": [
                "127.0.0.1:8081",
                "[::1]:8083",
                {"host": "127.0.0.1", "port": 8084, "zone": "a", "priority": 1, "weight": 3},
            ],
        },
        {"name": "model-v2", "endpoints": ["127.0.0.1:8082"]},
        {"name": "spare"},
    ],
    "routes": [
        {
            "name": "forced",
            "listeners": ["v4"],
            "match": {
                "path": {"regex": "^/v2/.*$"},
                "headers": [
                    {"name": "x-canary", "exact": "true"},
                    {"name": "x-debug", "present": True, "invert": True},
                ],
            },
            "backends": [{"service": "model-v2"}],
            "timeout": 0.1 + 0.2,
        },
        {
            "name": "split",
            "backends": [
                {"service": "model-v1", "weight": 99.9},
                {"service": "model-v2", "weight": 0.1},
                {"service": "spare", "weight": 0},
            ],
            "retries": {
                "attempts": 3,
                "on": ["retriable-status-codes", "reset"],
                "retriable_status_codes": [503, 429],
                "per_try_timeout": 1.5,
            },
        },
    ],
}


def test_rich_policy_round_trips() -> None:
    policy = Policy.model_validate(RICH)
    text = dump_policy(policy)
    assert load_policy_text(text, "dumped.yaml") == policy


def test_dump_writes_readable_durations_and_endpoints() -> None:
    text = dump_policy(Policy.model_validate(RICH))
    assert "connect_timeout: 250ms" in text
    assert "per_try_timeout: 1.5s" in text
    assert "- 127.0.0.1:8081" in text
    assert "- '[::1]:8083'" in text


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.integers(min_value=0, max_value=100_000), min_size=1, max_size=4).filter(
        any
    ),
    timeout_ms=st.integers(min_value=0, max_value=10**7),
)
def test_any_weights_and_timeouts_round_trip(weights: list[int], timeout_ms: int) -> None:
    services = [{"name": f"s{i}", "endpoints": [f"127.0.0.1:{8000 + i}"]} for i in range(4)]
    backends = [{"service": f"s{i}", "weight": w / 10} for i, w in enumerate(weights)]
    policy = Policy.model_validate(
        {
            "listeners": [{"name": "main", "port": 10000}],
            "services": services,
            "routes": [{"name": "r", "backends": backends, "timeout": timeout_ms / 1000}],
        }
    )
    assert load_policy_text(dump_policy(policy)) == policy
