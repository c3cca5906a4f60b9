"""Upstream mTLS: the inferway backend requires client certificates on HTTP and gRPC; Envoy,
holding a client certificate from the CA (delivered by SDS), gets through on both; a client
without a certificate is refused by the backend itself."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from pathlib import Path

import grpc
import httpx
import pytest

from inferway.backends.app import start_backend
from inferway.backends.protocol import pb2, pb2_grpc
from inferway.backends.tls import BackendTls
from inferway.devtools.demo_models import build_add
from tests.envoy_process import free_port
from tests.integration.tls_support import TlsGateway, client_context, https_get, mint_pki

pytestmark = pytest.mark.integration


async def test_backend_requiring_client_certs_accepts_envoy_and_refuses_plain_clients(
    tmp_path: Path,
) -> None:
    pki = mint_pki(tmp_path / "certs")
    build_add(tmp_path / "models" / "add" / "1" / "model.onnx")
    backend = await start_backend(
        tmp_path / "models",
        watch=False,
        tls=BackendTls(
            certificate=pki.server.certificate,
            private_key=pki.server.private_key,
            client_ca=pki.ca,
            require_client_cert=True,
        ),
    )
    port = free_port()
    policy = tmp_path / "policy.yaml"
    tls = """
    tls:
      mode: mutual
      ca: certs/ca.pem
      certificate: certs/client.pem
      private_key: certs/client-key.pem
      sni: localhost"""
    policy.write_text(
        f"""
version: 1
listeners:
  - name: edge
    port: {port}
services:
  - name: model-http
    endpoints: ["127.0.0.1:{backend.http_port}"]{tls}
  - name: model-grpc
    protocol: http2
    endpoints: ["127.0.0.1:{backend.grpc_port}"]{tls}
routes:
  - name: grpc
    match: {{path: {{prefix: /inference.GRPCInferenceService/}}}}
    backends: [{{service: model-grpc}}]
  - name: http
    backends: [{{service: model-http}}]
"""
    )
    gateway = TlsGateway(policy)
    try:
        await gateway.start()
        # HTTP through Envoy: Envoy presents its client certificate to the backend.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            deadline = time.monotonic() + 10
            while True:
                response = await client.get("/v2/health/ready")
                if response.status_code == 200:
                    break
                assert time.monotonic() < deadline, (response.status_code, response.text)
                await asyncio.sleep(0.05)
            infer = await client.post(
                "/v2/models/add/infer",
                json={
                    "inputs": [
                        {"name": "a", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                        {"name": "b", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
                    ]
                },
            )
            assert infer.status_code == 200, infer.text
            sums = {o["name"]: o["data"] for o in json.loads(infer.text)["outputs"]}["sum"]
            assert sums == [2, 3, 4, 5]

        # gRPC through Envoy (plaintext h2c to Envoy, mTLS from Envoy to the backend).
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb2_grpc.GRPCInferenceServiceStub(channel)
            live = await stub.ServerLive(pb2.ServerLiveRequest(), timeout=5)
            assert live.live is True

        # Straight to the backend without a client certificate: refused, HTTP and gRPC.
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            await https_get(backend.http_port, client_context(pki, None), "/v2/health/live")
        credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        async with grpc.aio.secure_channel(
            f"localhost:{backend.grpc_port}", credentials
        ) as channel:
            stub = pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ServerLive(pb2.ServerLiveRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # ... and a plaintext client gets nowhere either.
        with pytest.raises(httpx.TransportError):
            async with httpx.AsyncClient(timeout=3) as plain:
                await plain.get(f"http://127.0.0.1:{backend.http_port}/v2/health/live")
        # With the client certificate, a direct client is accepted (the refusals above were
        # about the missing certificate, not a broken server).
        direct = await https_get(
            backend.http_port, client_context(pki, pki.client), "/v2/health/live"
        )
        assert direct.status == 200
    finally:
        await gateway.stop()
        await backend.stop(grace=0)
