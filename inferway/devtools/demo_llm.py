"""``inferway demo --llm``: one streamed chat completion through a real Envoy to a real LLM
engine, with what the gateway measured and counted for it: time to first token, tokens,
and what they cost at the demo policy's prices.

The engine is llama-cpp-python's OpenAI-compatible server (llama.cpp inside) on the tiny
random-weight model ``tiny_gguf`` writes (its words are nonsense; it is about the plumbing).
The engine is not a dependency of inferway: without it the scene says how to install it
(``python scripts/build_llm_engine.py``) and ends with success, so ``make demo`` never
fails for it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from inferway.free_ports import free_ports
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.policies import Policy, dump_policy

__all__ = [
    "ENGINE_MODULES",
    "INSTALL_HINT",
    "PRICE_INPUT_PER_1M",
    "PRICE_OUTPUT_PER_1M",
    "build_llm_demo_policy",
    "run_llm_scene",
]

ENGINE_MODULES = ("llama_cpp", "fastapi", "uvicorn", "gguf")
"""What the scene needs: the engine's server and the GGUF writer (the llm-engine extra)."""
INSTALL_HINT = (
    "python scripts/build_llm_engine.py   (from a clone: compiles llama-cpp-python once, "
    "10-15 minutes on 2 cores, and installs the llm-engine extra)"
)
PRICE_INPUT_PER_1M = 0.50
PRICE_OUTPUT_PER_1M = 1.50
"""The demo's prices in USD per 1,000,000 prompt and completion tokens (docs/cost.md)."""
MODEL = "tiny"
NODE_ID = "inferway-demo-llm"
PROMPT = "Tell me a story about Envoy."


def build_llm_demo_policy(
    listener_port: int, llm_port: int, reports_port: int, engine_port: int
) -> Policy:
    """One openai route (model ``tiny``, alias ``gpt-4o-mini``) to the engine, priced."""
    return Policy.model_validate(
        {
            "version": 1,
            "listeners": [{"name": "public", "address": "127.0.0.1", "port": listener_port}],
            "llm": {"port": llm_port, "reports_port": reports_port, "timeout": "30s"},
            "services": [
                {
                    "name": "llama-cpp",
                    "endpoints": [f"127.0.0.1:{engine_port}"],
                    "cost": {
                        "per_replica_hour": 0,
                        "per_1m_input_tokens": PRICE_INPUT_PER_1M,
                        "per_1m_output_tokens": PRICE_OUTPUT_PER_1M,
                    },
                }
            ],
            "routes": [
                {
                    "name": "chat",
                    "openai": {"model": MODEL, "aliases": ["gpt-4o-mini"]},
                    "backends": [{"service": "llama-cpp"}],
                }
            ],
        }
    )


def _start_engine(model: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(model),
        "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", "2048", "--n_threads", "1", "--n_threads_batch", "1",
        "--interrupt_requests", "False", "--verbose", "False",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"NO_PROXY": "*"}
        )


