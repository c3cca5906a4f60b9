"""resolve_policy with runtime State: what a bad override or state file is told, and what the
IR is made of. (What each merge produces is in tests/golden/resolve/state-*.)"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from pydantic import BaseModel

from inferway.policies import PolicyError, load_policy_text
from inferway.resolve import IR, ResolveError, resolve_policy
from inferway.state import State
from inferway.state.load import load_state_text

ROOT = Path(__file__).resolve().parents[2]
POLICY = """\
version: 1
listeners: [{name: main, port: 10000}]
services:
  - {name: v1, endpoints: ["127.0.0.1:8001"]}
  - {name: v2, endpoints: ["127.0.0.1:8002"]}
routes: [{name: canary, backends: [{service: v1, weight: 90}, {service: v2, weight: 10}]}]
"""


def _values(value: object) -> list[object]:
    """Every value inside a dataclass tree."""
    found = [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            found.extend(_values(getattr(value, field.name)))
    elif isinstance(value, tuple):
        for item in value:
            found.extend(_values(item))
    return found


def test_a_weight_override_with_a_bad_weight_names_route_and_service() -> None:
    state = State(weights={"canary": {"v2": 0.25}})
    with pytest.raises(ResolveError, match=r"weight override canary/v2: .*0.1 resolution"):
        resolve_policy(load_policy_text(POLICY), state)
    with pytest.raises(ResolveError, match="got -5"):
        resolve_policy(load_policy_text(POLICY), State(weights={"canary": {"v1": -5}}))


def test_the_ir_holds_plain_data_only() -> None:
    text = POLICY.replace(
        "routes:", "observability: {tracing: {collector: '127.0.0.1:4317'}}\nroutes:"
    )
    ir = resolve_policy(load_policy_text(text), State(weights={"canary": {"v2": 50}}))
    assert isinstance(ir, IR)
    values = _values(ir)
    assert not [v for v in values if isinstance(v, BaseModel)]
    assert all(
        isinstance(v, (str, int, float, bool, bytes, tuple, type(None)))
        or dataclasses.is_dataclass(v)
        for v in values
    )


def test_a_state_file_error_is_located() -> None:
    text = "weights:\n  canary:\n    v2: 50\nendpoint:\n  v1: []\n"
    with pytest.raises(PolicyError) as refused:
        load_state_text(text, "state.yaml")
    (issue,) = refused.value.issues
    assert (issue.file, issue.line) == ("state.yaml", 4)
    assert "endpoint" in issue.message


@pytest.mark.parametrize("package", ["state", "resolve"])
def test_state_and_resolve_import_nothing_above_them(package: str) -> None:
    above = ("inferway.xds", "inferway.gateway", "inferway.backends", "inferway.resolve")
    allowed_self = "inferway.resolve" if package == "resolve" else None
    for path in sorted((ROOT / "inferway" / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if allowed_self and name.startswith(allowed_self):
                    continue
                assert not name.startswith(above), f"{path.relative_to(ROOT)} imports {name}"
