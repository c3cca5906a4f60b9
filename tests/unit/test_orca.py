"""ORCA load reports: Envoy's TEXT syntax, rps always positive, aggregation over models."""

from __future__ import annotations

from dataclasses import dataclass

from inferway.backends.orca import (
    LoadReport,
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