async def _wait_engine(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"the engine exited with {process.returncode}: {tail}")
            try:
                if (await client.get(f"http://127.0.0.1:{port}/v1/models")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the engine did not answer /v1/models within 60 s (its log: {log})")


@dataclass
class StreamSeen:
    """What the client saw of its stream."""

    status: int
    text: str
    chunks: int
    ttft_s: float | None
    done: bool


async def _stream(url: str, max_tokens: int) -> StreamSeen:
    body = {
        "model": "gpt-4o-mini",  # the alias: the gateway rewrites it to the engine's name
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    text: list[str] = []
    ttft: float | None = None
    done = False
    started = time.perf_counter()
    async with (
        httpx.AsyncClient(trust_env=False, timeout=60.0) as client,
        client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers={"x-api-key": "sk-demo"}
        ) as response,
    ):
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            for choice in orjson.loads(line[6:]).get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    text.append(piece)
        return StreamSeen(response.status_code, "".join(text), len(text), ttft, done)


def _counted(metrics_text: str) -> dict[str, float]:
    """The gateway's own counts for the demo route: tokens by type, TTFT sum and count."""
    out = {"input": 0.0, "output": 0.0, "ttft_sum": 0.0, "ttft_count": 0.0, "estimated": 0.0}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.labels.get("route") != "chat":
                continue
            if s.name == "inferway_llm_tokens_total":
                out[s.labels["type"]] += s.value
                if s.labels.get("estimated") == "true":
                    out["estimated"] += s.value
            elif s.name == "gen_ai_server_time_to_first_token_seconds_sum":
                out["ttft_sum"] += s.value
            elif s.name == "gen_ai_server_time_to_first_token_seconds_count":
                out["ttft_count"] += s.value
    return out


async def _through_gateway(console: Console, workdir: Path, engine_port: int) -> int:
    listener, llm, reports, xds, admin, envoy_admin = free_ports(*["127.0.0.1"] * 6)
    policy_path = workdir / "policy.yaml"
    policy_path.write_text(dump_policy(build_llm_demo_policy(listener, llm, reports, engine_port)))
    options = GatewayOptions(
        policy_path=policy_path, xds_port=xds, admin_port=admin, envoy_admin_port=envoy_admin,
        node_id=NODE_ID, workdir=workdir / "envoy", envoy_concurrency=1,
    )  # fmt: skip
    gateway: Gateway | None = None
    try:
        with console.status("starting the control plane, the LLM processor and Envoy"):
            gateway = await start_gateway(options)
            version = gateway.control_plane.version or ""
            ready = await gateway.supervisor.wait_ready(20) if gateway.supervisor else False
            acked = ready and await gateway.cache.wait_for_acks(
                version, node_ids=[NODE_ID], timeout=20
            )
        if not acked:
            console.print("[red]✗ Envoy did not become ready and ACK the policy[/red]")
            return 1
        console.print(f"[green]✓[/green] gateway ready: openai route 'chat' (policy {policy_path})")
        seen = await _stream(f"http://127.0.0.1:{listener}", max_tokens=24)
        if seen.status != 200 or not seen.done or not seen.chunks:
            console.print(f"[red]✗ the stream failed: HTTP {seen.status}, {seen.chunks} chunks")
            return 1
        console.print(f"[dim]the model's answer (random weights):[/dim] {seen.text!r}")
        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
            metrics = (await client.get(f"http://127.0.0.1:{admin}/metrics")).text
        counted = _counted(metrics)
        cost = (
            counted["input"] * PRICE_INPUT_PER_1M + counted["output"] * PRICE_OUTPUT_PER_1M
        ) / 1e6
        gateway_ttft = counted["ttft_sum"] / counted["ttft_count"] if counted["ttft_count"] else 0
        table = Table(title="one streamed chat completion through the gateway")
        table.add_column("measure")
        table.add_column("value", justify="right")
        table.add_column("from")
        table.add_row(
            "TTFT", f"{1000 * gateway_ttft:.1f} ms", "gateway (gen_ai_server_time_to_first_token)"
        )
        table.add_row("TTFT", f"{1000 * (seen.ttft_s or 0):.1f} ms", "client")
        source = "gateway (inferway_llm_tokens_total" + (
            ", estimated)" if counted["estimated"] else ")"
        )
        table.add_row("prompt tokens", f"{counted['input']:.0f}", source)
        table.add_row("completion tokens", f"{counted['output']:.0f}", source)
        table.add_row(
            "cost",
            f"${cost:.8f}",
            f"${PRICE_INPUT_PER_1M}/1M in, ${PRICE_OUTPUT_PER_1M}/1M out (policy cost:)",
        )
        console.print(table)
        if counted["estimated"]:
            console.print(
                "[dim]llama-cpp-python's server sends no usage in streams: the gateway counted "
                "the completion by chunks (one token each, exact here) and the prompt by its "
                "bytes, and marked the counts estimated=true.[/dim]"
            )
        return 0 if counted["output"] > 0 and counted["ttft_count"] >= 1 else 1
    finally:
        if gateway is not None:
            await gateway.stop()


async def run_llm_scene(console: Console) -> int:
    """The scene; 0 also when the engine is not installed (the scene then says how)."""
    missing = [m for m in ENGINE_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        console.print(
            f"[yellow]LLM scene skipped[/yellow]: the test LLM engine is not installed "
            f"({', '.join(missing)} missing). Install it with:\n  {INSTALL_HINT}"
        )
        return 0
    from inferway.devtools.tiny_gguf import TinyLlama, write_tiny_gguf

    with tempfile.TemporaryDirectory(prefix="inferway-demo-llm-") as tmp:
        workdir = Path(tmp)
        (engine_port,) = free_ports("127.0.0.1")
        log = workdir / "engine.log"
        with console.status("writing the tiny model and starting llama.cpp's server"):
            model = write_tiny_gguf(workdir / "tiny.gguf", TinyLlama(seed=0, context_length=2048))
            engine = _start_engine(model, engine_port, log)
        try:
            await _wait_engine(engine, engine_port, log)
            console.print(
                f"[green]✓[/green] llama.cpp engine (llama-cpp-python) on 127.0.0.1:{engine_port}"
                f", model {MODEL!r} ({model.stat().st_size // 1024} KiB, random weights)"
            )
            return await _through_gateway(console, workdir, engine_port)
        finally:
            engine.terminate()
            try:
                engine.wait(timeout=10)
            except subprocess.TimeoutExpired:
                engine.kill()
                engine.wait(timeout=10)
