"""Rollout settings: 0.1% resolution on a constant 10,000 total, and clear refusals."""

from __future__ import annotations

import pytest

from inferway.controllers.rollout.config import (
    TOTAL_WEIGHT,
    AnalysisConfig,
    ErrorRateCheck,
    RolloutConfig,
    RolloutConfigError,
    Step,
    percent_to_parts,
)


def test_percent_steps_become_parts_of_a_constant_total() -> None:
    assert TOTAL_WEIGHT == 10_000
    assert percent_to_parts(0.1) == 10
    assert percent_to_parts(1) == 100
    assert percent_to_parts(12.3) == 1230
    assert percent_to_parts(100) == TOTAL_WEIGHT


@pytest.mark.parametrize("bad", [0.05, 0.15, 0, -1, 100.1])
def test_weights_finer_than_a_tenth_of_a_percent_or_out_of_range_are_refused(bad: float) -> None:
    with pytest.raises(RolloutConfigError, match="steps"):
        percent_to_parts(bad, where="steps[0]")


def _config(steps: tuple[float, ...], **kw: object) -> RolloutConfig:
    return RolloutConfig("r1", "v1", "v2", tuple(Step(p) for p in steps), **kw)  # type: ignore[arg-type]


def test_steps_must_increase_and_the_error_names_the_step() -> None:
    message = r"rollout 'r1': steps\[2\] = 5% does not increase"
    with pytest.raises(RolloutConfigError, match=message):
        _config((1, 5, 5, 50))
    with pytest.raises(RolloutConfigError, match="steps is empty"):
        _config(())


def test_stable_and_canary_must_differ() -> None:
    with pytest.raises(RolloutConfigError, match="two named backends"):
        RolloutConfig("r1", "v1", "v1", (Step(1),))


@pytest.mark.parametrize(
    ("analysis", "message"),
    [
        (AnalysisConfig(interval_s=0), "interval must be positive"),
        (AnalysisConfig(alpha=0.7), "alpha and beta"),
        (AnalysisConfig(min_requests=-1), "min_requests"),
        (AnalysisConfig(checks=(ErrorRateCheck(0.01), ErrorRateCheck(0.02))), "twice"),
        (AnalysisConfig(checks=(ErrorRateCheck(0),)), "max_increase"),
    ],
)
def test_unusable_analysis_settings_are_refused(analysis: AnalysisConfig, message: str) -> None:
    with pytest.raises(RolloutConfigError, match=message):
        _config((1, 50), analysis=analysis)


def test_negative_pause_is_refused() -> None:
    with pytest.raises(RolloutConfigError, match=r"steps\[0\].pause"):
        RolloutConfig("r1", "v1", "v2", (Step(1, -5),))
