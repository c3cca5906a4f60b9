"""The rollout wiring's pure parts: Envoy's Prometheus text -> window samples (counter
resets included), the persisted state, policy -> controller config, located policy errors,
the canary's forced routes, and the driver writing weights into a real ControlPlane."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
import typing
from pathlib import Path

import pytest

from inferway.controllers.rollout.config import (
    AgreementCheck,
    ErrorRateCheck,
    LatencyCheck,
    MetricName,
)
from inferway.controllers.rollout.evidence import VersionCounts, WindowSample
from inferway.controllers.rollout.state import Phase, RolloutState
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.rollouts.config import build_rollout_config
from inferway.gateway.rollouts.driver import RolloutDriver
from inferway.gateway.rollouts.envoy_stats import (
    ScrapeError,
    build_window,
    parse_cluster_totals,
)
from inferway.gateway.rollouts.schedule import next_tick
from inferway.gateway.rollouts.store import RolloutStore, RolloutTarget
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.rollouts import METRIC_NEEDS, RolloutMetricName
from inferway.resolve import resolve_policy
from inferway.xds.cache import SnapshotCache
from tests.rollout_samples import TWO_VERSION_ROLLOUT


def _stats(cluster: str, ok: int, bad: int, buckets: dict[str, int]) -> str:
    xx = "envoy_cluster_upstream_rq_xx{envoy_response_code_class="
    lines = [
        "# TYPE envoy_cluster_upstream_rq_xx counter",
        f'{xx}"2",envoy_cluster_name="{cluster}"}} {ok}',
        f'{xx}"5",envoy_cluster_name="{cluster}"}} {bad}',
        f'envoy_cluster_upstream_rq_completed{{envoy_cluster_name="{cluster}"}} {ok + bad}',
        "# TYPE envoy_cluster_upstream_rq_time histogram",
    ]
    lines += [
        f'envoy_cluster_upstream_rq_time_bucket{{envoy_cluster_name="{cluster}",le="{le}"}} {n}'
        for le, n in buckets.items()
    ]
    return "\n".join(lines) + "\n"


def test_envoy_text_becomes_totals_per_cluster() -> None:
    text = _stats("v1", 90, 10, {"1": 50, "5": 95, "+Inf": 100}) + _stats(
        "other", 5, 0, {"+Inf": 5}
    )
    totals = parse_cluster_totals(text, ["v1", "v2"])
    assert totals["v1"].requests == 100 and totals["v1"].errors == 10
    assert totals["v1"].buckets == {1.0: 50, 5.0: 95, math.inf: 100}
    assert totals["v2"].requests == 0, "a cluster Envoy does not report has zero totals"
    with pytest.raises(ScrapeError, match="not Prometheus text"):
        parse_cluster_totals("{not: prometheus}", ["v1"])


def test_a_window_is_the_difference_between_scrapes_with_bucket_counts() -> None:
    before = parse_cluster_totals(
        _stats("v1", 90, 10, {"1": 50, "5": 95, "+Inf": 100})
        + _stats("v2", 9, 1, {"1": 5, "5": 10, "+Inf": 10}),
        ["v1", "v2"],
    )
    now = parse_cluster_totals(
        _stats("v1", 180, 20, {"1": 100, "5": 190, "+Inf": 200})
        + _stats("v2", 19, 1, {"1": 5, "5": 19, "+Inf": 20}),
        ["v1", "v2"],
    )
    window = build_window(before, now, stable="v1", canary="v2")
    assert window.stable == VersionCounts(100, 10, {1.0: 50, 5.0: 45, 10.0: 5})
    assert window.canary == VersionCounts(10, 0, {5.0: 9, 10.0: 1})


def test_an_envoy_restart_resetting_counters_counts_from_zero_never_negative() -> None:
    before = parse_cluster_totals(_stats("v2", 1000, 50, {"5": 1050, "+Inf": 1050}), ["v2"])
    after_restart = parse_cluster_totals(_stats("v2", 30, 2, {"5": 32, "+Inf": 32}), ["v2"])
    window = build_window(before, after_restart, stable="v1", canary="v2")
    assert window.canary == VersionCounts(32, 2, {5.0: 32})
    assert window.stable == VersionCounts(0, 0, {})


def test_state_is_saved_atomically_and_read_back(tmp_path: Path) -> None:
    store = RolloutStore(tmp_path / "rollouts")
    assert store.load("r") is None
    state = RolloutState(name="r", phase=Phase.PROGRESSING, step=2, weight=2500, reason="x")
    target = RolloutTarget("inference", "v1", "v2")
    store.save(target, state)
    state.step = 3
    store.save(target, state)
    saved = store.load("r")
    assert saved is not None and saved[0] == target
    loaded = saved[1]
    assert (loaded.step, loaded.weight, loaded.phase) == (
        3,
        2500,
        Phase.PROGRESSING,
    )
    assert sorted(p.name for p in store.directory.iterdir()) == ["r.json"], "no temp file left"
    store.path("r").write_text("{broken")
    with pytest.raises(ValueError, match=r"r\.json: Expecting"):
        store.load("r")


POLICY = (
    TWO_VERSION_ROLLOUT
    + """    steps: [0.1, 1, {weight: 5, pause: 10m}, 100]
    analysis:
      interval: 2s
      min_requests: 50
      metrics:
        - {name: error-rate, max_increase: 0.5%}
        - {name: latency-p99, max_increase: 20%}
    match: [{headers: [{name: x-canary, exact: "true"}]}]
