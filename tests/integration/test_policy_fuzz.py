"""Policy fuzzing, bounded run (issue 33): Hypothesis-drawn mutations of the examples'
policies against ``inferway validate``'s in-process path, and seeded mutations written as
edits to a running gateway's policy file (no Envoy). No traceback, every refusal located,
the last good config still served, the watcher alive. The long run is bench/fuzz_policies.py.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from inferway.gateway.admin_security import ADMIN_TOKEN_ENV
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from tests.policy_fuzz import FuzzStats, WatcherTarget, check_validate, load_seeds, mutate
from tests.policy_fuzz import policy_texts as policy_texts_of

pytestmark = pytest.mark.integration

SEEDS = load_seeds()
WATCHER_SEEDS = load_seeds(for_watcher=True)
_DIRECTORY = Path(tempfile.mkdtemp(prefix="inferway-fuzz-"))


@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(policy_texts_of(SEEDS))
def test_validate_never_tracebacks_and_locates_every_refusal(text: str) -> None:
    stats = FuzzStats()
    check_validate(text, _DIRECTORY, stats)
    assert stats.failures == []


def test_the_seeds_cover_the_examples() -> None:
    assert len(SEEDS) >= 10 and len(WATCHER_SEEDS) >= 4
    assert all("routes" in seed for seed in WATCHER_SEEDS)


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(WATCHER_SEEDS[0], sort_keys=False), encoding="utf-8")
    options = GatewayOptions(
        policy_path=policy, xds_port=0, admin_port=0, with_envoy=False, workdir=tmp_path / "w"
    )
    running = await start_gateway(options)
    try:
        yield running
    finally:
        await running.stop()


async def test_the_live_watcher_survives_hostile_edits(gateway: Gateway) -> None:
    rng = random.Random(33)
    target = WatcherTarget(gateway, WATCHER_SEEDS[0])
    stats = FuzzStats()
    for batch in range(4):
        for _ in range(20):
            await target.edit(mutate(rng.choice(WATCHER_SEEDS), rng), stats)
        await target.checkpoint(stats, batch)
    assert stats.failures == [], stats.failures[:3]
    assert stats.tried == 80 and stats.refused > 0
    assert gateway.watcher.running and gateway.watcher.health.restarts == 0
