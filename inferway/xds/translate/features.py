"""Feature routing in Envoy: the external processing filter that asks inferway's feature
router about each request body, and the route matchers that read its answer.

Envoy holds the request (headers and the whole body, ``BUFFERED``) while the feature router
measures it; the router answers with dynamic metadata in the ``inferway.features``
namespace (rows, input_bytes, json, inference, fields, present) and clears the route cache, so
Envoy matches the routes again, now with ``dynamic_metadata`` matchers that a client cannot
forge (clients set headers, never metadata). The filter is first in the chain, so access
rules, rate limits and faults see the route the features chose.

A route with ``on_malformed: reject`` gets a twin just before it: same path and headers, the
body measured but not a JSON (inference) request -> 400 with a JSON error whose text ends with
the router's ``reason`` (not JSON at line L column C, an empty body, a GET, the missing part of
``inputs[0].shape``), filled in by Envoy from the request's dynamic metadata. Routes whose path
cannot share a request with any feature route skip the filter (no buffering, no round trip).

If the feature router does not answer (down, or slower than its timeout), Envoy carries on
without features (``failure_mode_allow``): feature routes and their reject twins do not match,
so the request goes to the first route without features, the policy's default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from google.protobuf import struct_pb2

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import (
    base_pb2,
    substitution_format_string_pb2,
)
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.type.matcher.v3 import (
    metadata_pb2,
    number_pb2,
    regex_pb2,
    string_pb2,
    value_pb2,
)
from inferway._xds_protos.envoy.type.v3 import range_pb2
from inferway.resolve.ir.features import FeatureRouterIR, FeaturesIR, FieldMatchIR, RangeIR
from inferway.resolve.ir.route import PathMatchIR, RouteIR
from inferway.xds.translate._protos import pack
from inferway.xds.translate.ext_proc_request import request_body_processor
from inferway.xds.translate.inline_cluster import build_inline_http2_cluster

__all__ = [
    "EXT_PROC_FILTER",
    "FEATURES_NAMESPACE",
    "FEATURE_ROUTER_CLUSTER",
    "FIELDS_METADATA_KEY",
    "KEY_FIELDS",
    "KEY_INFERENCE",
    "KEY_INPUT_BYTES",
    "KEY_JSON",
    "KEY_PRESENT",
    "KEY_REASON",
    "KEY_ROWS",
    "MALFORMED_SUFFIX",
    "build_feature_matchers",
    "build_feature_router_cluster",
    "build_feature_router_filter",
    "build_malformed_route",
    "disable_feature_router",
    "may_share_requests",
]

EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
FEATURE_ROUTER_CLUSTER = "inferway_feature_router"
FEATURES_NAMESPACE = "inferway.features"
FIELDS_METADATA_KEY = "x-inferway-fields"
"""gRPC metadata on every stream to the router: the JSON list of field paths to extract."""
KEY_ROWS, KEY_INPUT_BYTES = "rows", "input_bytes"
KEY_FIELDS = "fields"
"""Scalar field values (string, number, boolean) by dotted path."""
KEY_PRESENT = "present"
"""``true`` by dotted path for every field that exists, whatever its value."""
KEY_JSON = "json"
"""True when the body is a JSON object."""
KEY_INFERENCE = "inference"
"""True when it is also an inference request: ``inputs[0].shape[0]`` is a whole number."""
KEY_REASON = "reason"
"""Why the body is not JSON / not an inference request, with where; the reject twin's answer."""
MALFORMED_SUFFIX = "_malformed"
"""The reject twin's name: ``<route>_malformed`` (``_`` is never in a policy name)."""


def build_feature_router_filter(router: FeatureRouterIR) -> hcm_pb2.HttpFilter:
    config = request_body_processor(
        FEATURE_ROUTER_CLUSTER,
        FEATURES_NAMESPACE,
        router.timeout,
        fail_open=True,
        metadata=(FIELDS_METADATA_KEY, json.dumps(router.fields)),
    )
    return hcm_pb2.HttpFilter(name=EXT_PROC_FILTER, typed_config=pack(config))


def build_feature_router_cluster(router: FeatureRouterIR) -> cluster_pb2.Cluster:
    return build_inline_http2_cluster(FEATURE_ROUTER_CLUSTER, router.host, router.port, 1.0)


def _metadata(
    path: Sequence[str], value: value_pb2.ValueMatcher, *, invert: bool = False
) -> metadata_pb2.MetadataMatcher:
    return metadata_pb2.MetadataMatcher(
        filter=FEATURES_NAMESPACE,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key=k) for k in path],
        value=value,
        invert=invert,
    )


