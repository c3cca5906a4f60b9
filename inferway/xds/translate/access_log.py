"""Structured JSON access logs from Envoy: one line per request, joinable with its trace.

Every line carries the request id (x-request-id, also a span tag and a backend span attribute)
and the trace id, so a log line leads straight to its trace. The format never reads
credential headers (Authorization, cookies, API keys); the policy schema and checks refuse
extra fields that would. Paths are logged without their query string, which can carry keys.
"""

from __future__ import annotations

from google.protobuf import struct_pb2

from inferway._xds_protos.envoy.config.accesslog.v3 import accesslog_pb2
from inferway._xds_protos.envoy.config.core.v3 import extension_pb2
from inferway._xds_protos.envoy.config.core.v3 import substitution_format_string_pb2 as sfs_pb2
from inferway._xds_protos.envoy.extensions.access_loggers.file.v3 import file_pb2
from inferway._xds_protos.envoy.extensions.access_loggers.stream.v3 import stream_pb2
from inferway._xds_protos.envoy.extensions.formatter.req_without_query.v3 import (
    req_without_query_pb2,
)
from inferway.resolve.ir.observability import AccessLogIR
from inferway.xds.translate._protos import pack

__all__ = [
    "ACCESS_LOG_FIELDS",
    "FILE_ACCESS_LOGGER",
    "STDERR_ACCESS_LOGGER",
    "STDOUT_ACCESS_LOGGER",
    "build_access_log",
    "build_access_log_format",
]

FILE_ACCESS_LOGGER = "envoy.access_loggers.file"
STDOUT_ACCESS_LOGGER = "envoy.access_loggers.stdout"
STDERR_ACCESS_LOGGER = "envoy.access_loggers.stderr"

ACCESS_LOG_FIELDS: dict[str, str] = {
    "start_time": "%START_TIME(%Y-%m-%dT%H:%M:%S.%3fZ)%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "trace_id": "%TRACE_ID%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ_WITHOUT_QUERY(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "protocol": "%PROTOCOL%",
    "route": "%ROUTE_NAME%",
    "upstream_cluster": "%UPSTREAM_CLUSTER%",
    "upstream_host": "%UPSTREAM_HOST%",
    "response_code": "%RESPONSE_CODE%",
    "response_flags": "%RESPONSE_FLAGS%",
    "duration_ms": "%DURATION%",
    "upstream_service_time_ms": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
}
"""The JSON keys of every line and the Envoy command operators that fill them."""


def build_access_log_format(access_log: AccessLogIR) -> sfs_pb2.SubstitutionFormatString:
    """The JSON line format: :data:`ACCESS_LOG_FIELDS` plus the policy's extra fields
    (which may not replace the standard ones)."""
    fields = {**{f.name: f.format for f in access_log.extra_fields}, **ACCESS_LOG_FIELDS}
    body = struct_pb2.Struct()
    for key in sorted(fields):
        body.fields[key].string_value = fields[key]
    return sfs_pb2.SubstitutionFormatString(
        json_format=body,
        formatters=[
            extension_pb2.TypedExtensionConfig(
                name="envoy.formatter.req_without_query",
                typed_config=pack(req_without_query_pb2.ReqWithoutQuery()),
            )
        ],
    )


def build_access_log(access_log: AccessLogIR) -> accesslog_pb2.AccessLog:
    """An HCM access logger writing JSON lines to stdout, stderr or a file."""
    log_format = build_access_log_format(access_log)
    if access_log.path == "stdout":
        return accesslog_pb2.AccessLog(
            name=STDOUT_ACCESS_LOGGER,
            typed_config=pack(stream_pb2.StdoutAccessLog(log_format=log_format)),
        )
    if access_log.path == "stderr":
        return accesslog_pb2.AccessLog(
            name=STDERR_ACCESS_LOGGER,
            typed_config=pack(stream_pb2.StderrAccessLog(log_format=log_format)),
        )
    return accesslog_pb2.AccessLog(
        name=FILE_ACCESS_LOGGER,
        typed_config=pack(file_pb2.FileAccessLog(path=access_log.path, log_format=log_format)),
    )
