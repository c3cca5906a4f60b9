"""``inferway demo``: a canary release end to end, with nothing to set up.

Two real inference backends (version 1 and version 2 of the demo model, ONNX Runtime behind
adaptive batching) run behind a real, supervised Envoy configured by the control plane from
a policy file at 10% canary. The demo measures the split through Envoy, then edits the file
to 50% the way a person would, and times how long Envoy takes to apply it. With ``rollout``,
the rollout controller takes over (``demo_rollout``): a good v2 is promoted step by step, a
bad v3 (a third backend failing 5% of its requests) is rolled back.

This module is the order of events; the steps live next to it, so each can be read and
tested alone: ``demo_traffic`` (requests and the split check), ``demo_trace`` (one request's
trace tree), ``demo_output`` (tables and the "keeps running" panel), ``demo_mtls``
(``--mtls`` certificates), ``demo_rollout`` (the ``--rollout`` scene).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from rich.panel import Panel

from inferway.console import make_console, short_version
from inferway.devtools.demo_backend import DEMO_MODEL, start_demo_backends
from inferway.devtools.demo_mtls import CurlTls, setup_demo_mtls
from inferway.devtools.demo_output import build_keep_running_text, build_split_table, keep_running
from inferway.devtools.demo_rollout import BAD_CANARY_FAULT, run_rollout_scene
from inferway.devtools.demo_trace import BACKEND_SERVICE, GATEWAY_SERVICE, show_trace
from inferway.devtools.demo_traffic import build_infer_request, sample_traffic, split_ok
from inferway.devtools.otlp_receiver import OtlpReceiver, start_otlp_receiver
from inferway.free_ports import free_ports
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.observability.otel import setup_tracing
from inferway.policies import Policy, dump_policy
from inferway.xds.policy_snapshot import build_policy_snapshot
from inferway.xds.translate.tracing import FAST_FLUSH_RUNTIME

__all__ = [
    "CurlTls",
    "build_demo_policy",
    "build_infer_request",
    "build_keep_running_text",
    "run_demo",
]

NODE_ID = "inferway-demo"


def build_demo_policy(
    listener_port: int,
    backend_ports: dict[str, int],
    canary: float,
    *,
    collector: str | None = None,
    tls: dict[str, object] | None = None,
) -> Policy:
    """``model-v1`` takes ``100 - canary`` percent of the traffic, ``model-v2`` the rest.
    With ``collector``, Envoy traces every request there (OTLP/gRPC)."""
    observability = (
        {"tracing": {"collector": collector, "service_name": GATEWAY_SERVICE}}
        if collector
        else None
    )
    return Policy.model_validate(
        {
            "observability": observability,
            "version": 1,
            "listeners": [
                {"name": "public", "address": "127.0.0.1", "port": listener_port, "tls": tls}
            ],
            "services": [
                {"name": f"model-{version}", "endpoints": [f"127.0.0.1:{port}"]}
                for version, port in sorted(backend_ports.items())
            ],
            "routes": [
                {
                    "name": "inference",
                    "match": {"path": {"prefix": f"/v2/models/{DEMO_MODEL}"}},
                    "backends": [
                        {"service": "model-v1", "weight": round(100 - canary, 1)},
                        {"service": "model-v2", "weight": canary},
                    ],
                    "timeout": "5s",
                }
            ],
        }
    )


def _write_atomically(path: Path, text: str) -> None:
    """How editors save: a temporary file renamed over the original."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


