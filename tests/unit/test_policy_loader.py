"""Loading: positions, messages and the error contract, on small inline documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.policies import PolicyError, PolicyIssue, load_policy, load_policy_text

GOOD = """\
listeners:
  - name: main
    port: 10000
services:
  - name: model
    endpoints: ["127.0.0.1:8081"]
routes:
  - name: all
    backends:
      - service: model
"""


def _issues(text: str) -> list[PolicyIssue]:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    return caught.value.issues


def test_a_good_policy_loads() -> None:
    policy = load_policy_text(GOOD)
    assert policy.routes[0].backends[0].service == "model"


def test_error_string_is_one_line_per_issue_with_file_line_column_path() -> None:
    text = GOOD.replace("port: 10000", "port: 0").replace("service: model", "service: modle")
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    assert str(caught.value).splitlines() == [
        "p.yaml:3:11: listeners[0].port: must be at least 1, got 0",
    ]  # the schema failed, so semantic checks (unknown service) wait for the next pass


def test_semantic_issue_is_located_on_the_offending_value() -> None:
    [issue] = _issues(GOOD.replace("service: model", "service: modle"))
    assert (issue.line, issue.column, issue.path) == (10, 18, "routes[0].backends[0].service")
    assert "did you mean 'model'?" in issue.message


def test_default_source_name_is_string() -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_text("listeners: 3\n")
    assert caught.value.issues[0].file == "<string>"


def test_unknown_key_without_close_match_lists_the_allowed_keys() -> None:
    [issue] = _issues(GOOD.replace("    port: 10000", "    port: 10000\n    colour: red"))
    assert issue.message == "unknown key 'colour'; allowed keys: name, address, port, tls, limits"
    assert (issue.line, issue.column) == (4, 5)


def test_missing_field_points_at_the_parent_mapping() -> None:
    [issue] = _issues(GOOD.replace("    port: 10000\n", ""))
    assert issue.path == "listeners[0].port"
    assert (issue.line, issue.column) == (2, 5)
    assert issue.message == "missing required field 'port'"


def test_literal_error_lists_the_allowed_values() -> None:
    text = GOOD.replace("  - name: model\n", "  - name: model\n    protocol: grpc\n")
    [issue] = _issues(text)
    assert issue.message == "expected 'http1' or 'http2', got 'grpc'"


@pytest.mark.parametrize(
    ("written", "read_as"), [("off", "false"), ("yes", "true"), ("no", "false")]
)
def test_an_unquoted_yaml_boolean_in_a_choice_says_to_quote_it(written: str, read_as: str) -> None:
    text = GOOD.replace("  - name: model\n", f"  - name: model\n    protocol: {written}\n")
    [issue] = _issues(text)
    assert issue.message.startswith(f"expected 'http1' or 'http2', got {read_as} (YAML reads")
    assert "quote the word you meant" in issue.message
    # quoted, the same word is a string: the plain message, no hint
    [quoted] = _issues(text.replace(f"protocol: {written}", f"protocol: '{written}'"))
    assert quoted.message == f"expected 'http1' or 'http2', got '{written}'"


def test_yaml_one_one_booleans_do_not_turn_the_on_key_into_true() -> None:
    text = GOOD + "    retries:\n      on: [5xx]\n"
    policy = load_policy_text(text)
    assert policy.routes[0].retries is not None
    assert policy.routes[0].retries.on == ["5xx"]


def test_syntax_error_has_a_location_and_no_path() -> None:
    [issue] = _issues("listeners:\n  - name: [main\n")
    assert issue.line is not None and issue.column is not None
    assert issue.path == "" and issue.message.startswith("invalid YAML:")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_empty_document_is_refused(text: str) -> None:
    [issue] = _issues(text)
    assert "empty" in issue.message


def test_duplicate_keys_are_reported_with_schema_errors() -> None:
    text = GOOD.replace("    port: 10000", "    port: 10000\n    port: 10001\n    prot: 1")
    issues = _issues(text)
    assert [(i.line, i.path) for i in issues] == [
        (4, "listeners[0].port"),
        (5, "listeners[0].prot"),
    ]
    assert "duplicate key 'port' (first at line 3)" in issues[0].message


def test_merge_keys_fill_in_and_explicit_keys_win() -> None:
    text = "listeners:\n  - &base {name: a, port: 1}\n  - <<: *base\n    name: b\n    port: 2\n"
    policy = load_policy_text(text)
    assert [(x.name, x.port) for x in policy.listeners] == [("a", 1), ("b", 2)]


def test_recursive_alias_is_an_error_not_a_hang() -> None:
    issues = _issues("listeners: &x [*x]\n")
    assert any("recursive" in i.message for i in issues)


def test_unreadable_file_is_one_issue_without_position(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError) as caught:
        load_policy(missing)
    [issue] = caught.value.issues
    assert issue == PolicyIssue(str(missing), None, None, "", issue.message)
    assert issue.message.startswith("cannot read file:")
    assert str(caught.value) == f"{missing}: {issue.message}"


def test_load_policy_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD, encoding="utf-8")
    assert load_policy(path) == load_policy_text(GOOD)
    assert load_policy(str(path)) == load_policy_text(GOOD)
