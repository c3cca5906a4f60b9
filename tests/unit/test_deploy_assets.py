"""The Grafana dashboard and the Prometheus alert rules in deploy/ are well formed, and every
metric they query is one the code really exports: inferway's names are read from the real
registries of the control plane and the backend after a few real events, Envoy's from the list
the integration test checks against a real Envoy's /stats/prometheus."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway.backends.batching.records import BatchRecord
from inferway.backends.telemetry.metrics import BackendMetrics
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.control_plane_metrics import ControlPlaneMetrics
from inferway.gateway.llm.metrics import Exchange, LlmMetrics
from inferway.observability.gpu_memory import GpuMemory, GpuMemoryCollector
from inferway.observability.metric_names import ENVOY_METRICS
from inferway.policies import PolicyError, PolicyIssue, load_policy_text
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from tests.prometheus_text import parse_exposition, sample_value, wire_names

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "inferway-dashboard.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
SCRAPE = DEPLOY / "prometheus" / "prometheus.yaml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yaml"

POLICY = """\
listeners:
  - name: public
    port: 10000
services:
  - name: model-v1
    endpoints: ["127.0.0.1:8001"]
    cost:
      per_replica_hour: 2.4
      budget_per_1k_requests: 0.01
      budget_per_day: 100
      model: demo
      per_1m_input_tokens: 0.5
      per_1m_output_tokens: 1.5
      models: {big: {per_1m_output_tokens: 3}}
      budget_per_1k_tokens: 0.001
routes:
  - name: inference
    backends:
      - service: model-v1
"""


def control_plane_exposition() -> str:
    plane = ControlPlane(SnapshotCache())
    metrics = ControlPlaneMetrics.attach(plane)
    plane.apply_policy(load_policy_text(POLICY, "p.yaml"), "p.yaml")
    cache = plane.cache
    snapshot = cache.get_snapshot()
    assert snapshot is not None
    handle = cache.open_stream(base_pb2.Node(id="sidecar-1", cluster="inferway"))
    for type_url in (type_urls.CLUSTER, type_urls.ENDPOINT, type_urls.LISTENER, type_urls.ROUTE):
        cache.record_push(handle, type_url, snapshot.versions[type_url], 1)
        cache.record_ack(handle, type_url, snapshot.versions[type_url])
    cache.record_nack(handle, type_urls.ROUTE, "bad", "n1", "route rejected")
    plane.refuse(PolicyError([PolicyIssue("p.yaml", 3, 5, "listeners[0].port", "bad port")]))
    return metrics.render().decode()


def backend_exposition() -> str:
    model = SimpleNamespace(
        name="demo",
        version=1,
        load_seconds=0.2,
        executor=SimpleNamespace(queue_depth=3, in_flight_batches=1),
    )
    gpu = GpuMemoryCollector(read=lambda: [GpuMemory(0, 90, 100)])
    metrics = BackendMetrics(models=lambda: [model], ready=lambda: True, gpu=gpu)
    metrics.observe_request(model="demo", version="1", protocol="http", code=200, seconds=0.01)
    metrics.on_batch(BatchRecord("demo:1", 4, 2, [0.001, 0.002], 0.005, 0.0))
    return metrics.render().decode()


def llm_exposition() -> str:
    """The LLM processor's series after one streamed exchange (gateway/llm/metrics.py)."""
    registry = CollectorRegistry()
    LlmMetrics(registry).record(
        Exchange(
            route="chat", model="tiny", requested_model="tiny", response_model="tiny",
            backend="llama", client="k", operation="chat", stream=True, code=200,
            input_tokens=12, output_tokens=30, estimated=False, ttft_s=0.02,
            time_per_output_token_s=0.01,
        )
    )  # fmt: skip
    return generate_latest(registry).decode()


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """What the code exports, and what alerts.yaml's recording rules make of it (the recorded
    names as metric_names_in reads them: ``service:inferway_x:sum`` -> ``inferway_x:sum``)."""
    recorded = set().union(*(metric_names_in(rule["record"]) for rule in recording_rules()))
    return (
        wire_names(parse_exposition(control_plane_exposition()))
        | wire_names(parse_exposition(backend_exposition()))
        | wire_names(parse_exposition(llm_exposition()))
        | set(ENVOY_METRICS)
        | recorded
    )


# Names an expression may use that no exporter of ours defines.
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_METRIC = re.compile(r"\b(?:inferway|envoy|gen_ai)_[a-zA-Z0-9_:]*")


def metric_names_in(expr: str) -> set[str]:
    """inferway_*, envoy_* and gen_ai_* metric names a PromQL expression selects (labels
    excluded)."""
    bare = _GROUPINGS.sub(" ", _MATCHERS.sub(" ", _STRINGS.sub('""', expr)))
    return set(_METRIC.findall(bare))


def test_metric_name_extraction_skips_labels_and_groupings() -> None:
    expr = (
        'sum by (envoy_cluster_name) (rate(envoy_cluster_upstream_rq_xx{envoy_cluster_name="v1",'
        'envoy_response_code_class="5"}[5m])) / on (envoy_route) inferway_backend_ready'
    )
    assert metric_names_in(expr) == {"envoy_cluster_upstream_rq_xx", "inferway_backend_ready"}


