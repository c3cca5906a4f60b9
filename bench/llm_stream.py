"""Streaming LLM traffic side by side in one run: straight to the engine, through inferway's
gateway (a real Envoy configured by inferway's control plane) and through LiteLLM's proxy on
the same engine and load, in rotated rounds, medians over rounds.

Each round runs every target once (the order rotates each round, so no target always runs on
a warm or a tired host) with the same load: ``--concurrency`` streams in a closed loop (each
sends its next request when its stream ends) or, with ``--mode open``, Poisson arrivals at
``--rate`` capped at ``--concurrency`` in flight. Measured per target: time to first token
(TTFT) p50/p99, inter-token latency (ITL) p50/p99, tokens/s, completed requests/s, errors, and
the proxy's CPU (psutil: Envoy's process; LiteLLM's process tree) per request and per token.
``--capacity RATES`` adds the issue's throughput comparison: open loop at each rate, and per
target the highest rate it serves with TTFT p99 under ``--slo-ms`` and no error.

The engine is ``--engine synthetic`` (default: a paced OpenAI-compatible SSE server started
here, bench/_llm_engine.py), ``--engine llama`` (the test engine of docs/llm.md:
llama-cpp-python's server on the tiny random-weight model, started here through
tests/llm_engine.py; it computes one request at a time, so keep ``--concurrency`` low) or the
URL of a running one (``--engine http://127.0.0.1:8080 --model tiny``). Two arms go through one
inferway gateway: ``plain``, Envoy on a plain prefix route to the engine (stream-friendly 300 s
timeout; SSE passes through chunk by chunk), and ``inferway``, its ``openai`` route (the LLM
processor and Envoy's stream filter counting tokens). Envoy runs one worker here
(``--envoy-concurrency``, default 1) against LiteLLM's one worker (``--litellm-workers``): one
each; ``inferway run`` gives Envoy one per core. LiteLLM is installed by this script in its own
venv (bench/_litellm.py), never by inferway.

    .venv/bin/python bench/llm_stream.py                      # 100 streams, 10 s, 3 rounds
    .venv/bin/python bench/llm_stream.py --quick              # 3 s, 1 round
    .venv/bin/python bench/llm_stream.py --capacity 25,50,100,200 --slo-ms 250
    .venv/bin/python bench/llm_stream.py --engine llama --concurrency 4 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _common import environment, free_port, print_table, write_results
from _litellm import LiteLLMProxy, ensure_litellm
from _llm_engine import engine_main
from _llm_load import LoadSpec, load_main
from _llm_targets import CpuMeter, settle, start_inferway

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]

FIELDS = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tokens_per_s")


def spawn(target: Any, *args: Any) -> tuple[mp.process.BaseProcess, Connection]:
    context = mp.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=target, args=(*args, child), daemon=True)
    process.start()
    return process, parent


def run_load(spec: LoadSpec) -> dict[str, Any]:
    """One load run in a fresh process (its CPU is not the targets')."""
    process, conn = spawn(load_main, spec)
    if not conn.poll(spec["duration"] + 120):
        process.kill()
        raise RuntimeError(f"the load on {spec['url']} did not finish")
    result: dict[str, Any] = conn.recv()
    process.join(5)
    return result


async def wait_streams(url: str, model: str, headers: dict[str, str], timeout: float) -> None:
    """Until ``url`` answers one streamed completion with a token and [DONE]."""
    spec: LoadSpec = {
        "url": url, "model": model, "headers": headers, "mode": "closed", "concurrency": 1,
        "rate": 1.0, "duration": 0.5, "max_tokens": 4, "seed": 0,
    }  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        result = await asyncio.to_thread(run_load, spec)
        if result["completed"] and not result["errors"]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} does not stream: {result['error_kinds']}")
        await asyncio.sleep(0.5)


