"""A real grpcio client consuming xDS itself (``xds:///models``, ``GRPC_XDS_BOOTSTRAP``) from
the gateway, calling the backend's own OIP gRPC service (``inferway serve``) directly: it
follows a weight edit of the policy file and fails over to the next priority when a replica
is killed. No Envoy in the path; the client is detected as proxyless from its node."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from inferway.backends.protocol import pb2, pb2_grpc
from inferway.devtools.demo_models import build_add
from inferway.gateway.runtime import GatewayOptions, start_gateway
from inferway.xds import type_urls
from inferway.xds.node_groups import ENVOY_GROUP, GRPC_GROUP
from tests.envoy_process import free_port
from tests.helpers import poll_until, write_atomically

pytestmark = pytest.mark.integration

CLIENT_NODE = "proxyless-client"
EXAMPLE_CLIENT = Path(__file__).resolve().parents[2] / "examples" / "proxyless_grpc_client.py"


def _policy(a: int, b: int, *, v1: float, v2: float, listener_port: int) -> str:
    """v1: replica A, replica B as its failover tier; v2: replica B."""
    return f"""
listeners:
  - name: main
    port: {listener_port}
services:
  - name: v1
    protocol: http2
    endpoints:
      - 127.0.0.1:{a}
      - address: 127.0.0.1:{b}
        priority: 1
  - name: v2
    protocol: http2
    endpoints:
      - 127.0.0.1:{b}
routes:
  - name: infer
    backends:
      - service: v1
        weight: {v1}
      - service: v2
        weight: {v2}
grpc_targets:
  - name: models
    route: infer