"""
)


def test_the_policy_becomes_the_controllers_config_in_its_units() -> None:
    config = build_rollout_config(load_policy_text(POLICY, "p.yaml").rollouts[0])
    assert config.step_parts == (10, 100, 500, 10_000)
    assert config.steps[2].pause_s == 600.0
    assert config.analysis.interval_s == 2.0 and config.analysis.min_requests == 50
    assert config.analysis.checks == (ErrorRateCheck(0.005), LatencyCheck(0.2))


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("route: inference", "route: inferenc", "p.yaml:11:12: rollouts[0].route: unknown route"),
        ("canary: v2", "canary: v9", "p.yaml:13:13: rollouts[0].canary: unknown service 'v9'"),
        ("0.1, 1,", "1, 0.5,", "p.yaml:14:16: rollouts[0].steps[1]: steps must increase"),
        ("0.1, 1,", "0.15, 1,", "p.yaml:14:13: rollouts[0].steps[0]: step weight must be"),
        ("0.5%", "half", "rollouts[0].analysis.metrics[0].max_increase: expected a percentage"),
    ],
)
def test_bad_rollouts_are_refused_with_file_and_line(old: str, new: str, expected: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(POLICY.replace(old, new), "p.yaml")
    assert expected in str(caught.value), str(caught.value)


def test_a_canary_off_the_route_and_two_rollouts_on_one_route_are_refused() -> None:
    text = POLICY.replace("routes:\n", '  - {name: v3, endpoints: ["127.0.0.1:3"]}\nroutes:\n') + (
        "  - name: second\n    route: inference\n    stable: v1\n    canary: v3\n    steps: [50]\n"
    )
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    message = str(caught.value)
    assert "rollouts[1].route: route 'inference' already has a rollout (rollouts[0])" in message
    assert "rollouts[1].canary: canary 'v3' is not a backend of route 'inference'" in message


def test_match_headers_route_to_the_canary_ahead_of_the_weighted_route() -> None:
    ir = resolve_policy(load_policy_text(POLICY, "p.yaml"))
    routes = ir.listeners[0].routes
    assert [r.name for r in routes] == ["inference-canary-0", "inference"]
    forced = routes[0]
    assert [(b.service, b.weight) for b in forced.backends] == [("v2", 10_000)]
    assert [(h.name, h.exact) for h in forced.match.headers] == [("x-canary", "true")]


STICKY = POLICY.replace(
    "    match: [{headers:", "    sticky: {header: x-user-id}\n    match: [{headers:"
)


def test_a_rollouts_sticky_becomes_its_routes_hash_policy() -> None:
    ir = resolve_policy(load_policy_text(STICKY, "p.yaml"))
    route = ir.listeners[0].routes[1]
    assert route.name == "inference" and route.sticky, "use_hash_policy on the weighted route"
    assert [h.header for h in route.hash_policies] == ["x-user-id"]
    same = STICKY.replace("    backends: [{", "    hash: {header: x-user-id}\n    backends: [{")
    assert resolve_policy(load_policy_text(same, "p.yaml")).listeners[0].routes[1].sticky


def test_a_sticky_that_contradicts_the_routes_hash_is_refused_where_it_is_written() -> None:
    text = STICKY.replace(
        "    backends: [{", "    hash: {cookie: {name: session}}\n    backends: [{"
    )
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    message = str(caught.value)
    assert "p.yaml:22:13: rollouts[0].sticky: route 'inference' already hashes on cookie " in (
        message
    ), message
    assert "header 'x-user-id'" in message


class _Script:
    """A metric source replaying windows (the driver's only input besides commands)."""

    def __init__(self, windows: list[WindowSample | None]) -> None:
        self.windows = windows

    async def sample(self) -> WindowSample | None:
        return self.windows.pop(0) if self.windows else None


def _good(n: int) -> WindowSample:
    return WindowSample(stable=VersionCounts(n, 0, {5.0: n}), canary=VersionCounts(n, 0, {1.0: n}))


def test_the_driver_writes_weights_into_state_and_resumes_from_disk(tmp_path: Path) -> None:
    policy = load_policy_text(POLICY.replace("min_requests: 50", "min_requests: auto"), "p.yaml")
    now = [1000.0]

    def make_driver() -> tuple[ControlPlane, RolloutDriver]:
        plane = ControlPlane(SnapshotCache())
        driver = RolloutDriver(
            plane,
            RolloutStore(tmp_path),
            lambda config: _Script([_good(2000) for _ in range(3)]),
            clock=lambda: now[0],
        )
        plane.add_observer(driver)
        plane.apply_policy(policy, "p.yaml", state=driver.resolve_state(policy, plane.state))
        return plane, driver

    plane, driver = make_driver()
    assert dict(plane.state.weights) == {}, "not started: the policy's weights apply"
    start = asyncio.run(driver.tick("demo-v2"))
    assert start is not None and start.action == "start"
    assert dict(plane.state.weights["inference"]) == {"v1": 99.9, "v2": 0.1}
    now[0] += 5
    advance = asyncio.run(driver.tick("demo-v2"))
    assert advance is not None and advance.action == "advance", advance
    assert dict(plane.state.weights["inference"]) == {"v1": 99.0, "v2": 1.0}

    plane2, driver2 = make_driver()  # a restart: same workdir, fresh control plane
    assert dict(plane2.state.weights["inference"]) == {"v1": 99.0, "v2": 1.0}
    assert driver2.status("demo-v2")["step"] == 1
    assert driver2.command("demo-v2", "abort").action == "abort"
    assert dict(plane2.state.weights["inference"]) == {"v1": 100.0, "v2": 0.0}

    edited = load_policy_text(POLICY.split("rollouts:")[0], "p.yaml")
    plane2.apply_policy(edited, "p.yaml", state=driver2.resolve_state(edited, plane2.state))
    assert dict(plane2.state.weights) == {}, "a removed rollout drops its weights"
    assert driver2.names() == []


def test_saved_state_of_another_target_is_not_resumed(tmp_path: Path) -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    saved = RolloutState(name="demo-v2", phase=Phase.PROGRESSING, step=1, weight=100)
    RolloutStore(tmp_path).save(RolloutTarget("inference", "v1", "v9"), saved)
    plane = ControlPlane(SnapshotCache())
    driver = RolloutDriver(plane, RolloutStore(tmp_path), lambda config: _Script([]))
    plane.add_observer(driver)
    plane.apply_policy(policy, "p.yaml", state=driver.resolve_state(policy, plane.state))
    assert dict(plane.state.weights) == {}
    assert driver.status("demo-v2")["phase"] == "waiting"


def test_saved_state_beyond_the_policys_steps_starts_over(tmp_path: Path) -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    saved = RolloutState(name="demo-v2", phase=Phase.PROGRESSING, step=7, weight=100)
    RolloutStore(tmp_path).save(RolloutTarget("inference", "v1", "v2"), saved)
    plane = ControlPlane(SnapshotCache())
    driver = RolloutDriver(plane, RolloutStore(tmp_path), lambda config: _Script([]))
    plane.add_observer(driver)
    plane.apply_policy(policy, "p.yaml", state=driver.resolve_state(policy, plane.state))
    assert dict(plane.state.weights) == {}, "no weight from a state the controller refuses"
    assert driver.status("demo-v2")["phase"] == "waiting"


def test_every_decision_is_logged_with_its_numbers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = load_policy_text(POLICY.replace("min_requests: 50", "min_requests: auto"), "p.yaml")
    plane = ControlPlane(SnapshotCache())
    driver = RolloutDriver(
        plane, RolloutStore(tmp_path), lambda config: _Script([_good(2000), _good(2000)])
    )
    plane.add_observer(driver)
    plane.apply_policy(policy, "p.yaml", state=driver.resolve_state(policy, plane.state))
    with caplog.at_level("DEBUG", logger="inferway.gateway.rollouts.driver"):
        asyncio.run(driver.tick("demo-v2"))
        asyncio.run(driver.tick("demo-v2"))
    start, hold = [r for r in caplog.records if hasattr(r, "rollout_event")]
    assert start.levelname == "INFO" and '"action": "start"' in start.getMessage()
    assert hold.levelname == "DEBUG"
    event = json.loads(hold.rollout_event)
    assert event["window"]["canary_requests"] == 2000
    assert {v["check"]: v["result"] for v in event["verdicts"]}["error-rate"] in (
        "pass",
        "need_more",
    )
    assert '"verdicts": {"error-rate"' in hold.getMessage()


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("{name: output-agreement, min: 99%}", "output-agreement needs 'via: mirror'"),
        ("{name: error-rate, max_increase: 1%, via: mirror}", "no other metric takes 'via'"),
        ("{name: output-agreement, min: 100%, via: mirror}", "must be below 100%"),
        (
            "{name: output-agreement, min: 99%, via: mirror}",
            "p.yaml:19:51: rollouts[0].analysis.metrics[0].via: output-agreement compares "
            "mirrored answers, but route 'inference' does not mirror to the canary 'v2'",
        ),
    ],
)
def test_output_agreement_needs_a_mirror_to_the_canary(metric: str, expected: str) -> None:
    text = POLICY.replace("- {name: error-rate, max_increase: 0.5%}", f"- {metric}")
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    assert expected in str(caught.value), str(caught.value)


