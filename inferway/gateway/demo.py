"""``inferway demo``: a canary release end to end, with nothing to set up.

Two real inference backends (version 1 and version 2 of the demo model, ONNX Runtime behind
adaptive batching) run behind a real, supervised Envoy configured by the control plane from
a policy file at 10% canary. The demo measures the split through Envoy, then edits the file
to 50% the way a person would, and times how long Envoy takes to apply it.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import socket
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from opentelemetry.sdk.trace import TracerProvider
from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from inferway.gateway.console import make_console, short_version
from inferway.gateway.demo_backend import DEMO_FEATURES, DEMO_MODEL, start_demo_backends
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.observability.otel import setup_tracing
from inferway.observability.otlp_receiver import OtlpReceiver, ReceivedSpan, start_otlp_receiver
from inferway.observability.trace_tree import build_trace_tree, find_trace_id, render_trace_tree
from inferway.policies import Policy, dump_policy
from inferway.policies.resolve import resolve_policy
from inferway.xds.snapshot import build_snapshot
from inferway.xds.translate import translate_resolved
from inferway.xds.translate.tracing import FAST_FLUSH_RUNTIME

__all__ = [
    "CurlTls",
    "build_demo_policy",
    "build_infer_request",
    "build_keep_running_text",
    "run_demo",
]

NODE_ID = "inferway-demo"
GATEWAY_SERVICE = "inferway-gateway"
BACKEND_SERVICE = "inferway-backend"
CONCURRENCY = 16


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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_atomically(path: Path, text: str) -> None:
    """How editors save: a temporary file renamed over the original."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def build_infer_request(rng: random.Random, rows: int = 1) -> dict[str, object]:
    """A KServe v2 JSON inference request for the demo model: ``rows`` random input rows."""
    data = [round(rng.uniform(-1.0, 1.0), 4) for _ in range(rows * DEMO_FEATURES)]
    return {
        "inputs": [{"name": "x", "shape": [rows, DEMO_FEATURES], "datatype": "FP32", "data": data}]
    }


