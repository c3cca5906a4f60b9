"""Feature routing, the pure parts: the schema's located errors and refused combinations,
what the feature router measures in a body, and that a policy with features and served-by
settings writes back unchanged."""

from __future__ import annotations

import json
import re

import pytest

from inferway.gateway.features.measure import measure_body, measure_bodyless, parse_field_paths
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.dump import dump_policy
from inferway.resolve import resolve_policy
from inferway.resolve.ir.route import PathMatchIR
from inferway.xds.translate.features import may_share_requests

_HEAD = (
    "listeners: [{name: l, port: 10000}]\n"
    "services:\n"
    "  - {name: cpu, endpoints: ['127.0.0.1:1']}\n"
    "  - {name: grpc, protocol: http2, endpoints: ['127.0.0.1:2']}\n"
    "routes:\n"
    "  - name: r\n"
    "    backends: [{service: cpu}]\n"
    "    match:\n"
    "      features:\n"
)


@pytest.mark.parametrize(
    ("features", "line", "expected"),
    [
        ("        rows: {min: 5, max: 1}\n", 10, "min 5 is above max 1"),
        ("        rows: {}\n", 10, "give min, max or both"),
        ("        rows: {min: -1}\n", 10, "must be at least 0, got -1"),
        ("        on_malformed: reject\n", 9, "give at least one of rows, input_bytes or fields"),
        ("        fields: [{path: a.b}]\n", 10, "exactly one of exact, regex, present or min/max"),
        ("        fields: [{path: a, exact: x, present: true}]\n", 10, "got exact, present"),
        ("        fields: [{path: 'a..b', present: true}]\n", 10, "dotted keys such as"),
        ("        fields: [{path: a, regex: 'tr(ue'}]\n", 10, "invalid regex 'tr(ue'"),
        ("        rows: {max: 4}\n        on_malformed: drop\n", 11, "'skip' or 'reject'"),
        ("        size: {max: 4}\n", 10, "unknown key 'size'"),
    ],
)
def test_bad_features_are_located(features: str, line: int, expected: str) -> None:
    with pytest.raises(PolicyError, match=rf":{line}:.*{re.escape(expected)}"):
        load_policy_text(_HEAD + features, "policy.yaml")


def test_features_on_a_grpc_service_and_in_a_proxyless_target_are_refused() -> None:
    text = (
        _HEAD.replace("backends: [{service: cpu}]", "backends: [{service: grpc}]")
        + "        rows: {max: 4}\n"
        + "grpc_targets: [{name: t, route: r}]\n"
    )
    with pytest.raises(PolicyError) as refused:
        load_policy_text(text, "policy.yaml")
    message = str(refused.value)
    assert re.search(r"policy\.yaml:9:.*http2 \(gRPC\) service", message), message
    assert re.search(r"policy\.yaml:11:.*proxyless gRPC clients would ignore them", message)


def test_a_feature_route_with_prefix_slash_does_not_shadow_later_routes() -> None:
    text = (
        _HEAD
        + "        rows: {max: 4}\n"
        + "  - name: default\n"
        + "    backends: [{service: cpu}]\n"
    )
    policy = load_policy_text(text, "policy.yaml")
    assert [r.name for r in policy.routes] == ["r", "default"]


def test_features_and_served_by_settings_write_back_unchanged() -> None:
    text = (
        _HEAD
        + "        rows: {max: 4}\n"
        + "        fields: [{path: parameters.level, exact: 3}, {path: p.q, min: 0.5}]\n"
        + "    served_by_headers: true\n"
        + "served_by_headers: false\n"
        + "feature_router: {port: 18555, timeout: 50ms}\n"
    )
    policy = load_policy_text(text, "policy.yaml")
    assert load_policy_text(dump_policy(policy), "dumped.yaml") == policy
    ir = resolve_policy(policy)
    assert ir.feature_router is not None and ir.feature_router.fields == ("p.q", "parameters.level")
    assert ir.listeners[0].routes[0].served_by_headers is True


def test_the_router_is_resolved_only_when_a_route_needs_it() -> None:
    policy = load_policy_text(_HEAD.replace("    match:\n      features:\n", ""), "policy.yaml")
    assert resolve_policy(policy).feature_router is None


def _body(document: object) -> bytes:
    return json.dumps(document).encode()


def test_measure_reads_rows_size_and_requested_fields() -> None:
    body = _body(
        {
            "inputs": [{"name": "in0", "shape": [3, 4], "data": []}],
            "parameters": {"priority": "high", "level": 2, "flag": True, "nested": {"a": 1}},
        }
    )
    paths = ("parameters.priority", "parameters.level", "parameters.flag", "inputs.0.name")
    measured = measure_body(body, (*paths, "parameters.nested", "parameters.none", "inputs.5.name"))
    assert measured["input_bytes"] == len(body)
    assert (measured["json"], measured["inference"], measured["rows"]) == (True, True, 3)
    assert measured["fields"] == {
        "parameters.priority": "high",
        "parameters.level": 2.0,
        "parameters.flag": True,
        "inputs.0.name": "in0",
    }
    assert set(measured["present"]) == {*paths, "parameters.nested"}


