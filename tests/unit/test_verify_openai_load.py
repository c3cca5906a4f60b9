"""The OpenAI load run's figures (openai_load.LLMLoadReport): TTFT and ITL quantiles in ms
over every sample (nearest rank), tokens/s over the run, and its error bar."""

from __future__ import annotations

from inferway.tools.verify.openai_load import LLMLoadReport


def test_quantiles_tokens_per_second_and_the_error_bar() -> None:
    report = LLMLoadReport(users=2, duration_s=4.0, max_tokens=16, max_error_percent=1.0)
    report.requests, report.tokens = 100, 1600
    report.ttft_s = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    report.itl_s = [0.002] * 99 + [0.050]
    document = report.document()
    assert document["ttft_ms"] == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
    assert document["itl_ms"] == {"p50": 2.0, "p95": 2.0, "p99": 2.0}
    assert document["tokens_per_s"] == 400.0 and document["ok"] is True
    report.errors = 2
    assert report.document()["error_percent"] == 2.0 and report.ok is False


def test_a_run_without_requests_is_no_pass_and_has_no_quantiles() -> None:
    report = LLMLoadReport(users=1, duration_s=1.0, max_tokens=16, max_error_percent=0.5)
    document = report.document()
    assert document["ok"] is False
    assert document["ttft_ms"] == {"p50": None, "p95": None, "p99": None}