def test_output_agreement_becomes_the_controllers_agreement_check() -> None:
    text = POLICY.replace(
        "backends: [{service: v1, weight: 100}, {service: v2, weight: 0}]",
        "backends: [{service: v1, weight: 100}, {service: v2, weight: 0}]\n"
        "    mirror: {service: v2}",
    ).replace(
        "- {name: error-rate, max_increase: 0.5%}",
        "- {name: output-agreement, min: 99%, via: mirror}",
    )
    config = build_rollout_config(load_policy_text(text, "p.yaml").rollouts[0])
    assert config.analysis.checks == (AgreementCheck(0.99), LatencyCheck(0.2))


def test_backend_metrics_become_checks_on_the_backends_counts() -> None:
    text = POLICY.replace(
        "        - {name: latency-p99, max_increase: 20%}\n",
        "        - {name: latency-p99, max_increase: 20%}\n"
        "        - {name: backend-latency-p99, max_increase: 10%}\n"
        "        - {name: backend-error-rate, max_increase: 1%}\n",
    )
    config = build_rollout_config(load_policy_text(text, "p.yaml").rollouts[0])
    assert config.analysis.checks[2:] == (
        LatencyCheck(0.1, MetricName.BACKEND_LATENCY_P99),
        ErrorRateCheck(0.01, MetricName.BACKEND_ERROR_RATE),
    )
    assert config.needs_backend_metrics
    assert not build_rollout_config(
        load_policy_text(POLICY, "p.yaml").rollouts[0]
    ).needs_backend_metrics


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("{name: v2, endpoints", "{name: v2, protocol: http2, endpoints"),
            "p.yaml:20:18: rollouts[0].analysis.metrics[1].name: backend-latency-p99 scrapes "
            "the backends' /metrics on their HTTP port, but canary 'v2' is protocol http2",
        ),
        (
            ("{name: v1, endpoints", "{name: v1, tls: {mode: tls}, endpoints"),
            "p.yaml:20:18: rollouts[0].analysis.metrics[1].name: backend-latency-p99 scrapes "
            "the backends' /metrics over plain HTTP, but stable 'v1' is reached over TLS",
        ),
        (
            ("{name: latency-p99,", "{name: backend-latency-p99,"),
            "rollouts[0].analysis.metrics[1].name: metric backend-latency-p99 is already given",
        ),
        (
            ("{name: latency-p99,", "{name: backend-latency,"),
            "p.yaml:19:18: rollouts[0].analysis.metrics[0].name: expected 'error-rate', "
            "'latency-p99', 'backend-error-rate', 'backend-latency-p99'",
        ),
    ],
)
def test_bad_backend_metrics_are_refused_where_they_are_written(
    edit: tuple[str, str], expected: str
) -> None:
    text = POLICY.replace(
        "        - {name: latency-p99, max_increase: 20%}\n",
        "        - {name: latency-p99, max_increase: 20%}\n"
        "        - {name: backend-latency-p99, max_increase: 10%}\n",
    ).replace("        - {name: error-rate, max_increase: 0.5%}\n", "")
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text.replace(*edit, 1), "p.yaml")
    assert expected in str(caught.value), str(caught.value)


