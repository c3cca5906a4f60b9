"""Duration and host:port parsing: the two value formats users write by hand most."""

from __future__ import annotations

import pytest

from inferway.policies import Endpoint, parse_duration, split_host_port


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("2s", 2.0),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        (" 10s ", 10.0),
        (3, 3.0),
        (0.5, 0.5),
    ],
)
def test_duration_accepts_units_and_plain_seconds(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["2 seconds", "-1s", "1d", "ms", "", "1.s"])
def test_duration_rejects_unknown_forms_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration such as '250ms'"):
        parse_duration(text)


def test_duration_rejects_booleans() -> None:
    with pytest.raises(ValueError, match="not a boolean"):
        parse_duration(True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8081", ("127.0.0.1", 8081)),
        ("[::1]:80", ("::1", 80)),
        ("[fe80::1%eth0]:9000", ("fe80::1%eth0", 9000)),
        ("model.internal:443", ("model.internal", 443)),
        (" localhost:1 ", ("localhost", 1)),
    ],
)
def test_host_port_splits_ipv4_ipv6_and_names(text: str, expected: tuple[str, int]) -> None:
    assert split_host_port(text) == expected


@pytest.mark.parametrize("text", ["127.0.0.1", "[::1]", "::1", ":80", "host:", "host:http", 80])
def test_host_port_rejects_incomplete_addresses(text: object) -> None:
    with pytest.raises(ValueError, match="host:port"):
        split_host_port(text)


def test_endpoint_accepts_the_short_string_form() -> None:
    assert Endpoint.model_validate("[::1]:8082") == Endpoint(host="::1", port=8082)
