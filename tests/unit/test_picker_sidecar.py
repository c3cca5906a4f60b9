"""``picker: {process: sidecar}`` without Envoy: the pools line round-trips, a bad line is
refused naming what is wrong, and a real picker process serves what the supervisor feeds it,
is restarted with the latest pools when killed, and exits when the supervisor stops."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import grpc
import pytest

from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2 as ep_pb2,
)
from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2_grpc as ep_grpc,
)
from inferway.gateway.picker.__main__ import main, parse_pools
from inferway.gateway.picker.health import HEALTH_METHOD
from inferway.gateway.picker.keeper import PickerKeeper
from inferway.gateway.picker.sidecar import PickerSidecar, pools_line
from inferway.policies import load_policy_text
from inferway.policies.picker import Picker as PickerPolicy
from tests.envoy_process import free_port

ENDPOINTS = ["127.0.0.1:9001", "127.0.0.1:9002"]


def test_the_pools_line_round_trips_and_a_bad_one_says_what_is_wrong() -> None:
    settings = PickerPolicy.model_validate({"process": "sidecar", "scorers": {"prefix": 5}})
    line = pools_line({"llm": (settings, ENDPOINTS)})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_pools(line, ("127.0.0.1", 1)) == {("127.0.0.1", 1): {"llm": (settings, ENDPOINTS)}}
    with pytest.raises(ValueError, match="expected"):
        parse_pools(b'{"services": {}}', ("127.0.0.1", 1))
    with pytest.raises(ValueError, match="queue_limit"):
        parse_pools(
            json.dumps(
                {"pools": {"x": {"settings": {"queue_limit": -1}, "endpoints": []}}}
            ).encode(),
            ("127.0.0.1", 1),
        )
    assert main(["127.0.0.1"]) == 2  # usage


def test_process_is_an_own_picker_setting() -> None:
    with pytest.raises(ValueError, match="process"):
        PickerPolicy.model_validate({"external": "epp:9002", "process": "sidecar"})
    assert PickerPolicy().process == "gateway"


async def _pick(port: int, prompt: str) -> str:
    """One pick through the process's ext_proc service: the destination header's value."""
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    requests = [
        ep_pb2.ProcessingRequest(request_headers=ep_pb2.HttpHeaders(end_of_stream=False)),
        ep_pb2.ProcessingRequest(request_body=ep_pb2.HttpBody(body=body, end_of_stream=True)),
    ]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = ep_grpc.ExternalProcessorStub(channel).Process(
            iter(requests), metadata=(("x-inferway-picker-service", "llm"),)
        )
        answers = [answer async for answer in call]
    (header,) = answers[-1].request_body.response.header_mutation.set_headers
    return header.header.raw_value.decode()


@pytest.mark.asyncio
async def test_a_killed_picker_process_is_restarted_with_the_latest_pools() -> None:
    port = free_port()
    sidecar = await PickerSidecar("127.0.0.1", port).start()
    try:
        settings = PickerPolicy(
            process="sidecar", metrics_path=None, fallbacks=1, transport="ext_proc"
        )  # asked over ext_proc below (the default http would bind http_listen's 18095 too)
        sidecar.update({"llm": (settings, ENDPOINTS)})
        assert await sidecar.wait_serving(15)
        first = sidecar.pid
        assert first is not None and first != os.getpid()
        assert (await _pick(port, "a prompt")).split(",")[0] in ENDPOINTS
        sidecar.update({"llm": (settings, ENDPOINTS[1:])})  # an edit reaches the live process
        assert await sidecar.wait_serving(10)
        assert await _pick(port, "another") == ENDPOINTS[1]
        os.kill(first, signal.SIGKILL)
        for _ in range(150):
            if sidecar.restarts == 1 and sidecar.last_restart_s is not None:
                break
            await asyncio.sleep(0.1)
        assert sidecar.restarts == 1 and sidecar.pid != first
        assert sidecar.last_restart_s is not None and sidecar.last_restart_s < 10
        assert await _pick(port, "after the restart") == ENDPOINTS[1]  # the latest pools
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = channel.unary_unary(
                HEALTH_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            assert await check(b"\x0a\x09readiness") == b"\x08\x01"
        second = sidecar.pid
    finally:
        await sidecar.stop()
    assert second is not None
    with pytest.raises(ProcessLookupError):  # stopped: the process is gone, not orphaned
        os.kill(second, 0)


@pytest.mark.asyncio
async def test_a_hung_picker_process_is_killed_and_restarted() -> None:
    """A process that stops answering (SIGSTOP: alive, silent) is killed after ``hung_after``
    seconds without a status answer and restarted with the latest pools; a short pause is
    not (the watchdog waits for silence, not for one late answer)."""
    port = free_port()
    sidecar = await PickerSidecar("127.0.0.1", port, hung_after=3.0).start()
    try:
        settings = PickerPolicy(process="sidecar", metrics_path=None, transport="ext_proc")
        sidecar.update({"llm": (settings, ENDPOINTS)})
        assert await sidecar.wait_serving(15)
        first = sidecar.pid
        assert first is not None
        for _ in range(100):  # armed once the process has answered a status request
            if sidecar.pools_status:
                break
            await asyncio.sleep(0.1)
        assert sidecar.pools_status
        os.kill(first, signal.SIGSTOP)
        await asyncio.sleep(1.0)  # a pause shorter than hung_after: left alone
        os.kill(first, signal.SIGCONT)
        await asyncio.sleep(1.5)
        assert (sidecar.pid, sidecar.restarts, sidecar.killed_hung) == (first, 0, 0)
        os.kill(first, signal.SIGSTOP)  # now for good
        for _ in range(200):
            if sidecar.restarts == 1 and await sidecar.wait_serving(0.05):
                break
            await asyncio.sleep(0.1)
        assert sidecar.killed_hung == 1 and sidecar.restarts == 1 and sidecar.pid != first
        assert sidecar.status()["killed_hung"] == 1
        assert (await _pick(port, "after the restart")).split(",")[0] in ENDPOINTS
        with pytest.raises(ProcessLookupError):  # the hung one is gone, not left stopped
            os.kill(first, 0)
    finally:
        await sidecar.stop()


@pytest.mark.asyncio
async def test_the_keeper_hands_sidecar_services_to_a_process() -> None:
    port, lane = free_port(), free_port()
    text = f"""