def test_resolving_a_refused_edit_changes_nothing_the_driver_owns(tmp_path: Path) -> None:
    """``resolve_state`` runs for every edit before it is applied; an edit that is then
    refused must not make the driver forget the live rollout's route, or a later edit that
    removes the rollout keeps its weights in State."""
    policy = load_policy_text(POLICY.replace("min_requests: 50", "min_requests: auto"), "p.yaml")
    plane = ControlPlane(SnapshotCache())
    driver = RolloutDriver(
        plane, RolloutStore(tmp_path), lambda config: _Script([_good(2000)]), clock=lambda: 1.0
    )
    plane.add_observer(driver)
    plane.apply_policy(policy, "p.yaml", state=driver.resolve_state(policy, plane.state))
    asyncio.run(driver.tick("demo-v2"))
    live = plane.state
    assert dict(live.weights["inference"]) == {"v1": 99.9, "v2": 0.1}

    assert driver.resolve_state(policy, live) is live, "the live rollout's weights stay"
    without = load_policy_text(POLICY.split("rollouts:")[0], "p.yaml")
    assert dict(driver.resolve_state(without, live).weights) == {}  # read for an edit...
    assert plane.state is live  # ...that is refused: nothing applied
    again = driver.resolve_state(without, live)  # the next edit removes the rollout too
    assert dict(again.weights) == {}, "the removed rollout's weights must not stay"


