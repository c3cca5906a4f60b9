"""inferway's own log lines follow the live policy's ``redact_headers`` and ``mask``."""

from __future__ import annotations

import logging

from inferway.gateway.control_plane import AppliedPolicy, PolicyFollower
from inferway.gateway.mask_sink import build_masker
from inferway.observability.redaction import install_redaction

__all__ = ["LogRedaction"]


class LogRedaction(PolicyFollower):
    """Keeps inferway's own log filter in step with the live policy: its ``redact_headers``
    and its ``mask`` rules stay out of the gateway's log lines, not only out of Envoy's access
    logs and traces."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger  # None: the root logger, whose handlers configure_logging sets

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        policy = applied.policy
        install_redaction(policy.redact_headers, self.logger, build_masker(policy.mask))
