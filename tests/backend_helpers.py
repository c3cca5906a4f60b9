"""The backend test files' shared set-up: a backend serving a repository on loopback ports
(stopped afterwards, even when the test fails) and the clients that talk to it. Each file
keeps its own fixtures, since each writes its own repository; these are what they wrap."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import grpc

from inferway.backends.app import BackendHandle, start_backend
from inferway.backends.jobs.settings import JobSettings
from inferway.backends.protocol import pb2_grpc
from inferway.backends.serving.settings import ServingSettings

__all__ = ["grpc_stub", "http_session", "running_backend"]


@asynccontextmanager
async def running_backend(
    root: Path, settings: ServingSettings | None = None, jobs: JobSettings | None = None
) -> AsyncIterator[BackendHandle]:
    """Every model under ``root`` loaded and served (no repository watching; asynchronous
    jobs only with ``jobs``)."""
    handle = await start_backend(root, watch=False, settings=settings, jobs=jobs)
    try:
        yield handle
    finally:
        await handle.stop()


@asynccontextmanager
async def grpc_stub(backend: BackendHandle) -> AsyncIterator[pb2_grpc.GRPCInferenceServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{backend.grpc_port}") as channel:
        yield pb2_grpc.GRPCInferenceServiceStub(channel)


@asynccontextmanager
async def http_session(backend: BackendHandle) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{backend.http_port}") as s:
        yield s
