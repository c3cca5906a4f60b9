"""Hostile values in a policy give located errors, never a traceback or a silent coercion
(issue 33, items 7 and 8): deep nesting, infinite and huge weights, ``weight: true``, and an
endpoint host that is not a host."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferway.cli.main import app
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.yaml_marks import MAX_DEPTH

BASE = """\
version: 1
listeners: [{name: edge, port: 10080}]
services: [{name: llama, endpoints: ["HOST"]}]
routes:
  - name: chat
    backends:
      - service: llama
        weight: WEIGHT
"""


def _policy(weight: str = "100", host: str = "127.0.0.1:8000") -> str:
    return BASE.replace("WEIGHT", weight).replace("HOST", host)


def _messages(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    assert all(issue.line is not None for issue in caught.value.issues)
    return [str(issue) for issue in caught.value.issues]


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 500, 5000])
def test_deep_nesting_is_a_located_error(depth: int) -> None:
    text = _policy() + "x: " + "[" * depth + "]" * depth + "\n"
    (message,) = _messages(text)
    assert message.startswith("p.yaml:9:")
    assert f"nested too deeply: more than {MAX_DEPTH} levels" in message


def test_deep_nesting_through_aliases_is_a_located_error() -> None:
    chain = ["a0: &a0 " + "[" * 40 + "]" * 40]
    chain += [f"a{i}: &a{i} " + "[" * 40 + f"*a{i - 1}" + "]" * 40 for i in range(1, 60)]
    (message,) = _messages(_policy() + "\n".join(chain) + "\n")
    assert "nested too deeply" in message and "once aliases are expanded" in message


@pytest.mark.parametrize(
    ("weight", "expected"),
    [
        (".inf", "expected a finite number, got inf"),
        ("-.inf", "expected a finite number, got -inf"),
        (".nan", "expected a finite number, got nan"),
        ("1e400", "expected a finite number"),
        ("1.0e+400", "expected a finite number"),
        ("1.0e+308", "must be at most 429496729"),
        ("1.0e+20", "must be at most 429496729"),
    ],
)
def test_weights_out_of_range_are_located(weight: str, expected: str) -> None:
    (message,) = _messages(_policy(weight))
    assert message.startswith("p.yaml:8:17: routes[0].backends[0].weight: ")
    assert expected in message
    assert "seconds" not in message


@pytest.mark.parametrize("value", ["true", "false", "yes", "on"])
def test_a_boolean_is_not_a_number(value: str) -> None:
    messages = _messages(_policy(value))
    assert (
        f"p.yaml:8:17: routes[0].backends[0].weight: expected a number, got "
        f"{'false' if value == 'false' else 'true'}"
    ) in messages


def test_a_boolean_duration_or_port_is_refused_too() -> None:
    text = _policy().replace("port: 10080", "port: true") + "    timeout: true\n"
    messages = _messages(text)
    assert any("listeners[0].port: expected a number, got true" in m for m in messages)


@pytest.mark.parametrize("host", ["evil host:80", "a/b:80", "-x-:80", "x..y:80", "é.com:80"])
def test_an_endpoint_host_must_be_an_address_or_a_dns_name(host: str) -> None:
    (message,) = _messages(_policy(host=host))
    assert "services[0].endpoints[0]" in message
    assert "expected an IP address or a DNS name" in message


@pytest.mark.parametrize("host", ["10.0.0.1:80", "[::1]:80", "llama.ns.svc.:80", "_grpc.x:80"])
def test_real_hosts_still_pass(host: str) -> None:
    load_policy_text(_policy(host=host), "p.yaml")


@pytest.mark.parametrize(
    "content",
    [
        _policy() + "x: " + "[" * 500 + "]" * 500 + "\n",
        _policy(".inf"),
        _policy("1e400"),
        _policy("1.0e+308"),
    ],
)
def test_validate_never_shows_a_traceback(tmp_path: Path, content: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(content, encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", "-f", str(path)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1" + "0" * 400, "this duration is too large"),
        ("'" + "1" * 400 + "s'", "expected a finite duration"),
        (".inf", "expected a finite duration"),
    ],
)
def test_a_duration_beyond_any_float_is_located(value: str, expected: str) -> None:
    """Found by bench/fuzz_policies.py: ``float(10**400)`` raised OverflowError."""
    text = _policy().replace(
        "services: [{name: llama,", f"services: [{{name: llama, connect_timeout: {value},"
    )
    (message,) = _messages(text)
    assert "services[0].connect_timeout: " + expected in message


def test_an_integer_of_thousands_of_digits_is_located() -> None:
    """Found by the policy fuzzer: PyYAML's int() raised ValueError (Python's 4300-digit
    limit on integer strings)."""
    text = _policy().replace("port: 10080", "port: 1" + "0" * 5000)
    messages = _messages(text)
    assert (
        "p.yaml:2:32: listeners[0].port: cannot read this value: a number of 5001 characters"
        in (messages)
    )


def test_a_feature_range_with_a_huge_integer_is_located() -> None:
    """Found by the policy fuzzer: ``f"{10**400:g}"`` raised OverflowError in the message."""
    text = _policy().replace(
        "  - name: chat\n",
        "  - name: chat\n    match: {features: {input_bytes: {min: 1" + "0" * 400 + ", max: 4}}}\n",
    )
    (message,) = _messages(text)
    assert "routes[0].match.features.input_bytes" in message
    assert message.endswith("is above max 4: nothing could match")
