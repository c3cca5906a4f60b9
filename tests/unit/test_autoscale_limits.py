"""The clamps between recommendation and decision: panic, stabilization, step, cooldown."""

from __future__ import annotations

from inferway.controllers.autoscale.limits import Governor
from inferway.controllers.autoscale.params import Limits, PanicConfig

OFF = PanicConfig(enabled=False)


def names(clamps) -> list[str]:
    return [c.name for c in clamps]


def test_scale_in_waits_for_the_highest_recommendation_of_the_window():
    g = Governor(
        Limits(min_replicas=1, max_replicas=20, stabilization_down_s=60, cooldown_down_s=0), OFF
    )
    assert g.apply(0, 8, current=8, ready=8, panic_needed=None)[0] == 8
    desired, clamps, _ = g.apply(30, 3, current=8, ready=8, panic_needed=None)
    assert desired == 8 and names(clamps) == ["stabilization_down"]
    assert "highest recommendation of the last 60 s is 8" in clamps[0].detail
    desired, _, _ = g.apply(45, 5, current=8, ready=8, panic_needed=None)
    assert desired == 8
    assert g.apply(61, 3, current=8, ready=8, panic_needed=None)[0] == 5  # 8 left the window
    assert g.apply(106, 3, current=5, ready=5, panic_needed=None)[0] == 3


def test_a_settled_recommendation_skips_down_stabilization_but_not_cooldown():
    g = Governor(Limits(max_replicas=20, stabilization_down_s=300, cooldown_down_s=60), OFF)
    g.apply(0, 9, current=4, ready=4, panic_needed=None)
    desired, clamps, _ = g.apply(30, 4, current=9, ready=9, panic_needed=None, settled=True)
    assert desired == 9 and names(clamps) == ["cooldown_down"]
    assert g.apply(60, 4, current=9, ready=9, panic_needed=None, settled=True)[0] == 4


def test_scale_out_waits_for_the_lowest_recommendation_of_the_up_window():
    g = Governor(Limits(max_replicas=20, stabilization_up_s=30), OFF)
    g.apply(0, 4, current=4, ready=4, panic_needed=None)
    desired, clamps, _ = g.apply(10, 9, current=4, ready=4, panic_needed=None)
    assert desired == 4 and names(clamps) == ["stabilization_up"]
    assert g.apply(31, 9, current=4, ready=4, panic_needed=None)[0] == 9


def test_panic_follows_the_short_window_at_once_and_holds_off_scale_in():
    g = Governor(
        Limits(max_replicas=30, stabilization_up_s=60, stabilization_down_s=0, cooldown_down_s=0),
        PanicConfig(threshold=2.0, window_s=6, hold_s=30),
    )
    g.apply(0, 4, current=4, ready=4, panic_needed=4)
    desired, clamps, panic = g.apply(5, 6, current=4, ready=4, panic_needed=12)
    assert panic and desired == 12
    assert names(clamps) == ["panic"]  # and no up-stabilization while panicking
    desired, clamps, panic = g.apply(20, 5, current=12, ready=4, panic_needed=5)
    assert panic and desired == 12 and names(clamps) == ["panic_hold"]
    desired, _, panic = g.apply(36, 5, current=12, ready=12, panic_needed=5)
    assert not panic and desired == 5


def test_panic_needs_its_threshold_times_the_ready_replicas():
    g = Governor(Limits(max_replicas=30), PanicConfig(threshold=2.0))
    _, _, panic = g.apply(0, 7, current=4, ready=4, panic_needed=7)
    assert not panic
    _, _, panic = g.apply(5, 8, current=4, ready=4, panic_needed=8)
    assert panic


def test_cooldown_down_counts_from_the_last_scaling_of_either_direction():
    g = Governor(
        Limits(max_replicas=20, stabilization_down_s=0, cooldown_down_s=120, cooldown_up_s=0), OFF
    )
    assert g.apply(0, 6, current=4, ready=4, panic_needed=None)[0] == 6
    desired, clamps, _ = g.apply(60, 3, current=6, ready=6, panic_needed=None)
    assert desired == 6 and names(clamps) == ["cooldown_down"]
    assert "60 s of 120 s cooldown left" in clamps[0].detail
    assert g.apply(60, 8, current=6, ready=6, panic_needed=None)[0] == 8  # up is not cooling
    assert g.apply(181, 3, current=8, ready=8, panic_needed=None)[0] == 3


def test_steps_then_min_max():
    g = Governor(
        Limits(
            min_replicas=2,
            max_replicas=10,
            max_step_up=3,
            max_step_down=1,
            stabilization_down_s=0,
            cooldown_down_s=0,
        ),
        OFF,
    )
    desired, clamps, _ = g.apply(0, 40, current=9, ready=9, panic_needed=None)
    assert desired == 10 and names(clamps) == ["max_step_up", "max_replicas"]
    desired, clamps, _ = g.apply(5, 0, current=5, ready=5, panic_needed=None)
    assert desired == 4 and names(clamps) == ["max_step_down"]
    desired, clamps, _ = g.apply(10, 0, current=0, ready=0, panic_needed=None)
    assert desired == 2 and names(clamps) == ["min_replicas"]
