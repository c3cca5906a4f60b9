"""Decide once, over randomised runs: several control-plane replicas over the in-memory store
contract (tests/memory_store.py, an injected clock), leader changes at random times: the
leader killed, cut off from the store, stalled past its lease (a zombie that wakes and tries to
decide), replicas restarted with nothing in memory. Each replica runs the real fleet code: the
autoscaler's record-then-act (``AutoscaleFleet`` over ``SharedAutoscaleStore``, the load from
``FleetLoadSource``) and the rollout controller over ``SharedRolloutStore``.

Properties, for every run: 0 divergent decisions. No scale decision is acted on twice or by two
leaders (its sequence numbers are acted on once each, in order, each by the term that recorded
it); no rollout step is recorded twice, and the store's history is one run of steps; a new
leader's first decision continues the stored sequence, from the same rollout step with the same
evidence; a deposed leader's weights go back to the fleet's as soon as its write is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferway.controllers.rollout.config import AnalysisConfig, RolloutConfig, Step
from inferway.controllers.rollout.controller import RolloutController
from inferway.controllers.rollout.evidence import VersionCounts, WindowSample
from inferway.controllers.rollout.state import STEPS_TAKEN, Action
from inferway.gateway.autoscale_fleet import AutoscaleFleet
from inferway.gateway.autoscale_inputs import build_sample
from inferway.gateway.autoscale_policy import autoscale_config
from inferway.gateway.autoscaling import _Scaled
from inferway.gateway.fleet.envoy_reports import NodeReport
from inferway.gateway.fleet.fleet_load import FleetLoadSource
from inferway.gateway.fleet.shared_autoscale import SharedAutoscaleStore
from inferway.gateway.fleet.shared_rollouts import SharedRolloutStore
from inferway.gateway.fleet.store import (
    Fence,
    Leadership,
    Record,
    StoreUnavailableError,
)
from inferway.gateway.rollouts.envoy_stats import ClusterTotals
from inferway.gateway.rollouts.store import RolloutTarget
from inferway.policies.scale_target import ScaleTargetSpec
from tests.memory_store import MemoryStore

STEP_ACTIONS = {a.value for a in STEPS_TAKEN}
TTL = 3.0
GIVE_UP = 0.7
"""A leader that could not renew gives up at 70% of the TTL after its last renewal."""
ROLLOUT = RolloutConfig(
    name="r",
    stable="v1",
    canary="v2",
    steps=(Step(10), Step(30), Step(60)),
    analysis=AnalysisConfig(interval_s=1.0, min_requests=20),
)
TARGET = RolloutTarget("models", "v1", "v2")
AUTOSCALE = autoscale_config(
    "model",
    {"metric": "request_rate", "target": 10, "sampling_interval": 1, "max_replicas": 50,
     "cooldown": {"up": 2, "down": 4}, "stabilization": {"up": 0, "down": 3}},
)  # fmt: skip


class _Link:
    """One replica's connection to the store: cut, every call fails as etcd's client does."""

    def __init__(self, store: MemoryStore) -> None:
        self.store, self.cut = store, False
        self.url = store.url

    def _check(self) -> None:
        if self.cut:
            raise StoreUnavailableError("no route to the store (partitioned)")

    async def get(self, key: str) -> Record | None:
        self._check()
        return await self.store.get(key)

    async def list(self, prefix: str) -> list[Record]:
        self._check()
        return await self.store.list(prefix)

    async def put(self, key: str, value: bytes, **kw: Any) -> Record:
        self._check()
        return await self.store.put(key, value, **kw)

    async def watch(self, prefix: str, *, after: int = 0) -> Any:
        self._check()
        async for record in self.store.watch(prefix, after=after):
            self._check()
            yield record


class _Envoys:
    """Three Envoys' pushed totals, a deterministic function of time (load that varies)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock

    def reports(self) -> dict[str, NodeReport]:
        now = self._clock()
        out = {}
        for i, node in enumerate(("a", "b", "c")):
            at = round(now * 2) / 2  # pushed every 0.5 s
            requests = int((10 + 10 * i) * at + 3 * at * at)
            totals = {"model": ClusterTotals(requests, 0, {5.0: requests}, healthy=4)}
            out[node] = NodeReport(node, "", at, totals)
        return out


@dataclass
class Replica:
    name: str
    link: _Link
    held: Leadership | None = None
    stalled_until: float = -1.0
    autoscale: SharedAutoscaleStore | None = None
    fleet: AutoscaleFleet | None = None
    scaled: _Scaled | None = None
    rollouts: SharedRolloutStore | None = None
    controller: RolloutController | None = None
    served_weight: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@dataclass
