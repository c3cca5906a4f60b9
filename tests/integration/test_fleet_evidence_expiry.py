"""Stale evidence: two real Envoys push their stats (OTLP) to a replica's receiver, which
publishes them into a real store (``file:``); the store's reader, as every replica runs it,
counts both. One Envoy stops for good: once its last report is older than the evidence TTL it
no longer counts, the fleet window names it gone (not silent), and the fleet status lists it
under ``envoys_gone``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
    add_MetricsServiceServicer_to_server,
)

from inferway.gateway.fleet.envoy_reports import EnvoyReports
from inferway.gateway.fleet.fleet_admin import fleet_status
from inferway.gateway.fleet.fleet_wiring import open_fleet
from inferway.gateway.fleet.shared_evidence import StoreEvidence
from tests.envoy_process import EnvoyProcess, free_port
from tests.integration.test_fleet_evidence import _bootstrap

TTL_S = 2.0


async def test_an_envoy_gone_for_good_expires_from_the_fleets_evidence(tmp_path: Path) -> None:
    reports = EnvoyReports(expire_after_s=TTL_S)  # the same TTL as the store's reader
    server = grpc.aio.server()
    add_MetricsServiceServicer_to_server(reports, server)
    sink = free_port()
    server.add_insecure_port(f"127.0.0.1:{sink}")
    await server.start()
    fleet = await open_fleet(
        f"file:{tmp_path / 'store'}",
        workdir=tmp_path,
        identity="r1",
        ttl_s=2.0,
        reports=reports,
        push_s=0.2,
        evidence_ttl_s=TTL_S,
    )
    evidence = fleet.evidence
    nodes = {"envoy-a": "zone-a", "envoy-b": "zone-b"}
    unused = free_port()  # the Envoys' clusters: no traffic is needed for their stats
    envoys = {
        node: EnvoyProcess(_bootstrap(node, zone, free_port(), unused, unused, sink))
        for node, zone in nodes.items()
    }
    try:
        await fleet.start()
        for envoy in envoys.values():
            await envoy.start()
        source = fleet.windows("stable", "canary")
        deadline = time.monotonic() + 20
        while set(evidence.reports()) != set(nodes):
            assert time.monotonic() < deadline, f"in the store: {sorted(evidence.reports())}"
            await asyncio.sleep(0.1)
        assert await source.sample() is None

        envoys["envoy-b"].stop()
        stopped = time.monotonic()
        deadline = stopped + TTL_S + 10
        while "envoy-b" not in evidence.expired():
            assert time.monotonic() < deadline, "envoy-b never expired"
            await asyncio.sleep(0.1)
        assert time.monotonic() - stopped >= TTL_S - 1.0  # not before its last report aged
        assert sorted(evidence.reports()) == ["envoy-a"]
        await source.sample()
        assert source.last_window is not None
        assert (source.last_window.gone, source.last_window.silent) == (("envoy-b",), ())
        assert sorted(source.last_window.by_node) == ["envoy-a"]
        status = fleet_status(fleet)
        assert [e["node"] for e in status["envoys"]] == ["envoy-a"]
        assert [(e["node"], e["zone"]) for e in status["envoys_gone"]] == [("envoy-b", "zone-b")]

        restarted = StoreEvidence(fleet.store, expire_after_s=TTL_S)  # a replica started later
        await restarted.start()
        try:
            deadline = time.monotonic() + 10
            while set(restarted.reports()) | set(restarted.expired()) != set(nodes):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            assert sorted(restarted.expired()) == ["envoy-b"]
        finally:
            await restarted.stop()
    finally:
        for envoy in envoys.values():
            envoy.stop()
        await fleet.stop()
        await server.stop(None)
