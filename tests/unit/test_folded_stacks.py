"""Top frames from folded stacks: self = leaf samples, total = on the stack once per stack."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferway.observability.folded_stacks import parse_folded

TEXT = """\
main (a.py:1);serve (a.py:5);decode (json.py:9) 30
main (a.py:1);serve (a.py:5);run (ort.py:3) 60
main (a.py:1);idle (a.py:7) 10
"""


def test_self_and_total_samples_and_percentages() -> None:
    stacks = parse_folded(TEXT)
    assert stacks.samples == 100
    top = {f.frame: f for f in stacks.top(10)}
    assert top["run (ort.py:3)"].self_samples == 60
    assert top["serve (a.py:5)"].self_samples == 0
    assert top["serve (a.py:5)"].total_samples == 90
    assert top["main (a.py:1)"].total_percent == pytest.approx(100.0)
    assert [f.frame for f in stacks.top(2)] == ["run (ort.py:3)", "decode (json.py:9)"]


def test_recursion_counts_a_frame_once_per_stack() -> None:
    stacks = parse_folded("f (x:1);f (x:1);f (x:1) 5\n")
    (only,) = stacks.top()
    assert (only.self_samples, only.total_samples) == (5, 5)


def test_a_line_without_count_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_folded("a;b 3\na;b\n")


frames = st.sampled_from(["a", "b", "c", "d"])


@given(st.lists(st.tuples(st.lists(frames, min_size=1, max_size=5), st.integers(1, 50))))
def test_self_samples_sum_to_all_samples_and_total_bounds_self(
    rows: list[tuple[list[str], int]],
) -> None:
    text = "".join(f"{';'.join(stack)} {count}\n" for stack, count in rows)
    stacks = parse_folded(text)
    top = stacks.top(limit=100)
    assert sum(f.self_samples for f in top) == stacks.samples
    assert all(f.self_samples <= f.total_samples <= stacks.samples for f in top)
