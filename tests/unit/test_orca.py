"""ORCA load reports: Envoy's TEXT syntax, rps always positive, aggregation over models."""

from __future__ import annotations

from dataclasses import dataclass

from inferway.backends.telemetry.orca import (
    LoadReport,
    LoadReporter,
    build_orca_header,
    parse_orca_header,
    resolve_load_report,
)


@dataclass
class _Exec:
    r: float
    u: float
    queue_depth: int

    def rps(self) -> float:
        return self.r

    def utilization(self) -> float:
        return self.u


def test_header_is_envoy_text_form_and_parses_back() -> None:
    value = build_orca_header(LoadReport(rps=12.5, utilization=0.25, queue_depth=3))
    assert value.startswith("TEXT ")
    assert parse_orca_header(value) == {
        "rps_fractional": 12.5,
        "application_utilization": 0.25,
        "named_metrics.queue_depth": 3.0,
    }


def test_idle_backend_still_reports_positive_rps() -> None:
    # Envoy rejects reports with rps <= 0 ("QPS must be positive").
    parsed = parse_orca_header(build_orca_header(LoadReport(0.0, 0.0, 0)))
    assert parsed["rps_fractional"] > 0


def test_load_adds_up_over_models_and_utilization_is_clamped() -> None:
    report = resolve_load_report([_Exec(10, 0.7, 2), _Exec(5, 0.6, 1), _Exec(-1, -0.2, 0)])
    assert report == LoadReport(rps=15.0, utilization=1.0, queue_depth=3)
    assert resolve_load_report([]) == LoadReport(0.0, 0.0, 0)


def test_parser_accepts_colon_form_too() -> None:
    assert parse_orca_header("TEXT rps_fractional:100, application_utilization:0.4") == {
        "rps_fractional": 100.0,
        "application_utilization": 0.4,
    }


class _Model:
    def __init__(self, executor: _Exec) -> None:
        self.executor = executor


def test_reporter_reuses_a_busy_report_until_it_is_max_age_old() -> None:
    now = [0.0]
    ex = _Exec(10.0, 0.5, 1)
    calls = [0]

    def models() -> list[_Model]:
        calls[0] += 1
        return [_Model(ex)]

    reporter = LoadReporter(models, max_age_s=0.05, clock=lambda: now[0])
    first = reporter.header()
    ex.r = 20.0
    now[0] = 0.049
    assert reporter.header() == first and calls[0] == 1
    now[0] = 0.05
    assert parse_orca_header(reporter.header())["rps_fractional"] == 20.0
    assert calls[0] == 2


def test_reporter_never_reuses_an_idle_report() -> None:
    ex = _Exec(0.0, 0.0, 0)
    reporter = LoadReporter(lambda: [_Model(ex)], max_age_s=60, clock=lambda: 0.0)
    assert parse_orca_header(reporter.header())["rps_fractional"] > 0  # floored, not zero
    ex.r, ex.queue_depth = 5.0, 2
    report = parse_orca_header(reporter.header())
    assert report["rps_fractional"] == 5.0 and report["named_metrics.queue_depth"] == 2
