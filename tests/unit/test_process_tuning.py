"""The serving process's interpreter settings."""

from __future__ import annotations

import sys

import pytest

from inferway.backends.process_tuning import SERVING_SWITCH_INTERVAL_S, tune_for_serving


def test_sets_the_switch_interval_and_returns_the_old_one() -> None:
    before = sys.getswitchinterval()
    try:
        assert tune_for_serving() == before
        assert sys.getswitchinterval() == pytest.approx(SERVING_SWITCH_INTERVAL_S)
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("bad", [0.0, -1.0, 2.0])
def test_refuses_nonsense(bad: float) -> None:
    with pytest.raises(ValueError, match="switch interval"):
        tune_for_serving(bad)
