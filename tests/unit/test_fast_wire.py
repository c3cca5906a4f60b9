"""The fast HTTP front end's pure pieces: which requests it serves itself, where a request's
head ends, and the bytes of its answers (protocol/fast_wire.py)."""

from __future__ import annotations

import json

import pytest

from inferway.backends.protocol.fast_wire import (
    FastCall,
    RepeatedHead,
    RouteMemo,
    error_body,
    head_end,
    hot_route,
    repeatable_head,
    response_bytes,
    retry_after_value,
    take_repeats,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (b"/v2/models/mlp/infer", ("mlp", None)),
        (b"/v2/models/mlp/versions/3/infer", ("mlp", "3")),
        (b"/v2/models/mlp/infer?x=1", ("mlp", None)),
        (b"/v2/models/stats/infer", ("stats", None)),  # aiohttp routes it to infer too
        (b"/v2/models/mlp", None),
        (b"/v2/models/mlp/ready", None),
        (b"/v2/models//infer", None),
        (b"/v2/models/a/b/infer", None),
        (b"/v2/models/a/versions//infer", None),
        (b"/v2/models/a/other/3/infer", None),
        (b"/v2/models/m%20x/infer", None),  # percent-encoded: aiohttp decodes it
        (b"//v2/models/mlp/infer", None),
        (b"/v2/repository/models/mlp/load", None),
    ],
)
def test_hot_route_takes_only_the_infer_paths(url: bytes, expected: object) -> None:
    assert hot_route(url) == expected


def test_route_memo_answers_as_hot_route_and_stays_bounded() -> None:
    memo = RouteMemo(capacity=3)
    for _ in range(2):
        assert memo(b"/v2/models/mlp/infer") == ("mlp", None)
        assert memo(b"/v2/models/mlp/ready") is None
    assert len(memo) == 2
    for i in range(10):
        assert memo(b"/v2/models/m%d/infer" % i) == (f"m{i}", None)
        assert len(memo) <= 3


def test_take_repeats_takes_only_whole_requests_with_the_same_head_bytes() -> None:
    head = RepeatedHead(
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 3\r\n\r\n", 3, ("m", None), {}, False
    )
    one, two = head.data + b"abc", head.data + b"xyz"
    assert take_repeats(one + two, head) == ([b"abc", b"xyz"], len(one) * 2)
    assert take_repeats(one + two[:-1], head) == ([b"abc"], len(one))  # the second not all there
    other = one.replace(b"HTTP/1.1", b"HTTP/1.0")
    assert take_repeats(other + one, head) == ([], 0)  # another head first: all the parser's
    assert take_repeats(one + other + two, head) == ([b"abc"], len(one))
    assert take_repeats(b"", head) == ([], 0)


def test_only_heads_that_can_repeat_are_kept() -> None:
    head = b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 3\r\n\r\n"
    raw = bytearray(head + b"abc")
    kept = repeatable_head(raw, len(head), b"abc", ("m", None), {"content-length": "3"}, False)
    assert kept is not None and kept.data == head and kept.body_size == 3 and kept.keep_alive
    close = repeatable_head(
        raw, len(head), b"abc", ("m", None), {"content-length": "3"}, False, keep_alive=False
    )
    assert close is not None and not close.keep_alive  # a close head repeats on new connections
    for headers in (
        {"content-length": "03"},  # not the body's length as written: left to the parser
        {"content-length": "3", "x-request-id": "r-1"},
        {"content-length": "3", "traceparent": "00-ab-cd-01"},
    ):
        assert repeatable_head(raw, len(head), b"abc", ("m", None), headers, False) is None


def test_head_end_finds_the_blank_line_after_optional_leading_empty_lines() -> None:
    head = b"POST /x HTTP/1.1\r\nA: b\r\n\r\n"
    assert head_end(head + b"body") == len(head)
    assert head_end(b"\r\n\r\n" + head) == len(head) + 4
    assert head_end(b"POST /x HTTP/1.1\r\nA: b\r\n") == -1


def test_retry_after_rounds_up_to_whole_seconds() -> None:
    assert [retry_after_value(s) for s in (0.01, 1.0, 1.2, 7.9)] == ["1", "1", "2", "8"]


def test_error_body_is_the_json_aiohttp_writes() -> None:
    assert error_body('no "x"') == json.dumps({"error": 'no "x"'}).encode()


def test_response_bytes_frame_the_body_and_say_when_the_connection_closes() -> None:
    raw = response_bytes(429, b"application/json", b"{}", [("Retry-After", "2")], keep_alive=False)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 429 Too Many Requests"
    fields = dict(line.split(b": ", 1) for line in lines[1:])
    assert fields[b"Content-Length"] == b"2" and body == b"{}"
    assert fields[b"Retry-After"] == b"2" and fields[b"Connection"] == b"close"
    assert fields[b"Date"].endswith(b" GMT")
    kept = response_bytes(200, b"application/json", b"", [], keep_alive=True, http10=True)
    assert b"Connection: keep-alive\r\n" in kept
    assert b"Connection" not in response_bytes(200, b"x", b"", [], keep_alive=True)


def test_only_the_json_part_is_searched_for_a_timeout_parameter() -> None:
    head = (
        b'{"inputs":[{"name":"x","datatype":"BYTES","shape":[1],'
        b'"parameters":{"binary_data_size":9}}]}'
    )
    tensor = b'"timeout"'  # tensor bytes that happen to spell it
    binary = {"inference-header-content-length": str(len(head))}
    assert not FastCall("m", None, binary, head + tensor).may_name_timeout()
    with_timeout = head.replace(b'"inputs"', b'"parameters":{"timeout":2},"inputs"')
    assert FastCall("m", None, {}, with_timeout).may_name_timeout()
    binary = {"inference-header-content-length": str(len(with_timeout))}
    assert FastCall("m", None, binary, with_timeout + b"\0" * 8).may_name_timeout()
    assert not FastCall("m", None, {}, head).may_name_timeout()