async def run_demo(
    *,
    once: bool = False,
    requests: int = 400,
    trace: bool = True,
    mtls: bool = False,
    rollout: bool = False,
) -> int:
    console = make_console(soft_wrap=False)
    scenes = "two model versions · policy at 10% canary · live edit to 50%"
    if rollout:
        scenes += "\nrollout: v2 promoted step by step · a bad v3 rolled back"
    console.print(
        Panel.fit(
            f"[bold]inferway demo[/bold]: a canary release through a real Envoy\n{scenes}",
            border_style="cyan",
        )
    )
    with tempfile.TemporaryDirectory(prefix="inferway-demo-") as tmp:
        workdir = Path(tmp)
        receiver: OtlpReceiver | None = None
        provider: TracerProvider | None = None
        if trace:
            receiver = await start_otlp_receiver()
            provider = setup_tracing(
                BACKEND_SERVICE, f"http://{receiver.endpoint}", set_global=False
            )
        collector = receiver.endpoint if receiver is not None else None
        versions, faults = ((1, 2, 3), {3: BAD_CANARY_FAULT}) if rollout else ((1, 2), {})
        with console.status("writing the demo model and starting the inference backends"):
            backends = await start_demo_backends(
                workdir, versions, tracer_provider=provider, faults=faults
            )
        console.print(
            f"[green]✓[/green] backends (model {DEMO_MODEL!r}, ONNX Runtime): "
            + ", ".join(f"{v} on 127.0.0.1:{p}" for v, p in backends.ports.items())
        )
        gateway: Gateway | None = None
        tls, client_options, curl_tls = (
            setup_demo_mtls(workdir, console) if mtls else (None, {}, None)
        )
        try:
            # All four picked together: a port bound to 0 later could be the listener's.
            listener_port, envoy_admin_port, xds_port, admin_port = free_ports(*["127.0.0.1"] * 4)
            policy = build_demo_policy(
                listener_port, backends.ports, canary=10, collector=collector, tls=tls
            )
            policy_path = workdir / "policy.yaml"
            policy_path.write_text(dump_policy(policy), encoding="utf-8")
            options = GatewayOptions(
                policy_path=policy_path,
                xds_port=xds_port,
                admin_port=admin_port,
                envoy_admin_port=envoy_admin_port,
                node_id=NODE_ID,
                workdir=workdir / "envoy",
                envoy_concurrency=1,
                envoy_runtime=FAST_FLUSH_RUNTIME if trace else None,
            )
            with console.status("starting the control plane and Envoy"):
                started = time.perf_counter()
                gateway = await start_gateway(options)
                version = gateway.control_plane.version or ""
                ready = await gateway.supervisor.wait_ready(20) if gateway.supervisor else False
                acked = ready and await gateway.cache.wait_for_acks(
                    version, node_ids=[NODE_ID], timeout=20
                )
            if not acked:
                tail = gateway.supervisor.stderr_tail()[-10:] if gateway.supervisor else []
                console.print("[red]✗ Envoy did not become ready and ACK the policy[/red]")
                for line in tail:
                    console.print(f"  {line}", markup=False)
                return 1
            console.print(
                f"[green]✓[/green] Envoy ready and ACKed snapshot {short_version(version)} "
                f"in {time.perf_counter() - started:.2f}s  (policy: {policy_path})"
            )
            url = f"{'https' if mtls else 'http'}://127.0.0.1:{listener_port}"
            seen, seconds = await sample_traffic(
                url, requests, console, "10% canary", client_options
            )
            console.print(build_split_table("Traffic at 10% canary", seen, policy, seconds))
            first_ok = split_ok(seen, policy)

            new_policy = build_demo_policy(
                listener_port, backends.ports, canary=50, collector=collector, tls=tls
            )
            state = gateway.control_plane.state  # certificates too, with --mtls
            new_version = build_policy_snapshot(new_policy, state, str(policy_path)).version
            with console.status("editing policy.yaml: v2 weight 10 -> 50"):
                written = time.perf_counter()
                _write_atomically(policy_path, dump_policy(new_policy))
                applied = await gateway.cache.wait_for_acks(
                    new_version, node_ids=[NODE_ID], timeout=10
                )
                change_ms = (time.perf_counter() - written) * 1000
            if not applied:
                console.print("[red]✗ Envoy did not apply the edited policy within 10s[/red]")
                return 1
            console.print(
                "[green]✓[/green] policy change applied by Envoy in "
                f"[bold]{change_ms:.0f} ms[/bold] (file write -> watcher -> snapshot "
                f"{short_version(new_version)} -> ACK)"
            )
            seen, seconds = await sample_traffic(
                url, requests, console, "50% canary", client_options
            )
            console.print(build_split_table("Traffic at 50% canary", seen, new_policy, seconds))
            second_ok = split_ok(seen, new_policy)
            if not (first_ok and second_ok):
                console.print("[yellow]! the observed split is outside the expected range[/yellow]")
            if receiver is not None and provider is not None:
                await show_trace(console, url, receiver, provider, client_options)
            rolled = True
            if rollout:
                assert gateway.rollouts is not None  # start_gateway always makes the driver
                rolled = await run_rollout_scene(
                    console,
                    url,
                    gateway.rollouts,
                    new_policy,
                    lambda p: _write_atomically(policy_path, dump_policy(p)),
                    client_options,
                )

            if not once:
                await keep_running(console, url, gateway, policy_path, curl_tls)
            return 0 if first_ok and second_ok and rolled else 1
        finally:
            with console.status("stopping Envoy, the control plane and the backends"):
                if gateway is not None:
                    await gateway.stop()
                await backends.stop()
                if provider is not None:
                    await asyncio.to_thread(provider.shutdown)
                if receiver is not None:
                    await receiver.stop()
            console.print("[green]✓[/green] stopped cleanly")
