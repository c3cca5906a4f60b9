"""``--log-format``: JSON lines with time, level, logger, message and the call's fields; text
with the fields in brackets; json by default when stderr is not a terminal."""

from __future__ import annotations

import datetime
import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from inferway.backends.serving.failures import classify_error
from inferway.console import configure_logging
from inferway.observability.log_format import (
    JsonFormatter,
    TextFieldsFormatter,
    install_log_handler,
    resolve_log_format,
)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _record(message: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("inferway.test")
    record = logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, message, args or ("world",), None, extra=extra
    )
    return record


@pytest.fixture
def restored_root() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_default_is_json_unless_the_stream_is_a_terminal() -> None:
    assert resolve_log_format(None, io.StringIO()) == "json"
    assert resolve_log_format(None, _Tty()) == "text"
    assert resolve_log_format("JSON", _Tty()) == "json"
    assert resolve_log_format("text", io.StringIO()) == "text"
    with pytest.raises(ValueError, match="unknown log format 'xml': expected one of json, text"):
        resolve_log_format("xml")


def test_a_json_line_has_the_fixed_keys_and_the_calls_fields() -> None:
    record = _record(request_id="req-7", model="demo")
    line = JsonFormatter().format(record)
    document = json.loads(line)
    assert document["level"] == "warning"
    assert document["logger"] == "inferway.test"
    assert document["message"] == "hello world"
    assert document["request_id"] == "req-7" and document["model"] == "demo"
    when = datetime.datetime.fromisoformat(document["time"])
    assert when.utcoffset() == datetime.timedelta(0)
    assert abs(when.timestamp() - record.created) < 0.001
    assert "\n" not in line


def test_a_field_never_overwrites_a_fixed_key_and_odd_values_still_serialize() -> None:
    record = _record(level_hint=object())
    record.__dict__["level"] = "spoofed"
    document = json.loads(JsonFormatter().format(record))
    assert document["level"] == "warning" and document["field_level"] == "spoofed"
    assert document["level_hint"].startswith("<object object")


def test_an_exception_is_one_field_of_the_same_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info()
        )
    line = JsonFormatter().format(record)
    document = json.loads(line)
    assert "RuntimeError: boom" in document["exception"] and "\n" not in line


def test_text_lines_append_the_fields_in_brackets() -> None:
    formatter = TextFieldsFormatter("%(levelname)s %(name)s: %(message)s")
    assert formatter.format(_record(request_id="r1")) == (
        "WARNING inferway.test: hello world [request_id=r1]"
    )
    assert formatter.format(_record()) == "WARNING inferway.test: hello world"


def test_install_log_handler_writes_json_lines_to_its_stream(
    restored_root: logging.Logger,
) -> None:
    stream = io.StringIO()
    install_log_handler(logging.INFO, "json", stream=stream)
    logging.getLogger("inferway.backends.x").info("loaded %s", "demo", extra={"model": "demo"})
    logging.getLogger("inferway.backends.x").debug("not at info")
    (line,) = stream.getvalue().splitlines()
    assert json.loads(line)["message"] == "loaded demo" and json.loads(line)["model"] == "demo"


def test_a_failed_requests_log_line_carries_its_request_id(
    restored_root: logging.Logger,
) -> None:
    stream = io.StringIO()
    install_log_handler(logging.INFO, "json", stream=stream)
    failure = classify_error(RuntimeError("kaput"), request_id="edge-42", model="demo")
    assert failure.http_status == 500
    (line,) = stream.getvalue().splitlines()
    document = json.loads(line)
    assert document["message"] == "inference request failed unexpectedly"
    assert document["request_id"] == "edge-42" and document["model"] == "demo"
    assert "RuntimeError: kaput" in document["exception"]


def test_the_gateway_logs_json_when_asked_and_redacts_it(
    restored_root: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    assert configure_logging("info", "json") == "json"
    logging.getLogger("inferway.gateway.x").warning(
        "refused Authorization: Bearer s3cret", extra={"node_id": "n1"}
    )
    (line,) = capsys.readouterr().err.splitlines()
    document = json.loads(line)
    assert document["node_id"] == "n1" and "s3cret" not in line
    assert document["logger"] == "inferway.gateway.x"
