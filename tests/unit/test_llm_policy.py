"""OpenAI-compatible routes, the policy side: located errors for what the LLM processor could
not serve, the IR an ``openai`` route resolves to (paths, no total timeout, fallback
retries without hedging), and that a policy with them writes back unchanged."""

from __future__ import annotations

import re

import pytest

from inferway.policies import PolicyError, load_policy_text
from inferway.policies.dump import dump_policy
from inferway.resolve import resolve_policy
from inferway.resolve.ir.route import PathMatchIR

_HEAD = (
    "listeners: [{name: l, port: 10000}]\n"
    "services:\n"
    "  - {name: a, endpoints: ['127.0.0.1:1']}\n"
    "  - {name: grpc, protocol: http2, endpoints: ['127.0.0.1:2']}\n"
    "routes:\n"
    "  - name: r\n"
    "    backends: [{service: a}]\n"
)
_OPENAI = "    openai: {model: m, aliases: [x]}\n"


@pytest.mark.parametrize(
    ("extra", "line", "expected"),
    [
        ("    openai: {model: m, aliases: [m]}\n", 8, "alias 'm' is the model's own name"),
        ("    openai: {model: m, prefix: v1}\n", 8, "prefix is a path such as /v1"),
        ("    openai: {model: ''}\n", 8, "must not be empty"),
        (_OPENAI + "    match: {path: {prefix: /v1}}\n", 9, "remove match.path"),
        (
            _OPENAI + "  - name: s\n    backends: [{service: a}]\n    openai: {model: x}\n",
            11,
            "model 'x' under /v1 is served by route 'r' already",
        ),
        (
            _OPENAI + "  - name: s\n    backends: [{service: grpc}]\n    openai: {model: y}\n",
            10,
            "service 'grpc' is http2",
        ),
        (_OPENAI + "llm: {port: 10000}\n", 9, "port 10000 is listener 'l''s"),
        (  # the reports port's default, port + 1
            _OPENAI + "llm: {port: 9999}\n",
            9,
            "reports port 10000 (llm.reports_port, default port + 1) is listener 'l''s",
        ),
        (
            _OPENAI + "llm:\n  port: 18100\n  reports_port: 18100\n",
            11,
            "reports port 18100 (llm.reports_port, default port + 1) is the LLM processor's gRPC",
        ),
        (_OPENAI + "    timeout: 30s\n", 9, "set openai.timeout (0: none)"),
    ],
)
def test_bad_openai_routes_are_located(extra: str, line: int, expected: str) -> None:
    with pytest.raises(PolicyError, match=rf":{line}:.*{re.escape(expected)}"):
        load_policy_text(_HEAD + extra, "policy.yaml")


def test_an_openai_route_resolves_to_its_endpoints_without_a_total_timeout() -> None:
    policy = load_policy_text(_HEAD + _OPENAI, "policy.yaml")
    ir = resolve_policy(policy)
    route = ir.listeners[0].routes[0]
    assert route.match.path == PathMatchIR("regex", "/v1/(chat/completions|completions|embeddings)")
    assert route.timeout == 0.0 and route.llm is not None and route.llm.aliases == ("x",)
    assert route.retries is not None
    assert route.retries.retriable_status_codes == (429,)
    assert "5xx" in route.retries.retry_on and route.retries.per_try_timeout is None
    assert not route.retries.hedge_on_per_try_timeout, "a stream is never hedged"
    assert ir.llm is not None and (ir.llm.port, ir.llm.reports_port) == (18092, 18093)


def test_a_policy_without_openai_routes_has_no_llm_processor() -> None:
    assert resolve_policy(load_policy_text(_HEAD, "policy.yaml")).llm is None


def test_a_policy_with_openai_routes_writes_back_unchanged() -> None:
    text = _HEAD + _OPENAI + "llm: {limits: {tokens_per_minute: 100}, client_key: {header: x-t}}\n"
    policy = load_policy_text(text, "policy.yaml")
    assert load_policy_text(dump_policy(policy), "again.yaml") == policy


def test_an_openai_routes_services_are_probed_at_the_models_endpoint() -> None:
    text = (
        _HEAD
        + "    openai: {model: m, prefix: /openai/v1}\n"
        + "  - name: other\n    backends: [{service: b}]\n"
    ).replace("  - {name: grpc,", "  - {name: b, endpoints: ['127.0.0.1:3']}\n  - {name: grpc,")
    services = {s.name: s for s in resolve_policy(load_policy_text(text, "policy.yaml")).services}
    check_a, check_b = services["a"].health_check, services["b"].health_check
    assert check_a is not None and check_a.path == "/openai/v1/models"
    assert check_b is not None and check_b.path == "/v2/health/ready"
