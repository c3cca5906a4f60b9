"""The pure parts of ``inferway optimize``: which inputs a version is judged on, how outputs
are compared, and the gate's verdict."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from inferway.backends.runners.base import TensorSpec
from inferway.tools.optimize.compare import Comparison, OutputDeviation, compare_runners
from inferway.tools.optimize.inputs import (
    CalibrationError,
    build_validation_cases,
    load_calibration,
)
from inferway.tools.optimize.report import build_rollout_stanza, judge

X = TensorSpec("x", "FP32", (-1, 6))
IDS = TensorSpec("ids", "INT64", (-1, 3))
Y = TensorSpec("y", "FP32", (-1, 3))


def test_cases_cover_every_batch_size_each_kind_and_at_least_the_rows_asked() -> None:
    cases = build_validation_cases([X], 8, min_rows=1000)
    assert sum(c.rows for c in cases) >= 1000
    assert all(c.rows <= 8 for c in cases)
    sizes = sorted(c.rows for c in cases if c.category == "batch-size")
    assert sizes == list(range(1, 9))
    assert {c.category for c in cases} == {
        "batch-size",
        "uniform",
        "zeros",
        "extremes",
        "dtype-edges",
        "random",
    }
    zeros = next(c for c in cases if c.category == "zeros")
    assert not zeros.feed["x"].any()
    extremes = np.concatenate([c.feed["x"] for c in cases if c.category == "extremes"])
    assert extremes.min() == -3 and extremes.max() == 3  # the default float domain
    edges = next(c for c in cases if c.category == "dtype-edges").feed["x"][:, 0]
    tiny = np.finfo(np.float32).tiny
    assert np.signbit(edges[1]) and edges[1] == 0  # -0.0
    assert 0 < edges[2] < tiny  # a subnormal
    assert tiny in edges and -tiny in edges
    again = build_validation_cases([X], 8, min_rows=1000)
    assert all(np.array_equal(a.feed["x"], b.feed["x"]) for a, b in zip(cases, again, strict=True))


def test_calibration_rows_come_first_and_set_the_domain() -> None:
    data = {"x": np.linspace(-0.5, 2.0, 60, dtype=np.float32).reshape(10, 6)}
    cases = build_validation_cases([X], 4, min_rows=100, calibration=data)
    assert [c.rows for c in cases[:3]] == [4, 4, 2] and cases[0].category == "calibration"
    extremes = np.concatenate([c.feed["x"] for c in cases if c.category == "extremes"])
    assert extremes.min() == pytest.approx(-0.5) and extremes.max() == pytest.approx(2.0)
    randoms = np.concatenate([c.feed["x"] for c in cases if c.category == "random"])
    assert randoms.min() >= -0.5 and randoms.max() <= 2.0


def test_integer_inputs_stay_in_their_domain() -> None:
    cases = build_validation_cases([IDS], 4, min_rows=50)
    values = np.concatenate([c.feed["ids"] for c in cases])
    assert values.dtype == np.int64 and values.min() >= 0 and values.max() <= 10


def test_calibration_files_that_do_not_fit_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "c.npz"
    np.savez(path, x=np.zeros((5, 6), np.float64))
    assert load_calibration(path, [X])["x"].dtype == np.float32  # float widths are cast
    np.savez(path, x=np.zeros((5, 7), np.float32))
    with pytest.raises(CalibrationError, match=r"c.npz: 'x' has shape \(5, 7\)"):
        load_calibration(path, [X])
    np.savez(path, x=np.zeros((5, 3), np.int32))
    with pytest.raises(CalibrationError, match="'x' has dtype int32"):
        load_calibration(path, [X])
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(CalibrationError, match=r"bad\.npz: cannot read calibration data"):
        load_calibration(tmp_path / "bad.npz", [X])


class _Fixed:
    """A runner computing ``f(x)``: enough to exercise the comparison numerics."""

    def __init__(self, f) -> None:
        self.f = f
        self.inputs = (X,)
        self.outputs = (Y,)
        self.provider = "test"

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": self.f(inputs["x"])}

    def close(self) -> None:
        pass


def _scores(x: np.ndarray) -> np.ndarray:
    return np.stack([x[:, 0], x[:, 1], x[:, 0] - x[:, 1]], axis=1).astype(np.float32)


def test_comparison_measures_deviation_on_the_output_scale_and_top1() -> None:
    cases = build_validation_cases([X], 4, min_rows=200)
    same = compare_runners(_Fixed(_scores), _Fixed(_scores), cases)
    assert same.outputs[0].normalized == 0 and same.outputs[0].top1_agreement == 1.0
    shifted = compare_runners(_Fixed(_scores), _Fixed(lambda x: _scores(x) + 0.03), cases)
    (dev,) = shifted.outputs
    assert dev.max_abs == pytest.approx(0.03, rel=1e-3)
    assert dev.normalized == pytest.approx(dev.max_abs / dev.scale, rel=1e-9)
    assert dev.scale == pytest.approx(6.0)  # |x0 - x1| at the domain's extremes
    assert set(dev.deviation_by_category()) == set(shifted.categories)
    assert shifted.rows == sum(c.rows for c in cases) and not shifted.failures


def test_nonfinite_changes_and_failures_are_counted() -> None:
    cases = build_validation_cases([X], 4, min_rows=50)

    def nan_on_zero(x: np.ndarray) -> np.ndarray:
        y = _scores(x)
        y[np.all(x == 0, axis=1)] = np.nan
        return y

    nan = compare_runners(_Fixed(_scores), _Fixed(nan_on_zero), cases)
    assert nan.outputs[0].nonfinite_mismatches > 0

    def broken(x: np.ndarray) -> np.ndarray:
        raise RuntimeError("boom")

    failed = compare_runners(_Fixed(_scores), _Fixed(broken), cases)
    assert len(failed.failures) == len(cases) and "boom" in failed.failures[0]


def test_gate_accepts_within_tolerance_and_says_why_otherwise() -> None:
    ok = Comparison(rows=1200, categories={"random": 1200})
    ok.outputs = [
        OutputDeviation("y", max_abs=0.004, scale=1.0, max_abs_by_category={"random": 0.004})
    ]
    assert judge(ok, 0.5, 1000).accepted
    bad = Comparison(rows=900, failures=["zeros (4 rows): boom"])
    bad.outputs = [
        OutputDeviation("y", max_abs=0.02, scale=1.0, max_abs_by_category={"zeros": 0.02}),
        OutputDeviation("z", nonfinite_mismatches=3),
    ]
    verdict = judge(bad, 0.5, 1000)
    assert not verdict.accepted
    assert verdict.reasons[0].startswith("the new version failed 1 case(s)")
    assert "only 900 rows compared" in verdict.reasons[1]
    assert "deviation 2% of its range exceeds the tolerance 0.5%" in verdict.reasons[2]
    assert "worst on zeros inputs" in verdict.reasons[2]
    assert "3 value(s) non-finite in one version only" in verdict.reasons[3]


def test_rollout_stanza_is_a_valid_canary_rollout() -> None:
    (entry,) = build_rollout_stanza("demo", "1", "4", "inference")["rollouts"]
    assert (entry["stable"], entry["canary"], entry["route"]) == ("demo-v1", "demo-v4", "inference")
    assert entry["steps"][0] < entry["steps"][-1] == 100
