"""The replica manager's pure decisions: command lines, devices, backoff, what to stop."""

from __future__ import annotations

import pytest

from inferway.gateway.actuators.envoy_drain import HostLoad, read_host_load
from inferway.gateway.actuators.replica_plan import (
    ReconcilePlan,
    ReplicaState,
    ReplicaStatus,
    ReplicaView,
    ServiceReplicasStatus,
    assign_device,
    backoff_delay,
    build_command,
    build_environment,
    build_readiness_url,
    choose_to_stop,
    failures_after_crash,
    plan_reconcile,
)
from inferway.policies.replicas import Backoff, Replicas

READY, WAITING, STARTING, FAILED = (
    ReplicaState.READY,
    ReplicaState.WAITING,
    ReplicaState.STARTING,
    ReplicaState.FAILED,
)


def spec(**fields: object) -> Replicas:
    data: dict[str, object] = {"command": "serve --http-port {port}", "max": 4}
    data.update(fields)
    return Replicas.model_validate(data)


def test_command_words_are_filled_in_without_a_shell() -> None:
    s = spec(
        command="serve 'a dir/m' --http-port {port} --grpc-port={grpc_port} -n {service}-{index}"
    )
    argv = build_command(s, "llama", 2, 8001, 9001, None)
    assert argv == [
        "serve",
        "a dir/m",
        "--http-port",
        "8001",
        "--grpc-port=9001",
        "-n",
        "llama-2",
    ]


def test_a_filled_in_value_never_becomes_a_second_word() -> None:
    s = spec(command="serve --http-port {port} --device {device}")
    assert build_command(s, "m", 0, 1, 2, "0 --evil")[-1] == "0 --evil"


def test_environment_gets_the_device_and_filled_in_values() -> None:
    s = spec(env={"PORT": "{port}", "KEEP": "x"}, devices=["0", "1", "2", "3"])
    env = build_environment(s, {"PATH": "/bin"}, "m", 1, 8001, 9001, "3")
    assert env == {"PATH": "/bin", "PORT": "8001", "KEEP": "x", "CUDA_VISIBLE_DEVICES": "3"}
    assert "CUDA_VISIBLE_DEVICES" not in build_environment(spec(), {}, "m", 0, 1, 2, None)


def test_readiness_path_or_url() -> None:
    assert build_readiness_url(spec(), "m", 0, 8001, 9001, None) == (
        "http://127.0.0.1:8001/v2/health/ready"
    )
    url = spec(readiness="http://{host}:{grpc_port}/ok", host="::1")
    assert build_readiness_url(url, "m", 0, 8001, 9001, None) == "http://::1:9001/ok"
    assert build_readiness_url(spec(host="::1"), "m", 0, 8001, 9001, None).startswith(
        "http://[::1]:8001/"
    )


def test_each_replica_gets_its_own_device_until_they_run_out() -> None:
    devices = ["0", "1", "2"]
    assert assign_device(devices, [], share=False) == "0"
    assert assign_device(devices, ["0", "2"], share=False) == "1"
    with pytest.raises(LookupError, match="every device is in use"):
        assign_device(devices, ["0", "1", "2"], share=False)
    assert assign_device(devices, ["0", "1", "2", "0"], share=True) == "1"
    assert assign_device(None, ["0"], share=False) is None


