"""The serving process's interpreter settings."""

from __future__ import annotations

import gc
import sys

import pytest

from inferway.backends.process_tuning import (
    SERVING_SWITCH_INTERVAL_S,
    freeze_startup_heap,
    tune_for_serving,
)


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


def test_freeze_startup_heap_hides_what_lives_now_from_later_collections() -> None:
    gc.unfreeze()
    kept = [[i] for i in range(1000)]  # objects alive at the end of start-up
    try:
        frozen = freeze_startup_heap()
        assert frozen >= 1000 and gc.get_freeze_count() == frozen
        watched = {id(x) for x in kept}
        assert not any(id(o) in watched for o in gc.get_objects())  # the collector skips them
        garbage: list[object] = []
        garbage.append(garbage)  # a cycle made after start-up is still collected
        del garbage
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