def test_the_schedule_keeps_its_phase_when_a_tick_runs_long() -> None:
    assert next_tick(100.0, 100.3, 1.0) == pytest.approx((101.0, 0.7))  # not 1.0 after the end
    assert next_tick(100.0, 102.5, 1.0) == pytest.approx((103.0, 0.5))  # missed slots skipped
    assert next_tick(100.0, 101.0, 1.0) == pytest.approx((102.0, 1.0))
    assert next_tick(100.0, 50.0, 1.0) == pytest.approx((51.0, 1.0))  # wall clock set back


def test_the_loop_ticks_on_the_clock_schedule_however_long_a_scrape_takes(
    tmp_path: Path,
) -> None:
    """Each scrape takes 0.15 s of a 0.4 s interval: ticks start 0.4 s apart (the old loop
    slept the whole interval after each tick, so they drifted to 0.55 s apart)."""
    started: list[float] = []

    class _Slow:
        async def sample(self) -> WindowSample | None:
            started.append(time.monotonic())
            await asyncio.sleep(0.15)
            return None

    text = POLICY.replace("interval: 2s", "interval: 400ms")
    policy = load_policy_text(text, "p.yaml")

    async def run() -> None:
        plane = ControlPlane(SnapshotCache())
        driver = RolloutDriver(
            plane, RolloutStore(tmp_path), lambda config: _Slow(), clock=time.monotonic
        )
        plane.add_observer(driver)
        plane.apply_policy(policy, "p.yaml", state=driver.resolve_state(policy, plane.state))
        await driver.start()
        await asyncio.sleep(1.75)
        await driver.stop()

    asyncio.run(run())
    assert len(started) >= 4, started
    gaps = [b - a for a, b in itertools.pairwise(started)]
    assert all(abs(gap - 0.4) < 0.1 for gap in gaps), gaps


def test_the_policy_and_the_controller_name_the_same_metrics() -> None:
    assert set(typing.get_args(RolloutMetricName)) == {m.value for m in MetricName}
    assert set(METRIC_NEEDS) == {m.value for m in MetricName}
