"""ORCA load reports stop at Envoy: a real inferway backend sends ``endpoint-load-metrics``
(a header over HTTP, a trailer over gRPC) and clients going through Envoy see neither."""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest

from inferway.backends.protocol import pb2, pb2_grpc
from inferway.backends.telemetry.orca import ORCA_HEADER
from tests.observability_stack import FEATURES, traced_stack

pytestmark = pytest.mark.integration


def _request() -> pb2.ModelInferRequest:
    request = pb2.ModelInferRequest(model_name="demo")
    request.inputs.add(name="x", datatype="FP32", shape=[1, FEATURES])
    request.raw_input_contents.append(np.ones((1, FEATURES), np.float32).tobytes())
    return request


async def _trailers(target: str) -> dict[str, str]:
    async with grpc.aio.insecure_channel(target) as channel:
        call = pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(_request())
        await call
        return {key: str(value) for key, value in await call.trailing_metadata()}


async def test_clients_through_envoy_never_see_the_orca_load_report(tmp_path) -> None:
    async with traced_stack(tmp_path, sampling_percent=0) as stack:
        # The backend does send it (else this test would prove nothing)...
        direct = await _trailers(f"127.0.0.1:{stack.backend.grpc_port}")
        assert ORCA_HEADER in direct, direct
        # ...and Envoy strips it: from gRPC trailers and from HTTP headers.
        through_envoy = await _trailers(stack.grpc_target)
        assert ORCA_HEADER not in through_envoy, through_envoy
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            response = await stack.post_infer(client)
        assert response.status_code == 200
        assert ORCA_HEADER not in response.headers
