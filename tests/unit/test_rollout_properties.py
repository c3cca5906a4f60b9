"""Properties of the rollout state machine over arbitrary interleavings of traffic windows,
outages and commands: it never skips a step, never promotes by itself after a failed check,
always ends at 100% stable on abort, only grows the canary while progressing, and its state
always survives a JSON round trip."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from inferway.controllers.rollout.config import TOTAL_WEIGHT
from inferway.controllers.rollout.controller import (
    RolloutCommandError,
    RolloutController,
)
from inferway.controllers.rollout.evidence import VersionCounts, WindowSample
from inferway.controllers.rollout.state import Phase, RolloutState
from tests.rollout_samples import rollout_config

SHAPE = {60.0: 50, 80.0: 30, 120.0: 15, 200.0: 5}


def _lat(scale: float, n: int) -> dict[float, int]:
    return {v * scale: max(1, c * n // 100) for v, c in SHAPE.items()}


WINDOWS = {
    # Plenty of clean evidence: passes as soon as the step's hold allows.
    "good": WindowSample(
        VersionCounts(20_000, 20, _lat(1, 200)), VersionCounts(2000, 1, _lat(1, 200))
    ),
    "bad": WindowSample(
        VersionCounts(20_000, 20, _lat(1, 200)), VersionCounts(2000, 200, _lat(1.5, 200))
    ),
    "thin": WindowSample(VersionCounts(30, 0), VersionCounts(1, 0)),
}

ops = st.lists(
    st.one_of(
        st.tuples(st.just("tick"), st.sampled_from(sorted(WINDOWS)), st.floats(0, 90)),
        st.tuples(st.just("outage"), st.just(""), st.floats(0, 90)),
        st.tuples(st.just("empty"), st.just(""), st.floats(0, 90)),
        st.tuples(
            st.just("command"),
            st.sampled_from(["promote", "abort", "pause", "resume", "restart"]),
            st.just(0.0),
        ),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, on_failure=st.sampled_from(["rollback", "pause"]))
def test_rollout_invariants_hold_for_any_interleaving(
    ops: list[tuple[str, str, float]], on_failure: str
) -> None:
    config = rollout_config((0.1, 1, 5, 25, 50, 100), on_failure=on_failure, interval_s=30.0)
    parts = config.step_parts
    c = RolloutController(config)
    now = 0.0
    promote_commanded = failed_seen = False
    for kind, arg, dt in ops:
        now += dt
        before = (c.state.run, c.state.step, c.weight, c.state.phase)
        if kind == "tick":
            failed_seen |= c.tick(now, WINDOWS[arg]).result == "fail"
        elif kind == "outage":
            c.tick(now, source_error="refused")
        elif kind == "empty":
            c.tick(now)
        else:
            try:
                c.command(now, arg)
            except RolloutCommandError:
                assert c.state.phase.value == before[3].value  # a refusal changes nothing
                continue
        s = c.state
        if kind == "command" and arg == "restart":
            promote_commanded = failed_seen = False
        if kind == "command" and arg == "promote":
            promote_commanded = True
        # weights are only ever 0, a step's parts, or the full total
        assert c.weight == 0 or c.weight in parts or c.weight == TOTAL_WEIGHT
        if s.phase in (Phase.PROGRESSING, Phase.PAUSED, Phase.FAILED):
            assert c.weight == parts[s.step]
        if kind == "command" and arg == "abort":
            assert (s.phase, c.weight) == (Phase.ROLLED_BACK, 0)
        # never skips a step, and only grows while the same run progresses
        held = s.phase in (Phase.PROGRESSING, Phase.PAUSED, Phase.FAILED)
        if kind != "command" and s.run == before[0] and before[3] != Phase.WAITING and held:
            assert s.step in (before[1], before[1] + 1)
            assert c.weight >= before[2]
        # never promotes after a failed check unless a person said so
        if failed_seen and s.phase == Phase.PROMOTED:
            assert promote_commanded
        assert s.failed_in_run == failed_seen
        assert RolloutState.from_json(s.to_json()) == s


@settings(max_examples=100, deadline=None)
@given(n_good=st.integers(0, 10), n_thin=st.integers(0, 5))
def test_a_failed_check_is_final_for_the_run(n_good: int, n_thin: int) -> None:
    c = RolloutController(rollout_config((1, 5, 50), on_failure="pause"))
    c.tick(0.0)
    now = 0.0
    for _ in range(n_thin):
        now += 30
        c.tick(now, WINDOWS["thin"])
    now += 30
    c.tick(now, WINDOWS["bad"])
    assert c.state.phase == Phase.FAILED
    for _ in range(n_good):
        now += 30
        c.tick(now, WINDOWS["good"])
    assert c.state.phase == Phase.FAILED and c.weight == 100
