"""Golden tests of resolve: tests/golden/resolve/<case>/policy.yaml (+ state.yaml) -> ir.yaml.

The IR is where every default and every runtime source shows, so a change to what a policy
means shows here as a reviewed diff. A case whose State contradicts its policy holds the
expected ResolveError in error.txt instead of ir.yaml.
"""

from __future__ import annotations

import pytest

from inferway.resolve import ResolveError, ir_from_yaml, ir_to_yaml
from tests.golden.golden_files import (
    RESOLVE,
    check_text,
    prune_case_dirs,
    prune_case_files,
    refused_cases,
    resolve_case,
    resolve_cases,
)

CASES = tuple(resolve_cases())
INPUTS = ("policy.yaml", "state.yaml")


def test_resolve_cases_exist() -> None:
    assert len(CASES) >= 25, f"expected the golden cases under {RESOLVE}, found {CASES}"


def test_no_stale_resolve_case_dirs() -> None:
    stale = prune_case_dirs(RESOLVE, CASES)
    assert not stale, f"golden dirs without policy.yaml (run `make golden`): {stale}"


@pytest.mark.parametrize("case", CASES)
def test_resolve_matches_golden(case: str) -> None:
    case_dir = RESOLVE / case
    if case in refused_cases(CASES):
        with pytest.raises(ResolveError) as refused:
            resolve_case(case_dir)
        check_text(case_dir / "error.txt", f"{refused.value}\n", f"the refusal of {case_dir}")
        output = "error.txt"
    else:
        ir = resolve_case(case_dir)
        rendered = ir_to_yaml(ir)
        assert ir_from_yaml(rendered) == ir, "the IR must survive a YAML round trip"
        check_text(case_dir / "ir.yaml", rendered, f"resolve of {case_dir}")
        output = "ir.yaml"
    stale = prune_case_files(case_dir, {*INPUTS, output})
    assert not stale, f"stale golden files (run `make golden`): {stale}"
