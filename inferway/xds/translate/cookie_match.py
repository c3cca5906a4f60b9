"""Matching a route on a cookie. Envoy's route match has no cookie matcher, so a cookie
becomes a regex on the ``cookie`` header: the name at the start of the header or after a
``;``, then ``=`` and the exact value up to the next ``;`` or the end."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.type.matcher.v3 import regex_pb2, string_pb2
from inferway.resolve.ir.route_traffic import CookieMatchIR

__all__ = ["build_cookie_matcher", "cookie_pattern"]


def _escape(text: str) -> str:
    """RE2 takes a backslash before any punctuation as that character itself."""
    return "".join(c if c.isalnum() or c == "_" else "\\" + c for c in text)


def cookie_pattern(cookie: CookieMatchIR) -> str:
    """The RE2 pattern the whole ``cookie`` header value must match."""
    start = rf".*(?:^|;\s*){_escape(cookie.name)}="
    if cookie.present is not None:
        return start + ".*"
    assert cookie.exact is not None  # CookieMatchIR holds exactly one
    return start + rf"{_escape(cookie.exact)}(?:;.*)?"


def build_cookie_matcher(cookie: CookieMatchIR) -> rc_pb2.HeaderMatcher:
    """``present: false`` matches a request without that cookie (an inverted match; a request
    with no ``cookie`` header at all is matched as one with an empty header)."""
    return rc_pb2.HeaderMatcher(
        name="cookie",
        string_match=string_pb2.StringMatcher(
            safe_regex=regex_pb2.RegexMatcher(regex=cookie_pattern(cookie))
        ),
        invert_match=cookie.present is False,
        treat_missing_header_as_empty=True,
    )
