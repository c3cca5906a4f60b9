"""inferway's own log lines follow the live policy's ``redact_headers``."""

from __future__ import annotations

import logging

from inferway.gateway.control_plane import AppliedPolicy
from inferway.observability.redaction import install_redaction

__all__ = ["LogRedaction"]


class LogRedaction:
    """Keeps inferway's own log filter in step with the live policy: its ``redact_headers``
    stay out of the gateway's log lines, not only out of Envoy's access logs and traces."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger  # None: the root logger, whose handlers configure_logging sets

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        install_redaction(applied.policy.redact_headers, self.logger)