def _range(bounds: RangeIR) -> value_pb2.ValueMatcher:
    """Inclusive bounds as Envoy's half-open [start, end)."""
    start = -math.inf if bounds.min is None else bounds.min
    end = math.inf if bounds.max is None else math.nextafter(bounds.max, math.inf)
    return value_pb2.ValueMatcher(
        double_match=number_pb2.DoubleMatcher(range=range_pb2.DoubleRange(start=start, end=end))
    )


def _field(field: FieldMatchIR) -> metadata_pb2.MetadataMatcher:
    if field.present is not None:  # any value counts, null/object/list too: `present` has them
        present = (KEY_PRESENT, field.path)
        return _metadata(
            present, value_pb2.ValueMatcher(present_match=True), invert=not field.present
        )
    path = (KEY_FIELDS, field.path)  # scalar values only
    if field.range is not None:
        return _metadata(path, _range(field.range))
    if field.regex is not None:
        regex = regex_pb2.RegexMatcher(regex=field.regex)
        return _metadata(
            path, value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(safe_regex=regex))
        )
    exact = field.exact
    if isinstance(exact, bool):
        return _metadata(path, value_pb2.ValueMatcher(bool_match=exact))
    if isinstance(exact, int | float):
        return _metadata(
            path, value_pb2.ValueMatcher(double_match=number_pb2.DoubleMatcher(exact=exact))
        )
    assert isinstance(exact, str)
    return _metadata(
        path, value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=exact))
    )


def _well_formed_key(features: FeaturesIR) -> str:
    return KEY_INFERENCE if features.needs_inference_request else KEY_JSON


def build_feature_matchers(features: FeaturesIR) -> list[metadata_pb2.MetadataMatcher]:
    """Every feature as a metadata matcher, plus "the body is well formed" (so a body that
    is not JSON never matches, whatever ``on_malformed`` says: reject has its own route)."""
    matchers = [_metadata((_well_formed_key(features),), value_pb2.ValueMatcher(bool_match=True))]
    if features.rows is not None:
        matchers.append(_metadata((KEY_ROWS,), _range(features.rows)))
    if features.input_bytes is not None:
        matchers.append(_metadata((KEY_INPUT_BYTES,), _range(features.input_bytes)))
    matchers.extend(_field(f) for f in features.fields)
    return matchers


def build_malformed_route(route: RouteIR, match: rc_pb2.RouteMatch) -> rc_pb2.Route:
    """The reject twin of ``route``: ``match`` (its path, headers and cookies) and a body the
    router measured as not well formed -> 400 with a JSON error naming the route."""
    assert route.match.features is not None
    features = route.match.features
    twin = rc_pb2.RouteMatch()
    twin.CopyFrom(match)
    del twin.dynamic_metadata[:]
    twin.dynamic_metadata.append(
        _metadata((_well_formed_key(features),), value_pb2.ValueMatcher(bool_match=False))
    )
    expected = "a JSON inference request (inputs[0].shape)" if features.rows else "JSON"
    # the router's reason (what is wrong, and where) filled in by Envoy per request
    reason = f"%DYNAMIC_METADATA({FEATURES_NAMESPACE}:{KEY_REASON})%"
    body = struct_pb2.Struct()
    body.update({"error": f"request body is not {expected}: {reason}", "route": route.name})
    return rc_pb2.Route(
        name=f"{route.name}{MALFORMED_SUFFIX}",
        stat_prefix=f"{route.name}{MALFORMED_SUFFIX}",
        match=twin,
        direct_response=rc_pb2.DirectResponseAction(
            status=400,
            body_format=substitution_format_string_pb2.SubstitutionFormatString(
                json_format=body, content_type="application/json"
            ),
        ),
        response_headers_to_add=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="content-type", value="application/json"),
                append_action=base_pb2.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        ],
    )


def may_share_requests(a: PathMatchIR, b: PathMatchIR) -> bool:
    """Whether one request path could match both (conservative: a regex may match anything)."""
    if a.kind == "regex" or b.kind == "regex":
        return True
    if a.kind == "exact" and b.kind == "exact":
        return a.value == b.value
    if a.kind == "exact":
        return a.value.startswith(b.value)
    if b.kind == "exact":
        return b.value.startswith(a.value)
    return a.value.startswith(b.value) or b.value.startswith(a.value)


def disable_feature_router(proto: rc_pb2.Route) -> None:
    """Envoy picks the per-route filter config from the route matched *before* the router
    ran, so only a route no feature route can share a request with may skip it."""
    proto.typed_per_filter_config[EXT_PROC_FILTER].CopyFrom(
        pack(ext_proc_pb2.ExtProcPerRoute(disabled=True))
    )