version: 1
listeners:
  - name: ingress
    port: 18080
services:
  - name: llm
    endpoints: ["127.0.0.1:9001", "127.0.0.1:9002"]
    picker: {{process: sidecar, listen: "127.0.0.1:{port}", http_listen: "127.0.0.1:{lane}",
              metrics_path: null}}
  - name: near
    endpoints: ["127.0.0.1:9003"]
    picker: {{listen: "127.0.0.1:0", metrics_path: null}}
routes:
  - name: all
    backends:
      - service: llm
"""
    keeper = PickerKeeper(None, load_policy_text(text))
    await keeper.start()
    try:
        assert list(keeper.sidecars) == [("127.0.0.1", port)]
        assert keeper.pool("llm") is None and keeper.pool("near") is not None
        (sidecar,) = keeper.sidecars.values()
        assert await sidecar.wait_serving(15)
        assert await _pick(port, "hello") in (
            "127.0.0.1:9001,127.0.0.1:9002",
            "127.0.0.1:9002,127.0.0.1:9001",
        )
        # status shows the sidecar's pool (as the process last answered, so perhaps from
        # before the pick at first) beside the local one
        for _ in range(50):
            if _picks(keeper.status()) == 1:
                break
            await asyncio.sleep(0.1)
        shown = keeper.status()
        assert sorted(shown) == ["llm", "near"]
        picked = {e for e, s in shown["llm"]["endpoints"].items() if s["picks"] == 1}
        assert len(picked) == 1 and shown["llm"]["last_pick"]["picker.winner"] in picked
        assert set(shown["llm"]["endpoints"]) == {"127.0.0.1:9001", "127.0.0.1:9002"}
        # how Envoy asks each: the default transport, at the sidecar's lane / the OS's port
        assert shown["llm"]["asked"] == {"transport": "http", "address": f"127.0.0.1:{lane}"}
        assert shown["near"]["asked"] == {"transport": "http", "address": "127.0.0.1:0"}
        await keeper.follow(load_policy_text(text.replace("process: sidecar, ", "")))
        assert not keeper.sidecars and keeper.pool("llm") is not None
    finally:
        await keeper.stop()


def _picks(shown: dict[str, Any]) -> int:
    """The picks the status shows for the sidecar's service ``llm`` (0 before it shows it)."""
    endpoints = shown.get("llm", {}).get("endpoints", {})
    return sum(int(e["picks"]) for e in endpoints.values())
