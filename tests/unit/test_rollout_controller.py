"""The rollout state machine on seeded traffic: walks, rollbacks, commands, persistence."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from inferway.controllers.rollout.config import TOTAL_WEIGHT
from inferway.controllers.rollout.controller import (
    RolloutCommandError,
    RolloutController,
)
from inferway.controllers.rollout.state import Phase, RolloutState, RolloutStateError
from tests.rollout_samples import rollout_config, window

INTERVAL = 30.0


def _drive(
    c: RolloutController,
    rng: np.random.Generator,
    ticks: int,
    *,
    total: int = 3000,
    **traffic: float,
) -> float:
    """Tick every interval with one window of ``total`` requests until done or ``ticks``."""
    now = c.state.history[-1].at if c.state.history else 0.0
    for _ in range(ticks):
        now += INTERVAL
        c.tick(now, window(rng, total, c.weight, **traffic))
        if c.state.phase in (Phase.PROMOTED, Phase.ROLLED_BACK, Phase.FAILED):
            break
    return now


def test_first_tick_starts_at_the_first_step_in_parts_of_ten_thousand() -> None:
    c = RolloutController(rollout_config((0.1, 1, 5, 25, 50, 100)))
    assert c.state.phase == Phase.WAITING and c.weight == 0
    d = c.tick(0.0)
    assert (d.action, c.state.phase, c.weight) == ("start", Phase.PROGRESSING, 10)


def test_a_good_canary_walks_every_step_in_order_to_promoted() -> None:
    c = RolloutController(rollout_config(history_size=1000))
    c.tick(0.0)
    _drive(c, np.random.default_rng(5), 200)
    assert c.state.phase == Phase.PROMOTED and c.weight == TOTAL_WEIGHT
    weights = [d.weight for d in c.state.history if d.action in ("start", "advance", "promote")]
    assert weights == [100, 500, 2500, 5000, TOTAL_WEIGHT]
    assert c.state.history[-1].reason.startswith("step passed")


def test_a_bad_canary_is_rolled_back_with_the_failing_verdict_recorded() -> None:
    c = RolloutController(rollout_config())
    c.tick(0.0)
    _drive(c, np.random.default_rng(6), 200, canary_errors=0.02, canary_latency=1.3)
    assert c.state.phase == Phase.ROLLED_BACK and c.weight == 0
    last = c.state.history[-1]
    assert last.action == "rollback" and last.result == "fail"
    assert any(v.result == "fail" for v in last.verdicts)
    assert all(d.weight <= 100 for d in c.state.history)  # never left the first step


def test_on_failure_pause_holds_the_weight_and_refuses_resume() -> None:
    c = RolloutController(rollout_config(on_failure="pause"))
    c.tick(0.0)
    _drive(c, np.random.default_rng(7), 200, canary_errors=0.05)
    assert c.state.phase == Phase.FAILED and c.weight == 100
    with pytest.raises(RolloutCommandError, match="cannot resume while failed; a failed check"):
        c.command(1e6, "resume")
    assert c.command(1e6, "abort").weight == 0


def test_a_step_is_held_for_its_pause_even_when_checks_pass() -> None:
    c = RolloutController(rollout_config((1, 50, 100), pauses={1: 600.0}))
    c.tick(0.0)
    rng = np.random.default_rng(8)
    _drive(c, rng, 200, total=30_000)
    advanced = [d for d in c.state.history if d.action in ("advance", "promote")]
    assert advanced[1].at - advanced[0].at >= 600.0


def test_min_wait_is_one_interval_per_step_even_at_huge_traffic() -> None:
    c = RolloutController(rollout_config(history_size=1000))
    c.tick(0.0)
    _drive(c, np.random.default_rng(9), 200, total=300_000)
    moves = [d.at for d in c.state.history if d.action in ("start", "advance", "promote")]
    assert all(b - a >= INTERVAL for a, b in itertools.pairwise(moves))


def test_an_unreachable_metric_source_pauses_and_data_resumes() -> None:
    c = RolloutController(rollout_config())
    c.tick(0.0)
    d = c.tick(30.0, source_error="connection refused")
    assert (c.state.phase, c.state.paused_by) == (Phase.PAUSED, "source")
    assert "connection refused" in d.reason and c.weight == 100
    c.tick(60.0, window(np.random.default_rng(1), 3000, c.weight))
    assert c.state.phase == Phase.PROGRESSING


def test_a_user_pause_survives_a_source_outage_and_still_rolls_back_a_failure() -> None:
    c = RolloutController(rollout_config())
    c.tick(0.0)
    c.command(1.0, "pause")
    c.tick(30.0, source_error="timeout")
    rng = np.random.default_rng(2)
    c.tick(60.0, window(rng, 30_000, c.weight))
    assert (c.state.phase, c.state.paused_by) == (Phase.PAUSED, "user")
    c.tick(90.0, window(rng, 30_000, c.weight, canary_errors=0.2))
    assert c.state.phase == Phase.ROLLED_BACK


def test_commands_promote_abort_restart_and_refusals() -> None:
    c = RolloutController(rollout_config())
    with pytest.raises(RolloutCommandError, match="cannot pause while waiting"):
        c.command(0.0, "pause")
    with pytest.raises(RolloutCommandError, match="unknown command 'skip'"):
        c.command(0.0, "skip")
    c.tick(0.0)
    assert c.command(1.0, "promote").weight == TOTAL_WEIGHT
    with pytest.raises(RolloutCommandError, match="restart it first"):
        c.command(2.0, "promote")
    assert c.command(3.0, "abort").weight == 0
    d = c.command(4.0, "restart")
    assert (d.action, d.run, c.weight, c.state.evidence.canary.requests) == ("start", 1, 100, 0)


def test_history_is_bounded() -> None:
    c = RolloutController(rollout_config(history_size=5))
    c.tick(0.0)
    for i in range(20):
        c.tick(30.0 * (i + 1))
    assert len(c.state.history) == 5 and c.state.history[-1].at == 600.0


def test_state_round_trips_through_json_and_resumes_identically() -> None:
    config = rollout_config()
    a = RolloutController(config)
    a.tick(0.0)
    _drive(a, np.random.default_rng(3), 30)
    text = a.state.to_json()
    restored = RolloutState.from_json(text)
    assert restored == a.state
    assert restored.to_json() == text
    b = RolloutController(config, restored)
    ra, rb = np.random.default_rng(4), np.random.default_rng(4)
    for i in range(5):
        now = 10_000.0 + 30 * i
        da = a.tick(now, window(ra, 3000, a.weight))
        db = b.tick(now, window(rb, 3000, b.weight))
        assert da == db
    json.loads(b.state.to_json())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "expected a JSON object"),
        ("{", "not JSON"),
        ('{"version": 99, "name": "x"}', "version 99"),
        ('{"version": 1, "name": "x", "phase": "dancing"}', "phase"),
    ],
)
def test_unreadable_state_is_refused_with_the_field(text: str, message: str) -> None:
    with pytest.raises(RolloutStateError, match=message):
        RolloutState.from_json(text)


def test_state_of_another_rollout_or_out_of_range_is_refused() -> None:
    with pytest.raises(RolloutStateError, match="another rollout"):
        RolloutController(rollout_config(), RolloutState(name="other"))
    with pytest.raises(RolloutStateError, match="step 9 outside"):
        RolloutController(rollout_config(), RolloutState(name="demo-v2", step=9))
