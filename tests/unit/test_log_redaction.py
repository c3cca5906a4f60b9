"""The gateway's own log follows the live policy's ``redact_headers``: a header the policy
names is scrubbed from inferway's log lines from the first apply on, and a later edit's list
replaces it."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.log_redaction import LogRedaction
from inferway.observability.redaction import REDACTED, RedactingFilter
from inferway.policies import load_policy_text
from inferway.xds.cache import SnapshotCache

POLICY = """\
version: 1
listeners: [{name: main, port: 10000}]
services: [{name: v1, endpoints: ["127.0.0.1:8081"]}]
routes: [{name: all, backends: [{service: v1}]}]
"""


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())  # what configure_logging installs: built-ins only
    logger = logging.getLogger("inferway.test_log_redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)


def test_policy_redact_headers_are_scrubbed_from_gateway_logs(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    plane = ControlPlane(SnapshotCache())
    plane.add_observer(LogRedaction(logger))
    plane.apply_policy(load_policy_text(POLICY + "redact_headers: [x-tenant-token]\n", "p"), "p")
    logger.warning("upstream said: x-tenant-token: t0k-1")
    assert "t0k-1" not in stream.getvalue() and REDACTED in stream.getvalue()

    plane.apply_policy(load_policy_text(POLICY + "redact_headers: [x-other]\n", "p"), "p")
    logger.warning("x-tenant-token: t0k-2 x-other: s3cret")
    assert "s3cret" not in stream.getvalue()
    assert "t0k-2" in stream.getvalue()  # no longer in the policy's list
    assert len(logger.handlers[0].filters) == 1  # updated in place, not stacked
