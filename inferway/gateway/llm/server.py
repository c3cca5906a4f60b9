"""The LLM processor's gRPC server in the gateway process, and the keeper that runs it where
the live policy says, with the policy's models, client key and token limits.

The budget store outlives policy edits (a limit changed mid-minute keeps what was used);
it is this process's memory for now (limits are per Envoy, docs/llm.md), behind the
:class:`~inferway.gateway.llm.limits.BudgetStore` interface a fleet store can implement.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from google.protobuf import json_format
from prometheus_client import CollectorRegistry

from inferway._xds_protos.envoy.service.accesslog.v3 import als_pb2
from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2_grpc as ep_grpc,
)
from inferway.gateway.control_plane import AppliedPolicy, ControlPlane, PolicyFollower
from inferway.gateway.grpc_listen import listen_and_start
from inferway.gateway.llm.exchange import LlmSettings
from inferway.gateway.llm.limits import BudgetStore, LimitSpec, MemoryBudgetStore, TokenBudget
from inferway.gateway.llm.metrics import LlmMetrics
from inferway.gateway.llm.processor import LlmProcessor
from inferway.gateway.llm.report_lane import ReportLane
from inferway.policies.model import Policy
from inferway.xds.translate.llm import LLM_NAMESPACE

ACCESS_LOG_SERVICE = "envoy.service.accesslog.v3.AccessLogService"

__all__ = ["LlmKeeper", "LlmServer", "build_llm_settings", "wanted_address"]

log = logging.getLogger(__name__)


def wanted_address(policy: Policy) -> tuple[str, int, int] | None:
    """Where the policy wants the processor (address, port, reports port): only when a
    route is an ``openai`` one."""
    if not any(r.openai is not None for r in policy.routes):
        return None
    return policy.llm.address, policy.llm.port, policy.llm.report_port


def build_llm_settings(policy: Policy, store: BudgetStore) -> LlmSettings:
    models: dict[str, str] = {}
    routes: dict[str, str] = {}
    asking: set[str] = set()
    for route in policy.routes:
        if route.openai is None:
            continue
        routes.setdefault(route.openai.model, route.name)
        if route.openai.ask_for_usage:
            asking.add(route.openai.model)
        for name in (route.openai.model, *route.openai.aliases):
            models.setdefault(name, route.openai.model)
    limits = policy.llm.limits
    specs = [
        LimitSpec(name, tokens)
        for name, tokens in (
            ("tokens_per_minute", limits.tokens_per_minute),
            ("tokens_per_day", limits.tokens_per_day),
        )
        if tokens is not None
    ]
    prefixes = {r.openai.prefix.rstrip("/") or "/" for r in policy.routes if r.openai is not None}
    return LlmSettings(
        models=models,
        routes=routes,
        prefixes=tuple(sorted(prefixes)) or ("/v1",),
        ask_for_usage=frozenset(asking),
        client_header=policy.llm.client_key.header,
        hash_client=policy.llm.client_key.hash,
        budget=TokenBudget(specs, store) if specs else None,
    )


_UNCAPPED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class LlmServer:
    """The processor's gRPC server (Envoy's ext_proc) on ``host:port`` and its reports port
    (report_lane.py) on ``host:reports_port`` (port 0: the OS picks; the attributes tell)."""

    def __init__(self, host: str, port: int, reports_port: int, processor: LlmProcessor) -> None:
        self.host = host
        self.port = port
        self.processor = processor
        self.reports = ReportLane(
            host, reports_port, processor.report, processor.admit_http, processor.notice
        )
        self.closed_by_log = 0
        """Access log entries of requests that ended without a final report."""
        self._server: grpc.aio.Server | None = None

    async def start(self) -> LlmServer:
        # a whole prompt is one message: gRPC's 4 MiB default would fail longer ones (Envoy's
        # buffer, llm.max_body_bytes, is what bounds them)
        await self.reports.start()  # first: Envoy's answers report there once requests pass
        server = grpc.aio.server(options=_UNCAPPED)
        ep_grpc.add_ExternalProcessorServicer_to_server(self.processor, server)
        logs = grpc.stream_unary_rpc_method_handler(self.stream_access_logs)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(ACCESS_LOG_SERVICE, {"StreamAccessLogs": logs}),)
        )
        try:
            self.port = await listen_and_start(server, self.host, self.port, "LLM processor")
        except BaseException:
            await self.reports.stop()
            raise
        self._server = server
        return self

    async def stream_access_logs(self, requests: Any, _context: Any) -> bytes:
        """Envoy's gRPC access log (``llm.transport: http``; only requests still open, its
        filter says): each entry is a request over without its final report."""
        async for raw in requests:
            message = als_pb2.StreamAccessLogsMessage.FromString(raw)
            for entry in message.http_logs.log_entry:
                tags = entry.common_properties.metadata.filter_metadata.get(LLM_NAMESPACE)
                if tags is not None:
                    self.closed_by_log += 1
                    await self.processor.closed(json_format.MessageToDict(tags))
        return b""  # StreamAccessLogsResponse: empty

    async def stop(self, grace: float = 0.2) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)
        await self.reports.stop()
        await self.processor.settle()


class LlmKeeper(PolicyFollower):
    """Runs the processor while the live policy has openai routes, at the address it names,
    with its settings; started before Envoy gets the first snapshot that uses it."""

    def __init__(
        self,
        plane: ControlPlane,
        policy: Policy,
        registry: CollectorRegistry,
        store: BudgetStore | None = None,
    ) -> None:
        self._plane = plane
        self._initial = policy
        self.store: BudgetStore = store or MemoryBudgetStore()
        self.processor = LlmProcessor(LlmMetrics(registry))
        self.server: LlmServer | None = None
        self._pending: asyncio.Task[None] | None = None

    async def follow(self, policy: Policy) -> None:
        self.processor.settings = build_llm_settings(policy, self.store)
        wanted = wanted_address(policy)
        server = self.server
        current = None if server is None else (server.host, server.port, server.reports.port)
        if wanted == current:
            return
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if wanted is not None:
            self.server = await LlmServer(*wanted, self.processor).start()

    async def start(self) -> None:
        await self.follow(self._initial)
        self._plane.add_observer(self)

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        self._pending = asyncio.get_running_loop().create_task(self._follow(applied.policy))

    async def _follow(self, policy: Policy) -> None:
        try:
            await self.follow(policy)
        except OSError as error:  # openai routes fail (closed) until an edit fixes it
            log.error("%s; openai routes answer errors until it listens", error)

    async def stop(self) -> None:
        if self._pending is not None:
            await self._pending
        if self.server is not None:
            await self.server.stop()
            self.server = None
