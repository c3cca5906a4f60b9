"""``inferway report cost`` and the autoscalers' queries against a real Prometheus: three days
of the gateway's, Envoy's and the backends' series are backfilled into its TSDB with
promtool (Prometheus' own backfill), then the real CLI reads them back over the HTTP API.
The figures are worked out by hand from the series; so is what KEDA's trigger and the
prometheus-adapter rule (deploy/kubernetes/components) get for the published count."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.kustomize_build import build
from tests.prometheus_backfill import Series, backfill
from tests.prometheus_server import PrometheusServer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.needs_binary("prometheus", "the Prometheus the cost report queries"),
    pytest.mark.needs_binary("promtool", "backfilling three days of series"),
]

STEP = 300.0  # one sample every 5 minutes
HOURS = 72


def _counter(per_s: float, times: list[float]) -> list[tuple[float, float]]:
    return [(t, per_s * (t - times[0])) for t in times]


def _gauge(value: float, times: list[float]) -> list[tuple[float, float]]:
    return [(t, value) for t in times]


def history(end: float) -> dict[str, list[Series]]:
    """model: 4 replicas at 2.40 USD (two gateways, 100 req/s each), rows of resnet on two
    backends; small: 1 replica at 1.00 EUR, 10 req/s, no model, and LLM tokens counted by the
    gateway: model tiny 100 input + 50 output tokens/s at 2 / 4 EUR per 1M, model big 10
    output tokens/s at its own 10 EUR per 1M (1.80 EUR/hour of tokens)."""
    times = [end - (HOURS + 1) * 3600 + i * STEP for i in range(int((HOURS + 1) * 3600 / STEP) + 1)]
    gw = {"job": "inferway-gateway"}
    envoy = {"job": "inferway-envoy"}
    backend = {"job": "inferway-backend", "model": "resnet", "version": "1"}
    small = {**gw, "instance": "gw-0", "service": "small", "currency": "EUR"}
    llm = {**gw, "instance": "gw-0", "route": "chat", "backend": "small", "client": "k"}
    return {
        "inferway_cost_per_1m_tokens": [
            ({**small, "model": "", "type": "input"}, _gauge(2.0, times)),
            ({**small, "model": "", "type": "output"}, _gauge(4.0, times)),
            ({**small, "model": "big", "type": "input"}, _gauge(0.0, times)),
            ({**small, "model": "big", "type": "output"}, _gauge(10.0, times)),
        ],
        "inferway_cost_budget_per_1k_tokens": [(small, _gauge(0.004, times))],
        "inferway_llm_tokens_total": [
            (
                {**llm, "model": "tiny", "type": "input", "estimated": "false"},
                _counter(100, times),
            ),
            (
                {**llm, "model": "tiny", "type": "output", "estimated": "false"},
                _counter(40, times),
            ),
            (
                {**llm, "model": "tiny", "type": "output", "estimated": "true"},
                _counter(10, times),
            ),
            ({**llm, "model": "big", "type": "output", "estimated": "false"}, _counter(10, times)),
        ],
        "inferway_cost_per_replica_hour": [
            ({**gw, "instance": "gw-0", "service": "model", "currency": "USD"}, _gauge(2.4, times)),
            ({**gw, "instance": "gw-1", "service": "model", "currency": "USD"}, _gauge(2.4, times)),
            ({**gw, "instance": "gw-0", "service": "small", "currency": "EUR"}, _gauge(1.0, times)),
        ],
        "inferway_cost_budget_per_1k_requests": [
            (
                {**gw, "instance": "gw-0", "service": "model", "currency": "USD"},
                _gauge(0.01, times),
            ),
        ],
        "inferway_cost_budget_per_day": [
            ({**gw, "instance": "gw-0", "service": "model", "currency": "USD"}, _gauge(200, times)),
        ],
        "inferway_cost_model_info": [
            ({**gw, "instance": "gw-0", "service": "model", "model": "resnet"}, _gauge(1, times)),
            ({**gw, "instance": "gw-1", "service": "model", "model": "resnet"}, _gauge(1, times)),
        ],
        "envoy_cluster_membership_total": [
            ({**envoy, "instance": "gw-0", "envoy_cluster_name": "model"}, _gauge(4, times)),
            ({**envoy, "instance": "gw-1", "envoy_cluster_name": "model"}, _gauge(4, times)),
            ({**envoy, "instance": "gw-0", "envoy_cluster_name": "small"}, _gauge(1, times)),
        ],
        "envoy_cluster_upstream_rq_total": [
            ({**envoy, "instance": "gw-0", "envoy_cluster_name": "model"}, _counter(100, times)),
            ({**envoy, "instance": "gw-1", "envoy_cluster_name": "model"}, _counter(100, times)),
            ({**envoy, "instance": "gw-0", "envoy_cluster_name": "small"}, _counter(10, times)),
        ],
        "inferway_backend_batch_size_sum": [
            ({**backend, "instance": "b-0"}, _counter(500, times)),
            ({**backend, "instance": "b-1"}, _counter(500, times)),
        ],
        "inferway_backend_compute_seconds_sum": [
            ({**backend, "instance": "b-0"}, _counter(0.3, times)),
            ({**backend, "instance": "b-1"}, _counter(0.5, times)),
        ],
        # the fleet's decision as Prometheus holds it during a leader hand-over: the new
        # leader's series and the old leader's last sample, overlapping for a scrape interval
        "inferway_autoscale_desired_replicas": [
            (
                {**gw, "instance": "gw-0", "namespace": "inferway", "service": "model"},
                _gauge(3, times),
            ),
            (
                {**gw, "instance": "gw-1", "namespace": "inferway", "service": "model"},
                _gauge(2, times),
            ),
        ],
    }


@pytest.fixture
async def prometheus(tmp_path: Path) -> tuple[PrometheusServer, float]:
    end = math.floor(time.time() / 3600) * 3600  # the last full hour: no sample in the future
    backfill(tmp_path / "prometheus" / "tsdb", history(end))
    server = PrometheusServer(tmp_path / "prometheus", targets=["127.0.0.1:9"])
    async with server:
        yield server, end


def report(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferway.cli.main", "report", "cost", "--prometheus", url,
         *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )  # fmt: skip


async def test_report_cost_reads_three_days_back_and_warns_before_the_budget(
    prometheus: tuple[PrometheusServer, float],
) -> None:
    server, end = prometheus
    done = report(server.url, "--window", "72h", "--end", str(end), "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    by_name = {s["service"]: s for s in document["services"]}
    assert set(by_name) == {"model", "small"}
    model = by_name["model"]
    assert model["currency"] == "USD" and model["hours"] == HOURS
    assert model["replica_hours"] == pytest.approx(4 * HOURS, rel=1e-3)
    assert model["spend"] == pytest.approx(2.4 * 4 * HOURS, rel=1e-3)  # 691.20 USD
    assert model["cost_per_hour"] == pytest.approx(9.6, rel=1e-3)
    assert model["requests"] == pytest.approx(200 * 3600 * HOURS, rel=1e-3)
    assert model["cost_per_1k_requests"] == pytest.approx(9.6 / 720, rel=1e-3)  # 0.0133
    assert model["over_budget_per_1k"] == pytest.approx(9.6 / 720 / 0.01 - 1, rel=1e-2)
    assert model["rows"] == pytest.approx(1000 * 3600 * HOURS, rel=1e-3)
    assert model["cost_per_row"] == pytest.approx(9.6 / 3.6e6, rel=1e-3)
    assert model["utilization"] == pytest.approx(0.8 / 4, rel=1e-3)
    assert model["forecast"]["method"] == "holt-winters, daily season"
    assert model["forecast"]["daily_spend"] == pytest.approx([230.4] * 3, rel=1e-2)
    assert model["warning"] == (
        "forecast spend 230.40 USD/day exceeds the budget of 200 USD/day within 24 hours"
    )
    assert model["tokens"] is None and model["cost_per_1k_tokens"] is None
    small = by_name["small"]
    # 1.00 EUR/hour of replica and (100 * 2 + 50 * 4 + 10 * 10) * 3600 / 1e6 = 1.80 of tokens
    assert small["currency"] == "EUR"
    assert small["token_spend"] == pytest.approx(1.8 * HOURS, rel=1e-3)
    assert small["spend"] == pytest.approx(2.8 * HOURS, rel=1e-3)
    assert small["tokens"] == pytest.approx(160 * 3600 * HOURS, rel=1e-3)
    assert small["cost_per_1k_tokens"] == pytest.approx(2.8 / 576, rel=1e-3)  # 0.004861
    assert small["over_budget_per_1k_tokens"] == pytest.approx(2.8 / 576 / 0.004 - 1, rel=1e-2)
    assert small["rows"] is None and small["utilization"] is None and small["warning"] is None
    totals = document["totals"]
    assert totals == {"EUR": pytest.approx(201.6, rel=1e-3), "USD": pytest.approx(691.2, rel=1e-3)}
    assert len(document["warnings"]) == 3, document["warnings"]
    assert "small: cost per 1,000 tokens 0.004861 EUR is 22% over" in document["warnings"][2]

    text = report(server.url, "--window", "1d", "--end", str(end))
    assert text.returncode == 0, text.stderr
    assert "warning: model: forecast spend" in text.stdout, text.stdout
    assert "230.40" in text.stdout and "0.0133" in text.stdout and "2.67e-06" in text.stdout
    assert "0.004861" in text.stdout and "13,824,000" in text.stdout, text.stdout


async def test_report_cost_refuses_a_bad_window_and_names_an_unreachable_prometheus(
    prometheus: tuple[PrometheusServer, float],
) -> None:
    server, _ = prometheus
    bad = report(server.url, "--window", "3 days")
    assert bad.returncode == 2 and "expected a window such as 24h, 7d or 2w" in bad.stderr
    gone = report("http://127.0.0.1:9")
    assert gone.returncode == 3 and "cannot reach Prometheus at http://127.0.0.1:9" in gone.stderr


async def test_keda_and_the_adapter_rule_read_the_fleets_count_once(
    prometheus: tuple[PrometheusServer, float],
) -> None:
    server, end = prometheus
    keda = next(r for r in build(ROOT / "tests/data/kustomize/keda") if r["kind"] == "ScaledObject")
    query = keda["spec"]["triggers"][0]["metadata"]["query"]
    rule = yaml.safe_load(
        (ROOT / "deploy/kubernetes/components/hpa/prometheus-adapter-rules.yaml").read_text()
    )["externalRules"][0]
    # what prometheus-adapter makes of it for the HPA's selector in namespace inferway
    adapter = (
        rule["metricsQuery"]
        .replace("<<.Series>>", rule["name"]["as"])
        .replace("<<.LabelMatchers>>", 'namespace="inferway",service="model"')
        .replace("<<.GroupBy>>", "namespace")
    )
    async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
        for promql in (query, adapter, rule["seriesQuery"]):
            response = await client.get(
                f"{server.url}/api/v1/query", params={"query": promql, "time": end}
            )
            body = response.json()
            assert body["status"] == "success", (promql, body)
            values = [float(r["value"][1]) for r in body["data"]["result"]]
            expected = [3.0, 2.0] if promql == rule["seriesQuery"] else [3.0]  # max, never 5
            assert sorted(values, reverse=True) == expected, promql
