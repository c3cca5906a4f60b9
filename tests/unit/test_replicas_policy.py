"""``services[].replicas`` in the policy: what loads, and a located error for each bad input."""

from __future__ import annotations

import pytest

from inferway.policies import PolicyError, dump_policy, load_policy_text

HEAD = "listeners: [{name: main, port: 10000}]\nservices:\n  - name: m\n    replicas:\n"
TAIL = "routes:\n  - name: all\n    backends: [{service: m}]\n"


def _text(*lines: str) -> str:
    return HEAD + "".join(f"      {line}\n" for line in lines) + TAIL


def _errors(*lines: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(_text(*lines), "p.yaml")
    return [str(issue) for issue in caught.value.issues]


def test_a_service_with_replicas_needs_no_endpoints_and_round_trips() -> None:
    policy = load_policy_text(
        _text(
            "command: inferway serve --model-repository ./models --http-port {port} "
            "--grpc-port {grpc_port}",
            "min: 1",
            "max: 2",
            "devices: ['0', '1']",
            "stop_grace: 250ms",
        )
    )
    (service,) = policy.services
    assert service.endpoints == [] and service.replicas is not None
    spec = service.replicas
    assert (spec.min, spec.max, spec.start_count, spec.stop_grace) == (1, 2, 1, 0.25)
    assert spec.readiness == "/v2/health/ready"
    assert load_policy_text(dump_policy(policy)) == policy


def test_a_command_without_port_is_a_located_error() -> None:
    (error,) = _errors("command: serve --http-port 8000")
    assert error.startswith("p.yaml:5:16: services[0].replicas.command: the command must contain")


def test_unknown_and_malformed_placeholders_are_located_errors() -> None:
    (unknown,) = _errors("command: serve --http-port {prot}")
    assert "p.yaml:5:16:" in unknown and "unknown placeholder '{prot}'" in unknown
    assert "known: {port}, {grpc_port}" in unknown
    (brace,) = _errors("command: 'serve --http-port {port'")
    assert "expected '}' before end of string" in brace
    (spec,) = _errors("command: serve --http-port {port:x}")
    assert "use a plain name such as {port}" in spec
    (env,) = _errors("command: serve {port}", "env: {MODEL: '{model}'}")
    assert "services[0].replicas.env: unknown placeholder '{model}'" in env


def test_min_above_max_is_a_located_error() -> None:
    (error,) = _errors("command: serve {port}", "min: 3", "max: 2")
    assert (
        error
        == "p.yaml:6:12: services[0].replicas.min: min 3 is more than max 2; make min at most max"
    )


def test_initial_outside_min_max_is_a_located_error() -> None:
    (error,) = _errors("command: serve {port}", "min: 1", "max: 2", "initial: 3")
    assert "services[0].replicas.initial: initial 3 is outside min..max (1..2)" in error


def test_fewer_devices_than_max_needs_sharing_allowed() -> None:
    (error,) = _errors("command: serve {port}", "max: 3", "devices: ['0', '1']")
    assert "p.yaml:7:" in error and "2 device(s) for up to 3 replicas" in error
    assert "share_devices: true" in error
    policy = load_policy_text(
        _text("command: serve {port}", "max: 3", "devices: ['0', '1']", "share_devices: true")
    )
    assert policy.services[0].replicas is not None


def test_device_list_mistakes_are_located_errors() -> None:
    twice = _errors("command: serve {port}", "max: 2", "devices: ['0', '0']")
    assert any("devices[1]: device '0' is listed twice (also devices[0])" in e for e in twice)
    (empty,) = _errors("command: serve {port}", "devices: []")
    assert "an empty device list" in empty
    (unlisted,) = _errors("command: serve {port} --gpu {device}")
    assert "uses {device} but no devices are listed" in unlisted
    (share,) = _errors("command: serve {port}", "share_devices: true")
    assert "share_devices has no effect without devices" in share


def test_readiness_must_be_a_path_or_an_http_url() -> None:
    (error,) = _errors("command: serve {port}", "readiness: ready")
    assert "services[0].replicas.readiness: expected a path such as /v2/health/ready" in error
    url = load_policy_text(_text("command: serve {port}", "readiness: 'http://{host}:{port}/ok'"))
    assert url.services[0].replicas is not None


def test_counts_and_backoff_are_checked() -> None:
    (negative,) = _errors("command: serve {port}", "min: -1")
    assert "services[0].replicas.min: must be at least 0, got -1" in negative
    (backoff,) = _errors("command: serve {port}", "backoff: {initial: 5s, max: 1s}")
    assert "initial backoff 5s is longer than max 1s" in backoff
    (typo,) = _errors("command: serve {port}", "stop_grce: 1s")
    assert "unknown key 'stop_grce' (did you mean 'stop_grace'?)" in typo


def test_replicas_listen_on_an_ip_address() -> None:
    (error,) = _errors("command: serve {port}", "host: localhost")
    assert "services[0].replicas.host: expected the IP address replicas listen on" in error
