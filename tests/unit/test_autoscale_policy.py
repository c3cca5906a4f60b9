"""``services[].autoscale`` in the policy: both forms load, each bad field is a located error."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.gateway.autoscale_policy import autoscale_configs
from inferway.policies import PolicyError, dump_policy, load_policy_text

HEAD = (
    "listeners: [{name: main, port: 10000}]\n"
    "services:\n"
    "  - name: m\n"
    "    replicas: {command: 'serve {port}', min: 1, max: 8}\n"
    "    autoscale:\n"
)
TAIL = "routes:\n  - name: all\n    backends: [{service: m}]\n"


def _text(*lines: str) -> str:
    return HEAD + "".join(f"      {line}\n" for line in lines) + TAIL


def _errors(*lines: str) -> list[str]:
    text = _text(*lines)
    with pytest.raises(PolicyError) as caught:  # a bad block: the policy does not load
        load_policy_text(text, "p.yaml")
    return [str(issue) for issue in caught.value.issues]


def test_the_native_form_builds_its_config_and_round_trips() -> None:
    text = _text(
        "algorithm: threshold",
        "metric: in_flight",
        "threshold: {threshold: 4, scale_in_threshold: 1}",
    )
    policy = load_policy_text(text, "p.yaml")
    (config,) = autoscale_configs(policy).values()
    assert (config.service, config.algorithm, config.metric) == ("m", "threshold", "in_flight")
    assert load_policy_text(dump_policy(policy)) == policy


def test_the_scaling_policy_rule_form_is_accepted_as_the_issue_writes_it() -> None:
    text = _text(
        "scaling_policy: {metric_type: queue_length, threshold: 1000, action: add_instance,"
        " cooldown: 300}",
        "instance_type: gpu-8x",
        "min_size: 2",
        "max_size: 16",
    )
    policy = load_policy_text(text, "p.yaml")
    config = autoscale_configs(policy)["m"]
    assert (config.algorithm, config.metric, config.instance_type) == (
        "threshold",
        "queue_length",
        "gpu-8x",
    )
    assert (config.limits.min_replicas, config.limits.max_replicas) == (2, 16)


def test_each_bad_field_is_located_on_its_line() -> None:
    errors = _errors("metric: qps", "sampling_interval: 10", "cooldown: 2")
    assert any(e.startswith("p.yaml:6:15: services[0].autoscale.metric:") for e in errors)
    assert any("unknown metric 'qps'" in e for e in errors)
    assert any(e.startswith("p.yaml:8:") and "autoscale.cooldown" in e for e in errors), errors


def test_a_number_that_is_not_finite_is_refused_where_it_is_written() -> None:
    errors = _errors("target: .inf", "cooldown: {up: .nan}")
    assert any(
        e.startswith("p.yaml:6:15: services[0].autoscale.target: expected a finite") for e in errors
    ), errors
    assert any("autoscale.cooldown.up: expected a finite number" in e for e in errors), errors


def test_an_integer_beyond_any_float_is_refused_not_a_traceback() -> None:
    """Found by bench/fuzz_policies.py: a 313-digit cooldown raised OverflowError."""
    errors = _errors("target: 5", f"cooldown: {{up: 1{'0' * 400}}}")
    assert any(
        "autoscale.cooldown.up: expected a number at most 1e+300, got 401 digits" in e
        for e in errors
    ), errors


def test_an_unknown_key_and_a_bad_rule_are_located() -> None:
    (unknown,) = _errors("algorithm: proportional", "target: 5", "colldown: 30")
    assert (
        unknown.startswith("p.yaml:") and "services[0].autoscale.colldown: unknown key" in unknown
    )
    errors = _errors("scaling_policy: {metric_type: qps, threshold: 1, action: add_instance}")
    assert any("services[0].autoscale.scaling_policy" in e and "qps" in e for e in errors), errors


def test_autoscale_without_replicas_is_a_located_error() -> None:
    text = (
        "listeners: [{name: main, port: 10000}]\nservices:\n  - name: m\n"
        "    endpoints: [{host: 127.0.0.1, port: 8000}]\n"
        "    autoscale: {metric: in_flight, target: 2}\n" + TAIL
    )
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    (error,) = [str(i) for i in caught.value.issues]
    assert error.startswith("p.yaml:5:16: services[0].autoscale:")
    assert "without replicas" in error and "scale_target" in error


def test_the_autoscale_example_builds() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "autoscale.yaml"
    text = path.read_text()
    policy = load_policy_text(text, str(path))
    assert set(autoscale_configs(policy)) == {"model"}


def test_validate_reports_a_bad_block_located(tmp_path: Path) -> None:
    from inferway.cli.validate import check_policy_file

    path = tmp_path / "p.yaml"
    path.write_text(_text("metric: qps"))
    issues, summary = check_policy_file(path, None, envoy=False)
    assert summary is None
    (metric,) = [i for i in issues if i.path == "services[0].autoscale.metric"]
    assert metric.line == 6 and "unknown metric 'qps'" in metric.message


@pytest.mark.parametrize(
    "lines",
    [
        ("algorithm: pid", "target: 3", "pid: {kp: 0.5}"),
        ("algorithm: predictive", "target: 3", "predictive: {season: null}", "panic: false"),
        (
            "scaling_policy: {metric_type: in_flight, threshold: 4, action: add_instance}",
            "min_size: 2",
        ),
    ],
)
def test_a_dumped_block_loads_back_as_it_was(lines: tuple[str, ...]) -> None:
    """The block is dumped as written: a default the algorithm does not use (a pid's
    tolerance) must not come back as a key it refuses, nor an explicit null as a default."""
    policy = load_policy_text(_text(*lines), "p.yaml")
    assert load_policy_text(dump_policy(policy)) == policy


def test_a_policy_is_compiled_once_for_every_driver(tmp_path: Path) -> None:
    """plan_gateway compiles the loops of the policy it plans; the drivers handed that policy
    get the same compiled configs, not a second parse."""
    from inferway.gateway.loop_configs import compile_loops
    from inferway.gateway.runtime import GatewayOptions, plan_gateway

    path = tmp_path / "p.yaml"
    path.write_text(_text("metric: in_flight", "target: 4"))
    plan = plan_gateway(GatewayOptions(policy_path=path))
    assert compile_loops(plan.policy) is plan.loops
    assert plan.loops.autoscale["m"].config.params.target == 4.0
    assert plan.loops.autoscale["m"].target.kind == "replicas"
    again = load_policy_text(path.read_text(), str(path))
    assert compile_loops(again) is not plan.loops, "another policy object: compiled anew"