def test_backoff_doubles_up_to_max_then_gives_up() -> None:
    b = Backoff(initial=0.5, max=3, give_up_after=5)
    assert [backoff_delay(b, n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, None]


def test_a_replica_that_served_long_enough_starts_its_backoff_over() -> None:
    assert failures_after_crash(4, ready_since=100.0, now=129.0, stable_after=30) == 5
    assert failures_after_crash(4, ready_since=100.0, now=130.0, stable_after=30) == 1
    assert failures_after_crash(2, ready_since=None, now=500.0, stable_after=30) == 3


def test_scale_in_stops_replicas_without_capacity_first_then_the_newest() -> None:
    replicas = [(0, READY), (1, READY), (2, STARTING), (3, READY), (4, FAILED), (5, WAITING)]
    assert choose_to_stop(replicas, 3) == [4, 5, 2]
    assert choose_to_stop(replicas, 5) == [4, 5, 2, 3, 1]
    assert choose_to_stop(replicas, 0) == []


def view(
    index: int,
    state: ReplicaState,
    *,
    gen: int = 0,
    device: str | None = None,
    stopping: bool = False,
) -> ReplicaView:
    return ReplicaView(index, gen, state, device, stopping)


def test_reconcile_starts_the_missing_replicas_on_free_devices() -> None:
    plan = plan_reconcile(3, 0, [view(0, READY, device="1")], ["0", "1", "2"], share=False)
    assert plan == ReconcilePlan(start=("0", "2"))


def test_reconcile_waits_for_a_device_held_by_a_stopping_replica() -> None:
    replicas = [
        view(0, READY, device="0"),
        view(1, ReplicaState.DRAINING, device="1", stopping=True),
    ]
    plan = plan_reconcile(2, 0, replicas, ["0", "1"], share=False)
    assert plan == ReconcilePlan()  # started once replica 1 is gone


def test_reconcile_scales_in_without_stopping_twice() -> None:
    replicas = [view(0, READY), view(1, READY), view(2, READY, stopping=True), view(3, READY)]
    assert plan_reconcile(1, 0, replicas, None, share=False).stop == (
        (3, "scale in"),
        (1, "scale in"),
    )


def test_a_new_spec_replaces_old_replicas_only_as_new_ones_become_ready() -> None:
    old = [view(0, READY), view(1, READY)]
    assert plan_reconcile(2, 1, old, None, share=False) == ReconcilePlan(start=(None, None))
    mixed = [*old, view(2, READY, gen=1), view(3, STARTING, gen=1)]
    assert plan_reconcile(2, 1, mixed, None, share=False).stop == ((1, "replaced"),)


def test_a_new_spec_with_every_device_held_replaces_one_at_a_time() -> None:
    old = [view(0, READY, device="0"), view(1, READY, device="1")]
    assert plan_reconcile(2, 1, old, ["0", "1"], share=False).stop == ((1, "replaced"),)


def test_envoy_lists_a_host_until_it_applied_the_removal() -> None:
    document = {
        "cluster_statuses": [
            {"name": "other", "host_statuses": [_host("127.0.0.1", 8001, 9)]},
            {"name": "model", "host_statuses": [_host("127.0.0.1", 8001, 2)]},
        ]
    }
    assert read_host_load(document, "model", "127.0.0.1", 8001) == HostLoad(True, 2)
    assert read_host_load(document, "model", "127.0.0.1", 8002) == HostLoad(False)
    assert read_host_load({}, "model", "127.0.0.1", 8001) == HostLoad(False)


def _host(address: str, port: int, active: int) -> dict[str, object]:
    return {
        "address": {"socket_address": {"address": address, "port_value": port}},
        "stats": [{"name": "rq_active", "value": str(active), "type": "GAUGE"}],
    }


def replica(index: int, state: ReplicaState, **fields: object) -> ReplicaStatus:
    base: dict[str, object] = {
        "port": 8000 + index,
        "grpc_port": None,
        "pid": None,
        "device": None,
        "restarts": 0,
        "failures": 0,
        "last_error": None,
        "retry_in": None,
    }
    base.update(fields)
    return ReplicaStatus("m", index, state, **base)  # type: ignore[arg-type]


def test_status_counts_only_ready_replicas_as_capacity_and_reads_for_a_person() -> None:
    status = ServiceReplicasStatus(
        "m",
        desired=2,
        min=1,
        max=3,
        replicas=(
            replica(0, READY, pid=41, device="0"),
            replica(1, WAITING, restarts=2, failures=2, last_error="exited (1)", retry_in=1.5),
        ),
    )
    assert status.ready == 1
    assert status.lines() == [
        "m: 1 ready of 2 desired (min 1, max 3)",
        "  [0] ready, port 8000, pid 41, device 0, restarts 0",
        "  [1] waiting, port 8001, restarts 2, retry in 1.5s, last error: exited (1)",
    ]
    data = status.to_json()
    assert data["ready"] == 1 and data["replicas"][1]["state"] == "waiting"  # type: ignore[index]
    assert (
        data["not_ready"]
        == status.not_ready()
        == ["replica 1 waiting to start in 1.5s after 2 failures; last error: exited (1)"]
    )


def test_not_ready_says_why_for_each_state_and_for_replicas_not_started() -> None:
    status = ServiceReplicasStatus(
        "m",
        desired=4,
        min=1,
        max=4,
        replicas=(
            replica(0, FAILED, failures=3, last_error="cannot run 'inferway': not found"),
            replica(1, STARTING, pid=7),
            replica(2, ReplicaState.DRAINING),
        ),
    )
    assert status.not_ready() == [
        "replica 0 failed: given up after 3 failures in a row (an edit of its replicas: "
        "section tries again); last error: cannot run 'inferway': not found",
        "replica 1 starting (pid 7): its readiness check has not passed yet",
        "replica 2 draining: being stopped",
        "1 more not started yet",
    ]
    every_one_ready = ServiceReplicasStatus("m", 1, 1, 1, (replica(0, READY),))
    assert every_one_ready.not_ready() == []