def test_metrics_follow_prometheus_naming_conventions() -> None:
    for text in (control_plane_exposition(), backend_exposition()):
        for family in text.split("# TYPE ")[1:]:
            name, kind = family.split()[:2]
            assert name.startswith("inferway_"), name
            if kind == "counter":
                assert name.endswith("_total"), f"counter {name} without _total"
            for unit in ("_ms", "_milliseconds", "_bytes_total", "_kb", "_mb"):
                assert not name.endswith(unit), f"{name}: use base units"
    backend = parse_exposition(backend_exposition())
    assert sample_value(backend, "inferway_backend_ready") == 1
    assert sample_value(backend, "inferway_backend_gpu_memory_used_bytes", gpu="0") == 90
    assert sample_value(backend, "inferway_backend_gpu_memory_total_bytes", gpu="0") == 100
    control = parse_exposition(control_plane_exposition())
    assert sample_value(control, "inferway_xds_nacks_total", type="routes") == 1
    assert sample_value(control, "inferway_policy_refused_edits_total") == 1
    assert sample_value(control, "inferway_xds_push_duration_seconds_count") == 4


def test_a_backend_without_a_gpu_exports_no_gpu_series() -> None:
    metrics = BackendMetrics(ready=lambda: False, gpu=GpuMemoryCollector(read=lambda: []))
    names = wire_names(parse_exposition(metrics.render().decode()))
    assert "inferway_backend_ready" in names
    assert not {n for n in names if "gpu" in n}


# -- alert rules --------------------------------------------------------------------------------


def all_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    rules = [rule for rule in all_rules() if "alert" in rule]
    assert rules
    return rules