def _median(values: list[float]) -> float:
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else float("nan")


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {field: _median([r[field] for r in runs]) for field in FIELDS}
    out["requests_per_s"] = _median([r["requests_per_s"] for r in runs])
    out["errors"] = sum(r["errors"] for r in runs)
    out["streams"] = sum(r["streams"] for r in runs)
    cpu_req = [r["cpu_s"] / r["completed"] * 1e3 for r in runs if r.get("completed")]
    cpu_tok = [r["cpu_s"] / r["tokens"] * 1e6 for r in runs if r.get("tokens")]
    out["cpu_ms_per_request"] = _median(cpu_req)
    out["cpu_us_per_token"] = _median(cpu_tok)
    return out


async def measure(
    args: argparse.Namespace, targets: dict[str, dict[str, Any]], quiet: list[CpuMeter]
) -> dict[str, Any]:
    names = list(targets)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for round_index in range(args.rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            target = targets[name]
            spec: LoadSpec = {
                "url": target["url"], "model": args.model, "headers": target["headers"],
                "mode": args.mode, "concurrency": args.concurrency, "rate": args.rate,
                "duration": args.duration, "max_tokens": args.max_tokens,
                "seed": round_index,
            }  # fmt: skip
            meter: CpuMeter = target["cpu"]
            await settle(quiet)
            before = meter.seconds()
            result = await asyncio.to_thread(run_load, spec)
            result["cpu_s"] = meter.seconds() - before
            result["duration_s"] = args.duration
            result["round"] = round_index
            runs[name].append(result)
            print(
                f"round {round_index + 1}/{args.rounds} {name}: TTFT p99 "
                f"{result['ttft_p99_ms']:.2f} ms, {result['tokens_per_s']:,.0f} tokens/s, "
                f"{result['errors']} errors",
                flush=True,
            )
    return runs


async def capacity(
    args: argparse.Namespace, targets: dict[str, dict[str, Any]], quiet: list[CpuMeter]
) -> dict[str, dict[str, Any]]:
    """Per target the highest of ``--capacity`` rates served with TTFT p99 <= --slo-ms, no
    error and at least 95% of the offered rate completed; each rate's run kept."""
    out: dict[str, dict[str, Any]] = {}
    for name, target in targets.items():
        steps, best = [], 0.0
        for rate in args.capacity:
            spec: LoadSpec = {
                "url": target["url"], "model": args.model, "headers": target["headers"],
                "mode": "open", "concurrency": max(args.concurrency, 1000), "rate": rate,
                "duration": args.duration, "max_tokens": args.max_tokens, "seed": 7,
            }  # fmt: skip
            await settle(quiet)
            result = await asyncio.to_thread(run_load, spec)
            ok = (
                result["errors"] == 0
                and result["ttft_p99_ms"] <= args.slo_ms
                and result["completed"] >= 0.95 * rate * args.duration
            )
            steps.append({"rate": rate, "ok": ok, **result})
            print(
                f"capacity {name} at {rate:g} req/s: TTFT p99 {result['ttft_p99_ms']:.1f} ms, "
                f"{result['completed']} completed, {result['errors']} errors -> "
                f"{'ok' if ok else 'over'}",
                flush=True,
            )
            if not ok:
                break
            best = rate
        out[name] = {"max_rate": best, "steps": steps}
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="inferway-llm-bench-"))
    engine_process: mp.process.BaseProcess | None = None
    engine_conn: Connection | None = None
    gateway = llama = None
    try:
        if args.engine == "synthetic":
            engine_process, engine_conn = spawn(
                engine_main, args.model, args.ttft_ms, args.token_ms
            )
            if not engine_conn.poll(30):
                raise RuntimeError("the synthetic engine did not start")
            host, port = "127.0.0.1", int(engine_conn.recv())
            engine_pid = engine_process.pid
        elif args.engine == "llama":
            sys.path.insert(0, str(ROOT))  # tests/ is the engine fixture's home
            from tests.llm_engine import start_llm_engine, write_test_model

            model_path = await asyncio.to_thread(write_test_model, workdir)
            llama = await asyncio.to_thread(
                start_llm_engine, model_path, model=args.model, verbose=False, log_dir=workdir
            )
            host, port, engine_pid = "127.0.0.1", llama.port, llama.pid
        else:
            host, _, rest = args.engine.removeprefix("http://").partition(":")
            port = int(rest.split("/")[0])
            engine_pid = None
        direct = f"http://{host}:{port}"
        targets: dict[str, dict[str, Any]] = {}
        if "direct" in args.targets:
            targets["direct"] = {"url": direct, "headers": {}, "cpu": CpuMeter(None, False)}
        if "inferway" in args.targets or "plain" in args.targets:
            gateway, llm_port, plain_port = await start_inferway(
                host, port, args.model, workdir, args.envoy_concurrency
            )
            assert gateway.supervisor is not None
            envoy_pid = gateway.supervisor.pid
        if "plain" in args.targets:
            targets["Envoy, plain route"] = {
                "url": f"http://127.0.0.1:{plain_port}",
                "headers": {},
                "cpu": CpuMeter(envoy_pid, False),
            }
        if "inferway" in args.targets:
            # Envoy and this process, where the LLM processor (ext_proc) serves
            targets["inferway LLM gateway"] = {
                "url": f"http://127.0.0.1:{llm_port}",
                "headers": {},
                "cpu": CpuMeter(envoy_pid, False, also=os.getpid()),
            }
        litellm: LiteLLMProxy | None = None
        if "litellm" in args.targets:
            executable = await asyncio.to_thread(ensure_litellm, args.litellm_spec)
            litellm = LiteLLMProxy(
                executable, f"{direct}/v1", args.model, free_port(), workdir, args.litellm_workers
            )
            await litellm.__aenter__()
            assert litellm.process is not None
            targets["litellm proxy"] = {
                "url": litellm.url,
                "headers": {"Authorization": f"Bearer {litellm.key}"},
                "cpu": CpuMeter(litellm.process.pid, True),
            }
        try:
            for target in targets.values():
                target["url"] += "/v1/chat/completions"
                await wait_streams(target["url"], args.model, target["headers"], 60)
            for target in targets.values():  # warm-up: connections, caches
                await asyncio.to_thread(
                    run_load,
                    {"url": target["url"], "model": args.model, "headers": target["headers"],
                     "mode": "closed", "concurrency": args.concurrency, "rate": args.rate,
                     "duration": 1.0, "max_tokens": args.max_tokens, "seed": 99},
                )  # fmt: skip
            engine_cpu = CpuMeter(engine_pid, False)
            quiet = [engine_cpu, *(t["cpu"] for t in targets.values())]
            before = engine_cpu.seconds()
            runs = await measure(args, targets, quiet)
            engine_cpu_s = engine_cpu.seconds() - before
            caps = await capacity(args, targets, quiet) if args.capacity else {}
        finally:
            if litellm is not None:
                await litellm.__aexit__()
        return {
            "runs": runs,
            "capacity": caps,
            "engine_cpu_s": engine_cpu_s,
            "litellm_version": litellm.version if litellm else None,
            "litellm_startup_s": litellm.startup_s if litellm else None,
        }
    finally:
        if llama is not None:
            llama.stop()
        if gateway is not None:
            await gateway.stop()
        if engine_process is not None and engine_conn is not None:
            engine_conn.send("stop")
            engine_process.join(5)
            if engine_process.is_alive():
                engine_process.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def report(args: argparse.Namespace, measured: dict[str, Any]) -> dict[str, Any]:
    summary = {name: summarize(runs) for name, runs in measured["runs"].items()}
    direct = summary.get("direct")
    rows = []
    for name, s in summary.items():
        added = (
            f"{s['ttft_p50_ms'] - direct['ttft_p50_ms']:+.2f} / "
            f"{s['ttft_p99_ms'] - direct['ttft_p99_ms']:+.2f}"
            if direct is not None and name != "direct"
            else ""
        )
        rows.append(
            [
                name,
                f"{s['ttft_p50_ms']:.2f} / {s['ttft_p99_ms']:.2f}",
                added,
                f"{s['itl_p50_ms']:.2f} / {s['itl_p99_ms']:.2f}",
                f"{s['tokens_per_s']:,.0f}",
                f"{s['requests_per_s']:,.1f}",
                f"{s['errors']}/{s['streams']}",
                "" if name == "direct" else f"{s['cpu_ms_per_request']:.3f}",
                "" if name == "direct" else f"{s['cpu_us_per_token']:.1f}",
            ]
        )
    load = (
        f"{args.concurrency} streams closed loop"
        if args.mode == "closed"
        else f"{args.rate:g} req/s open loop (cap {args.concurrency})"
    )
    print_table(
        f"LLM streaming: {load}, {args.max_tokens} tokens/answer, {args.duration:g} s x "
        f"{args.rounds} rounds (medians), engine {args.engine}",
        ["target", "TTFT p50/p99 ms", "added p50/p99", "ITL p50/p99 ms", "tokens/s", "req/s",
         "errors", "CPU ms/req", "CPU us/token"],
        rows,
    )  # fmt: skip
    before, after = measured["load_average"]["before"][0], measured["load_average"]["after"][0]
    print(f"host load average (1 min) {before:.1f} before, {after:.1f} after")
    caps = {name: c["max_rate"] for name, c in measured["capacity"].items()}
    if caps:
        print(f"capacity at TTFT p99 <= {args.slo_ms:g} ms (req/s): {caps}")
        if caps.get("litellm proxy") and caps.get("inferway LLM gateway"):
            ratio = caps["inferway LLM gateway"] / caps["litellm proxy"]
            print(f"inferway / LiteLLM at equal p99: {ratio:.1f}x (target >= 5x)")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="synthetic", help="synthetic, or a running URL")
    parser.add_argument("--model", default="bench", help="the model name requests carry")
    parser.add_argument("--ttft-ms", type=float, default=20.0, help="synthetic: first token")
    parser.add_argument("--token-ms", type=float, default=20.0, help="synthetic: per token")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--mode", choices=["closed", "open"], default="closed")
    parser.add_argument("--concurrency", type=int, default=100, help="streams (open: the cap)")
    parser.add_argument("--rate", type=float, default=50.0, help="open loop: requests/s")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3, help="rotated rounds")
    parser.add_argument(
        "--targets",
        default="direct,plain,inferway,litellm",
        help="direct, plain (Envoy, a plain route), inferway (the openai route), litellm",
    )
    parser.add_argument(
        "--envoy-concurrency", type=int, default=1, help="Envoy workers (1: as LiteLLM's one)"
    )
    parser.add_argument("--litellm-workers", type=int, default=1, help="LiteLLM's workers")
    parser.add_argument("--litellm-spec", default="litellm[proxy]", help="what pip installs")
    parser.add_argument(
        "--capacity",
        type=lambda text: [float(x) for x in text.split(",") if x],
        default=[],
        help="open-loop rates (req/s) for the throughput at equal p99",
    )
    parser.add_argument("--slo-ms", type=float, default=250.0, help="capacity: TTFT p99 bound")
    parser.add_argument("--quick", action="store_true", help="3 s per run, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 3.0, 1
    args.targets = [t.strip() for t in args.targets.split(",")]
    load_before = os.getloadavg()
    measured = asyncio.run(run(args))
    measured["load_average"] = {"before": load_before, "after": os.getloadavg()}
    summary = report(args, measured)
    path = write_results(
        "llm_stream",
        {
            "environment": environment(),
            "command": " ".join([sys.executable, *sys.argv]),
            "arguments": {k: v for k, v in vars(args).items()},
            "inferway_arms": "plain: Envoy with a prefix route; LLM gateway: the openai route "
            "(model routing, the LLM processor counting tokens over ext_proc)",
            "summary": summary,
            **measured,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
