"""Malformed HTTP from a client is the client's error, not the server's: aiohttp answers it 400
(as it should) but logs it at ERROR with a traceback, so a scanner or a broken client fills the
log with tracebacks that look like server faults. This filter turns those records into one
WARNING line naming the client and the reason."""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["install_bad_http_filter"]

_LOGGER = "aiohttp.server"


class _BadHttpFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            reason = " ".join(str(exc.message).split()) or type(exc).__name__
            said = record.getMessage()
            record.msg = "%s; answered %s: %s"
            record.args = (said, exc.code, reason[:300])
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def install_bad_http_filter() -> None:
    """Once per process: aiohttp's server logger gets the filter (idempotent)."""
    logger = logging.getLogger(_LOGGER)
    if not any(isinstance(f, _BadHttpFilter) for f in logger.filters):
        logger.addFilter(_BadHttpFilter())
