"""Text that ``str.isdigit`` calls digits but ``int`` refuses ("²", a latin-1 superscript) is
not a number anywhere a number is parsed: each place answers as it does for any other
non-number, instead of raising ``int``'s ValueError from inside a check that passed."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.backends.models.scan import scan_repository
from inferway.backends.protocol.fast_wire import FastCall
from inferway.gateway.features import measure
from inferway.gateway.features.server import _json_length
from inferway.observability.folded_stacks import parse_folded
from inferway.observability.masking import _replace_path
from inferway.policies.types import split_host_port
from inferway.tools.optimize.pipeline import _next_version
from inferway.tools.verify.cases import _set
from inferway.tools.verify.features import field_value

SUPERSCRIPT_TWO = "\u00b2"


def test_the_premise():
    assert SUPERSCRIPT_TWO.isdigit()
    with pytest.raises(ValueError):
        int(SUPERSCRIPT_TWO)


def test_a_binary_header_length_of_it_is_read_as_no_length():
    body = b'{"parameters": {"timeout": 1}}'
    call = FastCall("m", None, {"inference-header-content-length": SUPERSCRIPT_TWO}, body)
    assert call.may_name_timeout()  # the whole body is searched, as for any bad length


def test_a_port_of_it_is_refused_with_the_usual_message():
    with pytest.raises(ValueError, match="expected 'host:port'"):
        split_host_port(f"10.0.0.1:{SUPERSCRIPT_TWO}")


def test_a_version_directory_named_it_is_not_a_version(tmp_path: Path):
    (tmp_path / "m" / SUPERSCRIPT_TWO).mkdir(parents=True)
    (tmp_path / "m" / SUPERSCRIPT_TWO / "model.onnx").write_bytes(b"")
    assert scan_repository(tmp_path) == {}


def test_a_path_segment_of_it_indexes_no_list():
    document = {"inputs": [{"name": "x"}]}
    assert field_value(document, f"inputs.{SUPERSCRIPT_TWO}") == (False, None)
    assert field_value(document, "inputs.0.name") == (True, "x")
    assert measure._lookup(document, f"inputs.{SUPERSCRIPT_TWO}") is measure._MISSING
    _set(document, f"inputs.{SUPERSCRIPT_TWO}", 1)
    _replace_path(document, ("inputs", SUPERSCRIPT_TWO), "***")
    assert document == {"inputs": [{"name": "x"}]}


def test_a_count_of_it_is_a_malformed_folded_line():
    with pytest.raises(ValueError, match="line 1: expected"):
        parse_folded(f"a;b {SUPERSCRIPT_TWO}\n")


def test_a_content_length_of_it_is_no_length():
    assert _json_length(SUPERSCRIPT_TWO) is None
    assert _json_length(" 12 ") == 12


def test_optimize_numbers_its_next_version_past_a_directory_named_it(tmp_path: Path):
    for name in ("1", "3", SUPERSCRIPT_TWO):
        (tmp_path / name).mkdir()
    assert _next_version(tmp_path) == "4"
