"""The marked YAML reader: same data as yaml.safe_load, plus a position for every path."""

from __future__ import annotations

import pytest
import yaml

from inferway.policies.yaml_marks import (
    Mark,
    YamlSyntaxError,
    format_loc,
    load_marked_yaml,
)

TEXT = """\
a:
  - x: 1
    y: [2, 3]
  - "text"
b: {c: true}
"""


def test_data_matches_safe_load() -> None:
    assert load_marked_yaml(TEXT).data == yaml.safe_load(TEXT)


def test_every_path_has_key_and_value_marks() -> None:
    marks = load_marked_yaml(TEXT).marks
    assert marks[("a",)].key == Mark(1, 1)
    assert marks[("a", 0)].value == Mark(2, 5)
    assert marks[("a", 0, "y")].key == Mark(3, 5)
    assert marks[("a", 0, "y", 1)].value == Mark(3, 12)
    assert marks[("b", "c")].value == Mark(5, 8)


def test_position_prefers_the_value_of_inline_nodes_and_the_key_of_blocks() -> None:
    doc = load_marked_yaml(TEXT)
    assert doc.position(("a", 0, "x")) == Mark(2, 8)  # scalar: the value
    assert doc.position(("a", 0, "y")) == Mark(3, 8)  # flow list: the value
    assert doc.position(("a",)) == Mark(1, 1)  # block list: its key
    assert doc.position(("a", 0, "x"), at_key=True) == Mark(2, 5)


def test_position_of_a_missing_path_is_its_deepest_existing_parent() -> None:
    doc = load_marked_yaml(TEXT)
    assert doc.position(("a", 0, "nope", 3)) == Mark(2, 5)
    assert doc.existing_prefix(("a", 0, "nope", 3)) == ("a", 0)


def test_keys_are_literal_text() -> None:
    assert load_marked_yaml("on: 1\nyes: 2\n1: 3\n").data == {"on": 1, "yes": 2, "1": 3}


def test_duplicate_keys_are_recorded_at_the_second_key() -> None:
    doc = load_marked_yaml("a: 1\nb: 2\na: 3\n")
    [issue] = doc.issues
    assert issue.loc == ("a",) and issue.mark == Mark(3, 1)
    assert "first at line 1" in issue.message


def test_syntax_error_carries_its_mark() -> None:
    with pytest.raises(YamlSyntaxError) as caught:
        load_marked_yaml("a: [1, 2\nb: 3\n")
    assert caught.value.mark.line >= 1
    assert caught.value.message.startswith("invalid YAML:")


def test_alias_bomb_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 8):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    with pytest.raises(YamlSyntaxError, match="too large"):
        load_marked_yaml("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("loc", "text"),
    [((), ""), (("a",), "a"), (("a", 0, "b", 12), "a[0].b[12]"), ((3,), "[3]")],
)
def test_format_loc(loc: tuple[str | int, ...], text: str) -> None:
    assert format_loc(loc) == text