async def _sample(
    url: str, count: int, console: Console, label: str, client_options: dict | None = None
) -> tuple[Counter[str], float]:
    """Send ``count`` inference requests through Envoy (at most CONCURRENCY at once) and count
    the model versions that answered."""
    rng = random.Random(count)
    seen: Counter[str] = Counter()
    limit = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    started = time.perf_counter()
    progress = Progress(
        TextColumn("  {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task(label, total=count)
        async with httpx.AsyncClient(
            timeout=5.0, limits=limits, trust_env=False, **(client_options or {})
        ) as client:

            async def one(index: int) -> None:
                async with limit:
                    try:
                        response = await client.post(
                            f"{url}/v2/models/{DEMO_MODEL}/infer", json=build_infer_request(rng)
                        )
                        if response.status_code == 200:
                            seen[f"v{response.json().get('model_version', '?')}"] += 1
                        else:
                            seen[f"HTTP {response.status_code}"] += 1
                    except httpx.HTTPError as exc:
                        seen[type(exc).__name__] += 1
                    progress.advance(task)

            await asyncio.gather(*(one(i) for i in range(count)))
    return seen, time.perf_counter() - started


def _split_table(title: str, seen: Counter[str], policy: Policy, seconds: float) -> Table:
    total = sum(seen.values())
    expected = {b.service.removeprefix("model-"): b.weight for b in policy.routes[0].backends}
    table = Table(title=title, title_justify="left")
    table.add_column("version")
    table.add_column("policy", justify="right")
    table.add_column("observed", justify="right")
    table.add_column("requests", justify="right")
    table.add_column("", justify="center")
    for version in sorted(set(expected) | set(seen)):
        want = expected.get(version)
        got = 100.0 * seen.get(version, 0) / total if total else 0.0
        mark = (
            "[green]✓[/green]" if want is not None and _close(got, want, total) else "[red]✗[/red]"
        )
        table.add_row(
            version,
            "-" if want is None else f"{want:g}%",
            f"{got:.1f}%",
            str(seen.get(version, 0)),
            mark,
        )
    table.caption = f"{total} requests in {seconds:.2f}s ({total / max(seconds, 1e-9):.0f} req/s)"
    return table


def _close(observed_pct: float, expected_pct: float, total: int) -> bool:
    """Within 4 standard deviations of a binomial sample (plus 1 point of slack)."""
    if total == 0:
        return False
    p = expected_pct / 100.0
    sigma = 100.0 * math.sqrt(max(p * (1 - p), 1e-9) / total)
    return abs(observed_pct - expected_pct) <= 4 * sigma + 1.0


def _split_ok(seen: Counter[str], policy: Policy) -> bool:
    total = sum(seen.values())
    expected = {b.service.removeprefix("model-"): b.weight for b in policy.routes[0].backends}
    if set(seen) - set(expected):
        return False
    return all(
        _close(100.0 * seen.get(v, 0) / max(total, 1), want, total) for v, want in expected.items()
    )


def _trace_complete(request_id: str) -> Callable[[list[ReceivedSpan]], bool]:
    """True once the request's trace holds Envoy's span, the backend's span and a batch span
    linked to it."""

    def check(spans: list[ReceivedSpan]) -> bool:
        trace_id = find_trace_id(spans, request_id)
        if trace_id is None:
            return False
        own = [s for s in spans if s.trace_id == trace_id]
        linked = {sid for s in spans for t, sid in s.links if t == trace_id}
        return any(s.service == GATEWAY_SERVICE for s in own) and any(
            s.service == BACKEND_SERVICE and s.span_id in linked for s in own
        )

    return check


async def _show_trace(
    console: Console,
    url: str,
    receiver: OtlpReceiver,
    provider: TracerProvider,
    client_options: dict | None = None,
) -> bool:
    """Send one request and print its trace: Envoy span -> backend request span -> batch."""
    async with httpx.AsyncClient(timeout=5.0, trust_env=False, **(client_options or {})) as client:
        response = await client.post(
            f"{url}/v2/models/{DEMO_MODEL}/infer", json=build_infer_request(random.Random(7))
        )
    request_id = response.headers.get("x-request-id", "")
    if response.status_code != 200 or not request_id:
        console.print(f"[yellow]! traced request answered HTTP {response.status_code}[/yellow]")
        return False
    await asyncio.to_thread(provider.force_flush, 5000)
    try:
        spans = await receiver.wait_for(_trace_complete(request_id), timeout=5.0)
    except TimeoutError as exc:
        console.print(f"[yellow]! the trace did not arrive: {exc}[/yellow]")
        return False
    trace_id = find_trace_id(spans, request_id) or ""
    console.print(
        render_trace_tree(
            build_trace_tree(spans, trace_id),
            title=f"trace of one request  [dim](x-request-id {request_id}, trace {trace_id})[/dim]",
        )
    )
    return True


async def run_demo(
    *, once: bool = False, requests: int = 400, trace: bool = True, mtls: bool = False
) -> int:
    console = make_console(soft_wrap=False)
    console.print(
        Panel.fit(
            "[bold]inferway demo[/bold]: a canary release through a real Envoy\n"
            "two model versions · policy at 10% canary · live edit to 50%",
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
        with console.status("writing the demo model and starting two inference backends"):
            backends = await start_demo_backends(workdir, tracer_provider=provider)
        console.print(
            f"[green]✓[/green] backends (model {DEMO_MODEL!r}, ONNX Runtime): "
            + ", ".join(f"{v} on 127.0.0.1:{p}" for v, p in backends.ports.items())
        )
        gateway: Gateway | None = None
        tls, client_options, curl_tls = _demo_mtls(workdir, console) if mtls else (None, {}, None)
        try:
            listener_port = _free_port()
            policy = build_demo_policy(
                listener_port, backends.ports, canary=10, collector=collector, tls=tls
            )
            policy_path = workdir / "policy.yaml"
            policy_path.write_text(dump_policy(policy), encoding="utf-8")
            options = GatewayOptions(
                policy_path=policy_path,
                xds_port=0,
                admin_port=0,
                envoy_admin_port=_free_port(),
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
            seen, seconds = await _sample(url, requests, console, "10% canary", client_options)
            console.print(_split_table("Traffic at 10% canary", seen, policy, seconds))
            first_ok = _split_ok(seen, policy)

            new_policy = build_demo_policy(
                listener_port, backends.ports, canary=50, collector=collector, tls=tls
            )
            state = gateway.control_plane.state  # certificates too, with --mtls
            new_version = build_snapshot(
                translate_resolved(resolve_policy(new_policy, state))
            ).version
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
            seen, seconds = await _sample(url, requests, console, "50% canary", client_options)
            console.print(_split_table("Traffic at 50% canary", seen, new_policy, seconds))
            second_ok = _split_ok(seen, new_policy)
            if not (first_ok and second_ok):
                console.print("[yellow]! the observed split is outside the expected range[/yellow]")
            if receiver is not None and provider is not None:
                await _show_trace(console, url, receiver, provider, client_options)

            if not once:
                await _keep_running(console, url, gateway, policy_path, curl_tls)
            return 0 if first_ok and second_ok else 1
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


@dataclass(frozen=True)
class CurlTls:
    """The files a curl needs to call the demo's mutual-TLS listener."""

    ca: Path
    certificate: Path
    private_key: Path


def build_keep_running_text(
    url: str,
    admin_url: str,
    policy_path: Path,
    request_path: Path,
    curl_tls: CurlTls | None = None,
) -> str:
    """What the "keeps running" panel says: commands that work as printed (with ``--mtls``,
    the curl presents the client certificate the demo minted and trusts its CA)."""
    tls = ""
    if curl_tls is not None:
        tls = (
            f"--cacert {curl_tls.ca} --cert {curl_tls.certificate} "
            f"--key {curl_tls.private_key} \\\n            "
        )
    return (
        f"try it:   curl {tls}{url}/v2/models/{DEMO_MODEL}/infer -d @{request_path}\n"
        f"status:   inferway status --admin {admin_url}\n"
        f"          (JSON: curl {admin_url}/status)\n"
        f"edit:     {policy_path}  (saved edits apply live; invalid ones are refused)\n"
        "Ctrl-C to stop"
    )


async def _keep_running(
    console: Console,
    url: str,
    gateway: Gateway,
    policy_path: Path,
    curl_tls: CurlTls | None = None,
) -> None:
    request_path = policy_path.with_name("request.json")
    request_path.write_text(json.dumps(build_infer_request(random.Random(0))), encoding="utf-8")
    text = build_keep_running_text(url, gateway.admin.url, policy_path, request_path, curl_tls)
    console.print(Panel.fit(Text(text), title="the demo keeps running", border_style="cyan"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _demo_mtls(
    workdir: Path, console: Console
) -> tuple[dict[str, object], dict[str, object], CurlTls]:
    """Mint a development CA, a server and a client certificate (``inferway certs init``) and
    return the listener's mutual-TLS settings, the httpx options of a client presenting the
    client certificate, and the same files for a curl."""
    import ssl

    from inferway.gateway.certs import (
        build_ca,
        build_certificate,
        bundle_paths,
        spiffe_id_for,
        write_bundle,
    )

    certs = workdir / "certs"
    ca = build_ca("inferway demo CA", days=1)
    server = build_certificate(
        ca,
        spiffe_id=spiffe_id_for("gateway"),
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
        server=True,
        days=1,
    )
    client = build_certificate(ca, spiffe_id=spiffe_id_for("client"), server=False, client=True)
    write_bundle(certs, "ca", ca)
    server_paths = write_bundle(certs, "server", server)
    client_paths = write_bundle(certs, "client", client)
    context = ssl.create_default_context(cafile=str(bundle_paths(certs, "ca").certificate))
    context.load_cert_chain(client_paths.certificate, client_paths.private_key)
    console.print(
        f"[green]✓[/green] mutual TLS: development CA and certificates in {certs}; only "
        f"{spiffe_id_for('client')} may call the listener"
    )
    tls = {
        "mode": "mutual",
        "certificate": str(server_paths.certificate),
        "private_key": str(server_paths.private_key),
        "client_ca": str(bundle_paths(certs, "ca").certificate),
        "allowed_identities": [spiffe_id_for("client")],
    }
    curl_tls = CurlTls(
        bundle_paths(certs, "ca").certificate, client_paths.certificate, client_paths.private_key
    )
    return tls, {"verify": context}, curl_tls
