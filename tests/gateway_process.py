"""A whole gateway (control plane + a real supervised Envoy) on free loopback ports, started
through the composition root as ``inferway run`` starts it, for the tests that need one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from tests.envoy_process import free_port

__all__ = ["replica_counts", "running_gateway"]


@contextlib.asynccontextmanager
async def running_gateway(policy: Path, workdir: Path, **options: Any) -> AsyncIterator[Gateway]:
    """The gateway for ``policy``, once its Envoy is ready; stopped on exit. ``options`` are
    further GatewayOptions fields."""
    gw = await start_gateway(
        GatewayOptions(
            policy_path=policy,
            xds_port=0,
            admin_port=0,
            envoy_admin_port=free_port(),
            workdir=workdir,
            **options,
        )
    )
    try:
        assert gw.supervisor is not None and await gw.supervisor.wait_ready(20)
        yield gw
    finally:
        await gw.stop()


def replica_counts(gw: Gateway) -> tuple[int, int]:
    """(desired, ready) of the one service whose replicas ``gw`` runs."""
    assert gw.replicas is not None
    (status,) = gw.replicas.status()
    return status.desired, status.ready