class World:
    store: MemoryStore
    now: list[float]
    acted: list[dict[str, Any]] = field(default_factory=list)
    """Every scale decision acted on: seq, term, by, desired."""
    steps: list[tuple[int, str, int]] = field(default_factory=list)
    """Every rollout step a leader took (as it served it): term, action, step."""
    takeovers: list[dict[str, Any]] = field(default_factory=list)
    reverted: list[tuple[int, int]] = field(default_factory=list)
    """(weight served after a refused write, the store's weight) of every deposed leader."""


def _fence(replica: Replica) -> Callable[[], Fence | None]:
    def fence() -> Fence | None:
        held = replica.held
        return held.fence if held is not None and not held.lost.is_set() else None

    return fence


async def _boot(world: World, replica: Replica) -> None:
    """A replica (re)started with nothing in memory: it reads the store before serving."""
    clock = lambda: world.now[0]  # noqa: E731
    replica.autoscale = SharedAutoscaleStore(replica.link, _fence(replica))  # type: ignore[arg-type]
    replica.fleet = AutoscaleFleet(
        FleetLoadSource(_Envoys(clock), silent_after_s=5, clock=clock),
        replica.autoscale,
        _fence(replica),
    )
    replica.rollouts = SharedRolloutStore(replica.link, _fence(replica))  # type: ignore[arg-type]
    replica.rollouts.fenced = lambda why: _lose(replica, why)
    replica.autoscale.fenced = lambda why: _lose(replica, why)
    replica.rollouts.on_change = lambda name: _adopt(replica)
    replica.scaled = _Scaled(AUTOSCALE, ScaleTargetSpec("metric"), actuator=None)  # type: ignore[arg-type]
    replica.controller = None
    with contextlib.suppress(StoreUnavailableError):
        await replica.rollouts.load_all()
    _adopt(replica)
    replica.rollouts.start()
    await replica.autoscale.start()


def _adopt(replica: Replica) -> None:
    """What every replica serves: the stored rollout state (the driver's ``adopt``)."""
    assert replica.rollouts is not None
    loaded = replica.rollouts.load(ROLLOUT.name)
    if loaded is not None and (replica.held is None or replica.held.lost.is_set()):
        replica.controller = RolloutController(ROLLOUT, loaded[1])
        replica.served_weight = loaded[1].weight


def _lose(replica: Replica, why: str) -> None:
    if replica.held is not None:
        replica.held.lose(why)
    _adopt(replica)


async def _stop(replica: Replica) -> None:
    for part in (replica.rollouts, replica.autoscale):
        if part is not None:
            await part.stop()
    replica.held = None


