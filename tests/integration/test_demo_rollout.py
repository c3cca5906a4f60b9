"""``inferway demo --rollout``: the rollout scene end to end (real backends, real Envoy, the
real rollout driver), and the fault front that makes the demo's bad v3 misbehave."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from inferway.devtools.demo_backend import DEMO_MODEL, start_demo_backends
from inferway.devtools.demo_fault import DemoFault
from inferway.devtools.demo_traffic import build_infer_request

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


async def test_a_faulty_demo_backend_fails_its_share_and_serves_the_rest_for_real(
    tmp_path: Path,
) -> None:
    backends = await start_demo_backends(
        tmp_path, (3,), faults={3: DemoFault(error_rate=0.3, delay_ms=20)}
    )
    try:
        assert backends.ports["v3"] == backends.fronts["v3"].port
        assert backends.ports["v3"] != backends.handles["v3"].http_port
        url = f"http://127.0.0.1:{backends.ports['v3']}/v2/models/{DEMO_MODEL}/infer"
        rng = random.Random(0)
        seen: Counter[str] = Counter()
        started = time.perf_counter()
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            for _ in range(200):
                response = await client.post(url, json=build_infer_request(rng))
                if response.status_code == 200:
                    body = response.json()
                    assert body["outputs"][0]["shape"] == [1, 10], body
                    seen[f"v{body['model_version']}"] += 1
                else:
                    seen[f"HTTP {response.status_code}"] += 1
        elapsed = time.perf_counter() - started
    finally:
        await backends.stop()
    assert set(seen) == {"v3", "HTTP 503"}, seen
    assert 35 <= seen["HTTP 503"] <= 85, f"about 30% of 200 fail: {seen}"
    assert elapsed >= seen["v3"] * 0.02, "each served request waited its delay"


def test_demo_rollout_promotes_a_good_v2_and_rolls_a_bad_v3_back_with_the_verdicts() -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "inferway.cli.main", "demo", "--once", "-n", "40", "--no-trace",
         "--rollout"],
        cwd=ROOT, capture_output=True, text=True, timeout=90,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    elapsed = time.monotonic() - started
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "v3 on 127.0.0.1:" in out, "a third backend, behind its fault front"
    assert "demo-v2 step 0 · v2 at 20% · start: started" in out
    assert "demo-v2 step 1 · v2 at 50% · window v1 " in out and "advance: advanced" in out
    assert "error-rate: pass (sprt, LLR " in out
    assert "✓ demo-v2: promoted in " in out and "(v2 at 100%)" in out
    assert "demo-v3 step 0 · v3 at 0% · window v2 " in out and "rollback: check failed" in out
    assert "error-rate: fail (sprt, LLR " in out
    assert "✓ demo-v3: rolled_back in " in out and "(v3 at 0%)" in out
    assert "HTTP 503" in out, "the bad canary's failures are counted per version"
    assert "stopped cleanly" in out
    assert elapsed < 60, f"the rollout demo took {elapsed:.0f}s"


async def test_the_fault_front_stops_cleanly_while_idle(tmp_path: Path) -> None:
    backends = await start_demo_backends(tmp_path, (3,), faults={3: DemoFault(error_rate=1.0)})
    port = backends.ports["v3"]
    await backends.stop()
    assert not backends.fronts and not backends.handles
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(timeout=2, trust_env=False) as client:
            await client.get(f"http://127.0.0.1:{port}/")
