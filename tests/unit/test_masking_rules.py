"""Masking, the pure parts: the policy's ``mask`` with located errors, the built-in patterns
(what they catch and what they must leave alone: timestamps, request and trace ids,
addresses), JSON field masking, inferway's own log lines, and the mask sink's line format."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from opentelemetry.proto.common.v1 import common_pb2

from inferway.gateway.mask_sink import build_masker, line_of
from inferway.observability.masking import BUILTIN_PATTERNS, Masker
from inferway.observability.redaction import install_redaction
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.dump import dump_policy
from inferway.policies.masking import Mask

_HEAD = (
    "listeners: [{name: l, port: 10000}]\n"
    "services: [{name: s, endpoints: ['127.0.0.1:1']}]\n"
    "routes: [{name: r, backends: [{service: s}]}]\n"
    "mask:\n"
)
BUILTINS = Masker(patterns=BUILTIN_PATTERNS.values())


@pytest.mark.parametrize(
    ("mask", "line", "expected"),
    [
        ("  patterns: ['tr(ue']\n", 5, "invalid regex 'tr(ue'"),
        ("  fields: ['a..b']\n", 5, "dotted keys such as"),
        ("  builtins: [passport]\n", 5, "'email', 'phone' or 'id_number'"),
        ("  replacement: ''\n", 5, "must not be empty"),
        ("  sink: {port: 10000}\n", 5, "the mask sink's port 10000 is listener 'l'"),
    ],
)
def test_bad_mask_settings_are_located(mask: str, line: int, expected: str) -> None:
    with pytest.raises(PolicyError, match=rf":{line}:.*{re.escape(expected)}"):
        load_policy_text(_HEAD + mask, "policy.yaml")


def test_mask_writes_back_unchanged_and_defaults_to_every_builtin() -> None:
    policy = load_policy_text(_HEAD + "  fields: [parameters.email]\n", "policy.yaml")
    assert policy.mask is not None and policy.mask.builtins == ["email", "phone", "id_number"]
    assert load_policy_text(dump_policy(policy), "dumped.yaml") == policy


@pytest.mark.parametrize(
    "clear",
    [
        "alice.smith@example.co.uk",
        "bob+tag@mail.example.com",
        "+44 20 7946 0958",
        "+1 415-555-0100",
        "+14155550100",
        "(555) 123-4567",
        "555-123-4567",
        "123-45-6789",
        "11010519491231002X",
        "4111 1111 1111 1111",
        "4111-1111-1111-1111",
    ],
)
def test_builtins_mask_emails_phones_and_id_numbers(clear: str) -> None:
    assert BUILTINS.text(f"before {clear} after") == "before [MASKED] after"


@pytest.mark.parametrize(
    "kept",
    [
        "2026-12-01T10:42:37.123Z",
        "3f2a1b4c-1234-5678-9abc-def012345678",
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "127.0.0.1:8001",
        "/v2/models/demo/versions/2/infer",
        "duration 1234 ms, 56789 bytes",
    ],
)
def test_builtins_leave_timestamps_ids_and_addresses_alone(kept: str) -> None:
    assert BUILTINS.text(kept) == kept


def test_fields_are_masked_by_path_and_strings_by_pattern() -> None:
    masker = build_masker(
        Mask(fields=["parameters.secret", "inputs.0.data"], patterns=["ACC-[0-9]{6}"])
    )
    document = {
        "inputs": [{"name": "x", "data": [1, 2, 3]}, {"name": "y", "data": [4]}],
        "parameters": {"secret": {"deep": 1}, "note": "ACC-123456 from eve@example.org"},
    }
    masked = masker.document(document)
    assert masked["inputs"][0]["data"] == "[MASKED]" and masked["inputs"][1]["data"] == [4]
    assert masked["parameters"] == {"secret": "[MASKED]", "note": "[MASKED] from [MASKED]"}
    assert document["inputs"][0]["data"] == [1, 2, 3], "the input is not changed"
    as_text = masker.text(json.dumps(document))
    assert "ACC-123456" not in as_text and json.loads(as_text)["parameters"]["secret"] == "[MASKED]"
    assert masker.text("not json ACC-654321 {") == "not json [MASKED] {"
    assert build_masker(None).text("alice@example.com") == "alice@example.com"


def test_inferways_own_log_lines_are_masked() -> None:
    logger = logging.getLogger("inferway.test.masking")
    logger.propagate = False
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Keep()
    logger.addHandler(handler)
    try:
        install_redaction(logger=logger, masker=build_masker(Mask(patterns=["ACC-[0-9]{6}"])))
        logger.warning("refused %s for %s", "ACC-123456", "carol@example.com")
        try:
            raise ValueError("bad input from dave@example.com")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    text = "\n".join(records)
    assert "refused [MASKED] for [MASKED]" in text
    assert "ACC-123456" not in text and "@example.com" not in text


def test_the_sink_writes_json_lines_with_numbers_and_masked_values() -> None:
    body = common_pb2.AnyValue(
        kvlist_value=common_pb2.KeyValueList(
            values=[
                common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=v))
                for k, v in (
                    ("path", "/v2/models/alice@example.com/infer"),
                    ("response_code", "200"),
                    ("duration_ms", "12"),
                    ("upstream_service_time_ms", "-"),
                )
            ]
        )
    )
    line = json.loads(line_of(body, BUILTINS))
    assert line == {
        "path": "/v2/models/[MASKED]/infer",
        "response_code": 200,
        "duration_ms": 12,
        "upstream_service_time_ms": "-",
    }


def test_recorded_text_outputs_are_masked_before_they_are_hashed() -> None:
    import numpy as np

    from inferway.backends.telemetry.output_digest import OutputRecorder

    def digest(recorder: OutputRecorder, text: str) -> str | None:
        recorder.record("id", "m", "1", [("out", np.array([text.encode()], dtype=object), None)])
        records, _ = recorder.since(0)
        return records[-1].outputs[0].text_hash

    masked = OutputRecorder(10, masker=Masker(patterns=BUILTIN_PATTERNS.values()))
    plain = OutputRecorder(10)
    alice, bob = "reply to alice@example.com", "reply to bob@example.org"
    assert digest(masked, alice) == digest(masked, bob) == digest(masked, "reply to [MASKED]")
    assert digest(plain, alice) != digest(plain, bob)


def test_serve_refuses_a_mask_pattern_re2_cannot_compile(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from inferway.cli.main import app

    result = CliRunner().invoke(app, ["serve", str(tmp_path), "--mask", "tr(ue"])
    assert result.exit_code == 2 and "--mask" in result.output, result.output