def _window(then: float, now: float) -> WindowSample:
    n = max(int(40 * (now - then)), 0)
    return WindowSample(VersionCounts(n, 0, {5.0: n}), VersionCounts(n // 4, 0, {5.0: n // 4}))


async def _lead_tick(world: World, replica: Replica, last: dict[str, float]) -> None:
    """One pass of the leader's loops: the rollout's interval, then the autoscaler's."""
    assert replica.held is not None and replica.fleet is not None and replica.scaled is not None
    now = world.now[0]
    term = replica.held.fence.term
    fresh_term = last.get("term") != term
    if fresh_term:  # a new leader: it continues from the store (Fleet.lead refreshes)
        assert replica.rollouts is not None
        await replica.rollouts.refresh()
        loaded = replica.rollouts.load(ROLLOUT.name)
        replica.controller = RolloutController(ROLLOUT, loaded[1] if loaded else None)
        await replica.fleet.resume({"model": replica.scaled})
        record = world.store._records.get("rollouts/r")
        scale = world.store._records.get("autoscale/model")
        world.takeovers.append(
            {
                "term": term,
                "rollout": json.loads(replica.controller.state.to_json()),
                "stored": None if record is None else json.loads(record.value)["state"],
                "seq": replica.scaled.seq,
                "stored_seq": 0 if scale is None else json.loads(scale.value)["seq"],
            }
        )
        last.clear()
        last["term"] = term
    controller = replica.controller
    assert controller is not None and replica.rollouts is not None
    sample = _window(last.get("rollout", now - 1), now)
    last["rollout"] = now
    decision = controller.tick(now, sample)
    if decision.action in STEPS_TAKEN or decision.action == Action.ROLLBACK:
        world.steps.append((term, decision.action.value, decision.step))
    replica.served_weight = controller.state.weight  # served at once, as the driver does
    replica.rollouts.save(TARGET, controller.state)
    await _settle()  # the write goes out
    if replica.held.lost.is_set():  # refused: a deposed leader serves the fleet's weights again
        record = world.store._records.get("rollouts/r")
        stored = 0 if record is None else json.loads(record.value)["state"]["weight"]
        world.reverted.append((replica.served_weight, stored))
        return

    scaled = replica.scaled
    load = replica.fleet.source.load("model")
    sample_a = build_sample(now, load.load, scaled.last)
    scaled.last = (now, load.load)
    scaled.autoscaler.observe(sample_a)
    current = world.acted[-1]["desired"] if world.acted else 1
    made = scaled.autoscaler.decide(now, current=current, ready=current)
    event = {"desired": made.desired, "time": now}
    if await replica.fleet.record(scaled, event):
        world.acted.append({"seq": event["seq"], "term": term, "by": replica.name, **event})


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


EVENTS = st.lists(
    st.tuples(
        st.floats(0.1, 1.5),
        st.sampled_from(["tick", "tick", "tick", "kill", "cut", "heal", "stall", "restart"]),
        st.integers(0, 3),
    ),
    min_size=30,
    max_size=120,
)


async def _run(events: list[tuple[float, str, int]], replicas_n: int) -> World:
    now = [0.0]
    world = World(MemoryStore(lambda: now[0]), now)
    replicas = [Replica(f"r{i}", _Link(world.store)) for i in range(replicas_n)]
    memory: dict[str, dict[str, float]] = {r.name: {} for r in replicas}
    for replica in replicas:
        await _boot(world, replica)
    for dt, event, who in events:
        now[0] += dt
        target = replicas[who % replicas_n]
        leader = next((r for r in replicas if r.held and not r.held.lost.is_set()), None)
        if event == "kill" and leader is not None:  # SIGKILL: memory gone, lease runs out
            await _stop(leader)
            leader.link.cut = False
            await _boot(world, leader)
            memory[leader.name] = {}
        elif event == "restart":
            await _stop(target)
            await _boot(world, target)
            memory[target.name] = {}
        elif event == "cut" and leader is not None:
            leader.link.cut = True
        elif event == "heal":
            for r in replicas:
                r.link.cut = False
        elif event == "stall" and leader is not None:  # a pause longer than the lease
            leader.stalled_until = now[0] + TTL * 1.5
        for replica in replicas:
            if now[0] < replica.stalled_until:
                continue
            held = replica.held
            if held is not None and not held.lost.is_set():
                renewed = not replica.link.cut and world.store.renew(held)
                since = world.store.renewed_at(held)
                late = since is None or now[0] - since >= GIVE_UP * TTL
                if not renewed and replica.stalled_until < 0 and late:
                    held.lose("could not renew the lease")
            if (replica.held is None or replica.held.lost.is_set()) and not replica.link.cut:
                replica.held = world.store.try_acquire("loops", replica.name, TTL)
            if replica.held is not None and not replica.held.lost.is_set():
                with contextlib.suppress(StoreUnavailableError):
                    await _lead_tick(world, replica, memory[replica.name])
            if replica.stalled_until >= 0 and now[0] >= replica.stalled_until:
                replica.stalled_until = -1.0  # woke up: decided once above, as a zombie would
            await _settle()
    for replica in replicas:
        await _stop(replica)
    return world


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=EVENTS, replicas_n=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_leader_changes_at_random_times_never_make_a_divergent_decision(
    events: list[tuple[float, str, int]], replicas_n: int, seed: int
) -> None:
    random.seed(seed)
    world = asyncio.run(_run(events, replicas_n))

    # scale decisions: each number acted on once, in order, by the term that recorded it
    seqs = [a["seq"] for a in world.acted]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    terms = [a["term"] for a in world.acted]
    assert terms == sorted(terms), "an older term acted after a newer one"

    # rollout steps: the store's history is one run, each step recorded once
    stored = world.store._records.get("rollouts/r")
    assert stored is not None, "no rollout decision was ever recorded"
    history = json.loads(stored.value)["state"]["history"]
    taken = [(d["action"], d["step"]) for d in history if d["action"] in STEP_ACTIONS]
    assert len(taken) == len(set(taken)), taken
    assert [s for _, s in taken] == sorted(s for _, s in taken), taken

    # a new leader continues: its first state is the stored one (same step, same evidence),
    # and its first scale decision is the next number of the stored sequence
    for takeover in world.takeovers:
        if takeover["stored"] is not None:
            assert takeover["rollout"] == takeover["stored"], takeover["term"]
        assert takeover["seq"] == takeover["stored_seq"], takeover
    # a deposed leader whose write was refused serves the fleet's weight again at once
    for served, fleet in world.reverted:
        assert served == fleet, world.reverted