def recording_rules() -> list[dict[str, Any]]:
    rules = [rule for rule in all_rules() if "record" in rule]
    for rule in rules:
        assert set(rule) == {"record", "expr"}, rule
        assert re.fullmatch(r"[a-z]+:inferway_[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule
    return rules


def test_alert_rules_are_well_formed_and_cover_the_issue() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("warning", "critical"), rule
        assert rule["annotations"]["summary"], rule
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
    used = set().union(*(metric_names_in(rule["expr"]) for rule in rules))
    for required in (
        "envoy_vhost_route_upstream_rq_time_bucket",  # p99 latency
        "envoy_vhost_route_upstream_rq_xx",  # error rate
        "inferway_xds_nacks_total",
        "inferway_backend_ready",
        "inferway_backend_gpu_memory_used_bytes",
        "inferway_cost_budget_per_1k_requests",
        "inferway_cost_budget_per_1k_tokens",
        "inferway_cost_per_1k_tokens:rate5m",  # recorded from inferway_llm_tokens_total
        "inferway_llm_output_tokens:rate5m",  # ... per backend and model
    ):
        assert required in used, required
    by_name = {rule["alert"]: rule["expr"] for rule in rules}
    # the deployment guide's thresholds
    assert ") > 200\n" in by_name["InferwayRouteHighP99Latency"], "p99 over 200 ms"
    assert ") > 0.005\n" in by_name["InferwayRouteHighErrorRate"], "failure rate over 0.5%"
    assert "> 0.9" in by_name["InferwayBackendGpuMemoryHigh"], "GPU memory over 90%"
    assert "0.7 * avg by" in by_name["InferwayBackendReplicaLowThroughput"], "30% under mean"
    assert "\n1.15 * max by" in by_name["InferwayCostPer1kRequestsOverBudget"], "15% over budget"
    assert "\n1.15 * max by" in by_name["InferwayCostPer1kTokensOverBudget"], "15% over budget"
    assert "0.7 * avg by" in by_name["InferwayLlmBackendLowTokenThroughput"], "30% under mean"


def test_every_metric_in_the_alert_rules_is_exported(exported: set[str]) -> None:
    for rule in all_rules():
        name = rule.get("alert") or rule["record"]
        names = metric_names_in(rule["expr"])
        assert names, f"{name} queries no inferway or Envoy metric"
        unknown = names - exported
        assert not unknown, f"rule {name} uses metrics nothing exports: {unknown}"


def test_the_gateway_exports_each_service_s_cost_section() -> None:
    control = parse_exposition(control_plane_exposition())
    labels = {"service": "model-v1", "currency": "USD"}
    assert sample_value(control, "inferway_cost_per_replica_hour", **labels) == 2.4
    assert sample_value(control, "inferway_cost_budget_per_1k_requests", **labels) == 0.01
    assert sample_value(control, "inferway_cost_budget_per_day", **labels) == 100
    assert sample_value(control, "inferway_cost_model_info", service="model-v1", model="demo") == 1
    assert sample_value(control, "inferway_cost_budget_per_1k_tokens", **labels) == 0.001
    prices = {
        (model, kind): sample_value(
            control, "inferway_cost_per_1m_tokens", **labels, model=model, type=kind
        )
        for model in ("", "big")
        for kind in ("input", "output")
    }
    # the service's prices under model="", a model of cost.models with its own (an unset one 0)
    assert prices == {
        ("", "input"): 0.5,
        ("", "output"): 1.5,
        ("big", "input"): 0,
        ("big", "output"): 3,
    }


@pytest.mark.needs_binary("promtool", "checking the rules and the scrape config")
def test_promtool_accepts_the_rules_and_the_scrape_config(tmp_path: Path) -> None:
    # promtool wants the Envoy job's token file to exist: the one its comment tells to write
    for source in (SCRAPE, ALERTS):
        shutil.copy(source, tmp_path / source.name)
    token = tmp_path / "inferway-admin-token"
    token.write_text("a-token\n")
    for args in (["check", "rules", ALERTS.name], ["check", "config", SCRAPE.name]):
        done = subprocess.run(
            ["promtool", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    token.unlink()
    done = subprocess.run(
        ["promtool", "check", "config", SCRAPE.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0 and token.name in done.stdout + done.stderr


def alert_tests() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERT_TESTS.read_text())
    assert document["rule_files"] == [ALERTS.name]
    return [case for test in document["tests"] for case in test["alert_rule_test"]]


def test_every_alert_has_a_promtool_case_where_it_fires_and_one_where_it_stays_quiet() -> None:
    firing = {case["alertname"] for case in alert_tests() if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in alert_tests() if not case.get("exp_alerts")}
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts no promtool case fires"
    assert names - quiet == set(), "alerts no promtool case keeps quiet"
    assert (firing | quiet) - names == set(), "promtool cases for alerts that do not exist"


@pytest.mark.needs_binary("promtool", "running the alert rules' unit tests")
def test_promtool_rule_tests_pass() -> None:
    done = subprocess.run(
        ["promtool", "test", "rules", ALERT_TESTS.name],
        cwd=ALERT_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout


def test_scrape_example_reads_the_gateway_envoy_and_backend_endpoints() -> None:
    config = yaml.safe_load(SCRAPE.read_text())
    paths = {job["job_name"]: job["metrics_path"] for job in config["scrape_configs"]}
    assert paths == {
        "inferway-gateway": "/metrics",
        "inferway-envoy": "/envoy/stats/prometheus",
        "inferway-backend": "/metrics",
    }
    assert config["rule_files"] == ["alerts.yaml"]
    # off loopback the admin API wants its token for Envoy's stats, not for /metrics
    authorization = {job["job_name"]: job.get("authorization") for job in config["scrape_configs"]}
    assert authorization == {
        "inferway-gateway": None,
        "inferway-envoy": {"type": "Bearer", "credentials_file": "inferway-admin-token"},
        "inferway-backend": None,
    }


# -- dashboard ----------------------------------------------------------------------------------


def dashboard_panels() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    return dashboard, panels


def test_dashboard_is_well_formed() -> None:
    dashboard, panels = dashboard_panels()
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables
    for panel in panels:
        assert panel["title"] and panel["datasource"]["type"] == "prometheus", panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            for var in re.findall(r"\$(\w+)", target["expr"]):
                assert var in variables or var.startswith("__"), f"undefined ${var}"
    positions = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in dashboard["panels"]]
    assert len(positions) == len(set(positions)), "panels overlap"


def test_dashboard_covers_the_issue_and_queries_only_exported_metrics(
    exported: set[str],
) -> None:
    dashboard, panels = dashboard_panels()
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":  # label_values(<selector>, <label>)
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["query"]["query"])
            assert match, variable
            exprs.append(match.group(1))
    used: set[str] = set()
    for expr in exprs:
        names = metric_names_in(expr)
        assert names, f"queries no metric: {expr}"
        unknown = names - exported
        assert not unknown, f"dashboard uses metrics nothing exports: {unknown} in {expr}"
        used |= names
    for required in (
        "envoy_vhost_route_upstream_rq_total",  # request rate per route
        "envoy_cluster_upstream_rq_total",  # ... per canary version
        "envoy_vhost_route_upstream_rq_xx",  # error rate
        "envoy_cluster_upstream_rq_time_bucket",  # p50/p99 per version
        "envoy_vhost_route_upstream_rq_time_bucket",  # p50/p99 per route
        "inferway_backend_batch_size_bucket",
        "inferway_backend_queue_depth",
        "inferway_backend_compute_seconds_bucket",
        "inferway_xds_pushes_total",
        "inferway_xds_nacks_total",
        # cost (recorded series: service:inferway_cost_per_hour:sum, ...)
        "inferway_cost_per_hour:sum",
        "inferway_cost_per_1k_requests:rate5m",
        "inferway_cost_budget_per_1k_requests",
        "inferway_cost_per_row:rate5m",
        "inferway_backend_utilization:rate5m",
        # LLM: tokens/s, TTFT, ITL, cost per 1,000 tokens
        "inferway_llm_tokens_total",
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_time_per_output_token_seconds_bucket",
        "inferway_cost_per_1k_tokens:rate5m",
        "inferway_cost_budget_per_1k_tokens",
    ):
        assert required in used, required
    quantiles = " ".join(exprs)
    assert "histogram_quantile(0.5," in quantiles and "histogram_quantile(0.99," in quantiles