@pytest.mark.parametrize(
    ("body", "is_json", "is_inference"),
    [
        (b"not json", False, False),
        (b"[1, 2]", False, False),
        (b'{"inputs": []}', True, False),
        (b'{"inputs": [{"shape": []}]}', True, False),
        (b'{"inputs": [{"shape": [-1]}]}', True, False),
        (b'{"inputs": [{"shape": [true]}]}', True, False),
        (b"\xff\xfe", False, False),
    ],
)
def test_measure_never_raises_on_a_malformed_body(
    body: bytes, is_json: bool, is_inference: bool
) -> None:
    measured = measure_body(body, ("a.b",))
    assert (measured["json"], measured["inference"]) == (is_json, is_inference)
    assert "rows" not in measured


def test_measure_parses_only_the_json_header_of_a_binary_request() -> None:
    header = _body({"inputs": [{"shape": [2, 8]}]})
    measured = measure_body(header + b"\x00\x01" * 16, (), json_length=len(header))
    assert (measured["rows"], measured["input_bytes"]) == (2, len(header) + 32)
    assert measure_bodyless("POST") == {
        "input_bytes": 0,
        "json": False,
        "inference": False,
        "reason": "the request body is empty",
    }
    assert parse_field_paths('["a", 3, "b"]') == ("a", "b")
    assert parse_field_paths("not json") == ()


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        (("prefix", "/v2/health"), ("prefix", "/v2/models/demo"), False),
        (("prefix", "/v2/"), ("prefix", "/v2/models/demo"), True),
        (("exact", "/v2/models/demo/infer"), ("prefix", "/v2/models/"), True),
        (("exact", "/a"), ("exact", "/b"), False),
        (("regex", "/x.*"), ("prefix", "/y"), True),
    ],
)
def test_only_routes_that_cannot_share_a_request_skip_the_router(
    a: tuple[str, str], b: tuple[str, str], shared: bool
) -> None:
    first, second = PathMatchIR(*a), PathMatchIR(*b)  # type: ignore[arg-type]
    assert may_share_requests(first, second) is shared
    assert may_share_requests(second, first) is shared


@pytest.mark.parametrize(
    ("body", "json_length", "reason"),
    [
        (b"", None, "the request body is empty"),
        (
            b"{not json",
            None,
            "the body is not JSON: unexpected character, expected a string key at line 1 column 2",
        ),
        (
            b'{"a": 1}\n\n  x',
            None,
            "the body is not JSON: unexpected content after document at line 3 column 3",
        ),
        (b"null", None, "the request body is JSON but not an object (null)"),
        (b'"text"', None, "the request body is JSON but not an object (a string)"),
        (b"{}", None, "the JSON body has no 'inputs' (an inference request's inputs[0].shape)"),
        (b'{"inputs": {}}', None, "'inputs' is an object, not a list of inputs"),
        (b'{"inputs": []}', None, "'inputs' is an empty list"),
        (b'{"inputs": [3]}', None, "inputs[0] is a number, not an object"),
        (b'{"inputs": [{"shape": "2"}]}', None, "inputs[0].shape is a string, not a list"),
        (b'{"inputs": [{"shape": []}]}', None, "inputs[0].shape is an empty list"),
        (
            b'{"inputs": [{"shape": [true]}]}',
            None,
            "inputs[0].shape[0] is a boolean, not a whole number of rows (0 or more)",
        ),
        (
            b'{"inputs": [{"shape": [1.5]}]}',
            None,
            "inputs[0].shape[0] is a number, not a whole number of rows (0 or more)",
        ),
        (
            b'{"inputs"',
            40,
            "Inference-Header-Content-Length is 40 but the body has 9 bytes; "
            "the body is not JSON: unexpected end of data at line 1 column 10",
        ),
        (
            b'{"inputs"\x00\x01',
            9,
            "the JSON header (Inference-Header-Content-Length) is not "
            "JSON: unexpected end of data at line 1 column 10",
        ),
    ],
)
def test_a_malformed_body_is_measured_with_a_located_reason_that_quotes_nothing(
    body: bytes, json_length: int | None, reason: str
) -> None:
    """What an ``on_malformed: reject`` route answers (issue 33, item 9): each kind of bad
    body its own reason, with where; a GET is told apart from an empty POST."""
    measured = measure_body(body, (), json_length=json_length)
    assert measured["reason"] == reason
    assert not measured["inference"]


def test_a_bodyless_get_is_told_apart_from_an_empty_post() -> None:
    assert measure_bodyless("GET")["reason"] == (
        "a GET request has no body: send a POST with a JSON body"
    )
    assert measure_bodyless("POST")["reason"] == "the request body is empty"
    assert measure_bodyless(None)["reason"] == "the request body is empty"
    good = measure_body(b'{"inputs": [{"shape": [2]}]}', ())
    assert "reason" not in good and good["rows"] == 2