"""


@contextlib.contextmanager
def _serve(root: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``inferway serve`` over ``root`` on free loopback ports, once it is ready."""
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "inferway.cli.main", "serve", "--model-repository"]
    command += [str(root), "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            with contextlib.suppress(httpx.TransportError):
                ready = httpx.get(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1)
                if ready.status_code == 200:
                    break
            assert time.monotonic() < deadline, "inferway serve never became ready"
            time.sleep(0.1)
        yield proc, grpc_port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _write_bootstrap(path: Path, xds_port: int) -> Path:
    """What a proxyless client is given: the xDS server and its node; gRPC adds its own
    user agent and client features, by which the gateway knows it is not an Envoy."""
    bootstrap = {
        "xds_servers": [
            {
                "server_uri": f"127.0.0.1:{xds_port}",
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": {"id": CLIENT_NODE, "cluster": "proxyless", "locality": {}},
    }
    path.write_text(json.dumps(bootstrap))
    return path


def _add_request() -> pb2.ModelInferRequest:
    request = pb2.ModelInferRequest(model_name="add")
    for name in ("a", "b"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    return request


async def _versions(stub: pb2_grpc.GRPCInferenceServiceStub, count: int) -> Counter[str]:
    """Which replica answered each of ``count`` calls (its model version), or the status."""
    seen: Counter[str] = Counter()
    for _ in range(count):
        try:
            answer = await stub.ModelInfer(_add_request(), timeout=5)
        except grpc.aio.AioRpcError as error:
            seen[error.code().name] += 1
        else:
            assert (
                list(answer.outputs[0].contents.fp32_contents or []) or answer.raw_output_contents
            )
            seen[answer.model_version] += 1
    return seen


async def test_grpc_client_follows_a_weight_edit_and_fails_over_to_the_next_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_add(tmp_path / "a" / "add" / "1" / "model.onnx")  # replica A answers version 1
    build_add(tmp_path / "b" / "add" / "2" / "model.onnx")  # replica B answers version 2
    with _serve(tmp_path / "a") as (replica_a, port_a), _serve(tmp_path / "b") as (_, port_b):
        policy_path = tmp_path / "policy.yaml"
        listener_port = free_port()
        write_atomically(
            policy_path, _policy(port_a, port_b, v1=100, v2=0, listener_port=listener_port)
        )
        options = GatewayOptions(
            policy_path=policy_path,
            xds_port=free_port(),
            admin_port=free_port(),
            with_envoy=False,
            workdir=tmp_path / "work",
        )
        (tmp_path / "work").mkdir()
        gateway = await start_gateway(options)
        try:
            bootstrap = _write_bootstrap(tmp_path / "grpc-bootstrap.json", gateway.xds.port)
            monkeypatch.setenv("GRPC_XDS_BOOTSTRAP", str(bootstrap))
            async with grpc.aio.insecure_channel("xds:///models") as channel:
                stub = pb2_grpc.GRPCInferenceServiceStub(channel)
                assert await _versions(stub, 20) == Counter({"1": 20}), gateway.cache.nacks()
                (node,) = [n for n in gateway.cache.node_status() if n.node_id == CLIENT_NODE]
                assert node.group == GRPC_GROUP and node.last_nack is None
                assert node.acked  # it ACKed LDS/RDS/CDS/EDS built for it, not Envoy's

                edited = _policy(port_a, port_b, v1=50, v2=50, listener_port=listener_port)
                write_atomically(policy_path, edited)

                async def split_seen() -> bool:
                    return set(await _versions(stub, 10)) == {"1", "2"}

                await poll_until(split_seen, timeout=20, what="calls to both replicas")
                split = await _versions(stub, 200)
                assert set(split) == {"1", "2"}, split
                assert 60 <= split["1"] <= 140, split  # 50/50, far outside chance at n=200

                replica_a.send_signal(signal.SIGKILL)
                replica_a.wait(timeout=10)

                async def failed_over() -> bool:
                    return await _versions(stub, 10) == Counter({"2": 10})

                await poll_until(failed_over, timeout=20, what="failover to replica B")
                assert await _versions(stub, 50) == Counter({"2": 50})
                assert gateway.cache.nacks() == []

            # the documented example client, as a user runs it, against the same gateway
            example = await asyncio.create_subprocess_exec(
                sys.executable,
                str(EXAMPLE_CLIENT),
                *("--xds", f"127.0.0.1:{gateway.xds.port}", "--target", "models"),
                *("--calls", "5"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            output, _ = await asyncio.wait_for(example.communicate(), timeout=60)
            assert example.returncode == 0, output.decode()
            assert output.decode().splitlines()[-1] == "version 2: 5", output.decode()
        finally:
            await gateway.stop()


async def test_envoy_and_a_proxyless_client_of_one_gateway_each_get_their_own_snapshot(
    tmp_path: Path,
) -> None:
    build_add(tmp_path / "a" / "add" / "1" / "model.onnx")
    with _serve(tmp_path / "a") as (_, port_a):
        policy_path = tmp_path / "policy.yaml"
        listener_port = free_port()
        unused = free_port()  # v2 (weight 0) and v1's backup tier: nothing listens
        write_atomically(
            policy_path, _policy(port_a, unused, v1=100, v2=0, listener_port=listener_port)
        )
        (tmp_path / "work").mkdir()
        options = GatewayOptions(
            policy_path=policy_path,
            xds_port=free_port(),
            admin_port=free_port(),
            envoy_admin_port=free_port(),
            workdir=tmp_path / "work",
        )
        gateway = await start_gateway(options)
        try:
            assert gateway.supervisor is not None
            assert await gateway.supervisor.wait_ready(30), gateway.supervisor.stderr_tail()
            version = gateway.control_plane.version
            assert version is not None
            node_id = options.node_id
            assert await gateway.cache.wait_for_acks(version, node_ids=[node_id], timeout=20)

            # Envoy: its socket listener, as without targets, carries gRPC to the replica too
            async with grpc.aio.insecure_channel(f"127.0.0.1:{listener_port}") as channel:
                stub = pb2_grpc.GRPCInferenceServiceStub(channel)
                assert await _versions(stub, 5) == Counter({"1": 5})

            # a proxyless client (the documented example) alongside it
            example = await asyncio.create_subprocess_exec(
                sys.executable,
                str(EXAMPLE_CLIENT),
                *("--xds", f"127.0.0.1:{gateway.xds.port}", "--target", "models"),
                *("--calls", "5", "--node-id", CLIENT_NODE),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            output, _ = await asyncio.wait_for(example.communicate(), timeout=60)
            assert example.returncode == 0, output.decode()
            assert output.decode().splitlines()[-1] == "version 1: 5", output.decode()

            nodes = {n.node_id: n for n in gateway.cache.node_status()}
            envoy, client = nodes[node_id], nodes[CLIENT_NODE]
            # an Envoy inferway starts is in ``default|sse`` where its SSE module built
            assert envoy.group.partition("|")[0] == ENVOY_GROUP and client.group == GRPC_GROUP
            envoy_snapshot = gateway.cache.get_snapshot(envoy.group)
            grpc_snapshot = gateway.cache.get_snapshot(GRPC_GROUP)
            assert envoy_snapshot is not None and grpc_snapshot is not None
            assert list(envoy_snapshot.resources_of(type_urls.LISTENER)) == ["main"]
            assert list(grpc_snapshot.resources_of(type_urls.LISTENER)) == ["models"]
            assert client.acked[type_urls.LISTENER] == grpc_snapshot.versions[type_urls.LISTENER]
            assert envoy.acked[type_urls.LISTENER] == envoy_snapshot.versions[type_urls.LISTENER]
            assert gateway.cache.nacks() == []
        finally:
            await gateway.stop()
