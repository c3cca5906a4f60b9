"""Issues found after a policy loaded (its certificate files) get the line and column of the
field that names them, like every other policy error."""

from __future__ import annotations

from inferway.policies.errors import PolicyIssue
from inferway.policies.located import parse_loc, place_issues
from inferway.policies.yaml_marks import format_loc

TEXT = """\
version: 1
listeners:
  - name: a
    port: 1
  - name: b
    port: 2
    tls:
      certificate: x.pem
"""


def test_parse_loc_inverts_format_loc() -> None:
    for loc in [("listeners", 1, "tls"), ("routes", 0, "backends", 12, "weight"), ("version",)]:
        assert parse_loc(format_loc(loc)) == loc


def test_an_unplaced_issue_of_the_policy_gets_its_fields_position() -> None:
    unplaced = PolicyIssue("p.yaml", None, None, "listeners[1].tls", "cannot read x.pem")
    (placed,) = place_issues(TEXT, "p.yaml", [unplaced])
    assert str(placed) == "p.yaml:7:5: listeners[1].tls: cannot read x.pem"


def test_other_files_placed_issues_and_documentwide_issues_are_kept() -> None:
    kept = [
        PolicyIssue("endpoints.yaml", None, None, "services.x", "from another file"),
        PolicyIssue("p.yaml", 3, 5, "listeners[0]", "already placed"),
        PolicyIssue("p.yaml", None, None, "", "about the whole file"),
    ]
    assert place_issues(TEXT, "p.yaml", kept) == kept
