"""A traced stack for integration tests: OTLP receiver + real backend + control plane + Envoy.

    async with traced_stack(tmp_path, sampling_percent=100) as stack:
        response = await stack.post_infer()
        spans = await stack.flush_and_wait(lambda spans: ...)

The backend exports to the receiver through its own TracerProvider (never the process-global
one); Envoy exports with the fast-flush runtime, so spans arrive within ~100 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from inferway.backends.app import BackendHandle, start_backend
from inferway.devtools.demo_models import write_demo_repository
from inferway.devtools.otlp_receiver import OtlpReceiver, ReceivedSpan, start_otlp_receiver
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.observability.otel import setup_tracing
from inferway.xds.translate.tracing import FAST_FLUSH_RUNTIME
from tests.envoy_process import free_port

NODE_ID = "traced-node"
FEATURES = 8
GATEWAY_SERVICE = "test-gateway"
BACKEND_SERVICE = "test-backend"


@dataclass
class TracedStack:
    receiver: OtlpReceiver
    backend: BackendHandle
    gateway: Gateway
    provider: object
    url: str
    grpc_target: str
    access_log: Path

    async def post_infer(self, client: httpx.AsyncClient, rows: int = 1) -> httpx.Response:
        body = {
            "inputs": [
                {
                    "name": "x",
                    "shape": [rows, FEATURES],
                    "datatype": "FP32",
                    "data": [0.5] * (rows * FEATURES),
                }
            ]
        }
        return await client.post(f"{self.url}/v2/models/demo/infer", json=body)

    async def flush_and_wait(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0
    ) -> list[ReceivedSpan]:
        # force_flush blocks until the receiver (on this loop) answers: run it in a thread.
        await asyncio.to_thread(self.provider.force_flush)  # type: ignore[attr-defined]
        return await self.receiver.wait_for(predicate, timeout)


def _policy(
    listener: int,
    backend: BackendHandle,
    collector: str,
    sampling: float,
    log: Path,
    mask: dict[str, object] | None = None,
):
    policy = {
        "version": 1,
        "listeners": [{"name": "edge", "port": listener}],
        "services": [
            {"name": "model-http", "endpoints": [f"127.0.0.1:{backend.http_port}"]},
            {
                "name": "model-grpc",
                "protocol": "http2",
                "endpoints": [f"127.0.0.1:{backend.grpc_port}"],
            },
        ],
        "routes": [
            {
                "name": "grpc-inference",
                "match": {"path": {"prefix": "/inference.GRPCInferenceService/"}},
                "backends": [{"service": "model-grpc"}],
            },
            {
                "name": "http-inference",
                "match": {"path": {"prefix": "/v2/"}},
                "backends": [{"service": "model-http"}],
            },
        ],
        "observability": {
            "tracing": {
                "collector": collector,
                "service_name": GATEWAY_SERVICE,
                "sampling_percent": sampling,
            },
            "access_log": {"path": str(log)},
        },
    }
    if mask is not None:
        policy["mask"] = mask
    return policy


@contextlib.asynccontextmanager
async def traced_stack(
    tmp_path: Path, *, sampling_percent: float, mask: dict[str, object] | None = None
) -> AsyncIterator[TracedStack]:
    """``mask``: the policy's ``mask`` section (None: no masking)."""
    receiver = await start_otlp_receiver()
    stack = contextlib.AsyncExitStack()
    try:
        stack.push_async_callback(receiver.stop)
        root = tmp_path / "models"
        write_demo_repository(root, "demo", (1,), sizes=(FEATURES, 16, 4))
        provider = setup_tracing(BACKEND_SERVICE, f"http://{receiver.endpoint}", set_global=False)
        stack.push_async_callback(asyncio.to_thread, provider.shutdown)
        backend = await start_backend(root, watch=False, tracer_provider=provider)
        stack.push_async_callback(backend.stop, 1.0)

        listener = free_port()
        log = tmp_path / "access.log"
        policy_path = tmp_path / "policy.yaml"
        policy = _policy(listener, backend, receiver.endpoint, sampling_percent, log, mask)
        policy_path.write_text(yaml.safe_dump(policy, sort_keys=False))
        gateway = await start_gateway(
            GatewayOptions(
                policy_path=policy_path,
                xds_port=0,
                admin_port=0,
                envoy_admin_port=free_port(),
                node_id=NODE_ID,
                workdir=tmp_path / "envoy",
                envoy_concurrency=1,
                envoy_runtime=FAST_FLUSH_RUNTIME,
            )
        )
        stack.push_async_callback(gateway.stop)
        assert gateway.supervisor is not None
        assert await gateway.supervisor.wait_ready(20), gateway.supervisor.stderr_tail()
        version = gateway.control_plane.version or ""
        assert await gateway.cache.wait_for_acks(version, node_ids=[NODE_ID], timeout=20)
        yield TracedStack(
            receiver=receiver,
            backend=backend,
            gateway=gateway,
            provider=provider,
            url=f"http://127.0.0.1:{listener}",
            grpc_target=f"127.0.0.1:{listener}",
            access_log=log,
        )
    finally:
        await stack.aclose()
