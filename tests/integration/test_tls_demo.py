"""``inferway demo --mtls``: the whole canary demo over a mutual-TLS listener, certificates
minted on the spot by the development CA, the demo's client presenting its certificate."""

from __future__ import annotations

import pytest

from inferway.devtools.demo import run_demo

pytestmark = pytest.mark.integration


async def test_demo_runs_over_mutual_tls() -> None:
    assert await run_demo(once=True, requests=40, trace=False, mtls=True) == 0
