"""The endpoint picker against round robin and least request on a simulated fleet, and the
picker's own cost per pick (issue 35).

The fleet: ``--servers`` model servers (64), each a cache-and-queue model of an LLM engine:
one FIFO prefill engine (``--prefill-tps`` prompt tokens/s; a request's prefill waits for the
ones before it) and decoding in parallel (``--decode-ms`` per output token), with a prefix
cache of ``--cache-tokens`` tokens per server (LRU of whole system prompts): a prompt whose
system prompt is cached prefills only its question. TTFT = prefill wait + prefill.
Throughput = output tokens/s over the run. Arrivals are open-loop Poisson at ``--rate``.

Workloads: ``shared-prefix`` (``--tenants`` tenants, Zipf(1.1), each a 4000-token system
prompt plus a 100-token question, 100 output tokens) and ``no-shared-prefix`` (every prompt
unique, 1000 tokens). Policies: round robin; least request (Envoy's: the fewer in-flight of 2
random choices); inferway's picker (the real core, inferway/gateway/picker/core, weights
queue 2, kv_cache 2, prefix 3, fed vLLM-style metrics every second and its own in-flight
counts; prompt blocks hashed from the prompt text as the server does); and ``picker in Envoy``
(``process: envoy``): the first 1,024 bytes of the body after ``"messages":``/``"prompt":``
hashed, consistent hashing with bounded load by Envoy's slot rule (a replica may hold at most
ceil((in flight + 1) x 1.1 / servers) requests; past it the hash is rehashed to the next
candidate), fed the same scrapes as the picker every second: the replicas the gateway's
saturation gate leaves out (waiting + running at 8, or KV cache at 95%; at most half the pool)
are skipped. Maglev's table is modelled as a uniform hash of the key: the two differ only in
which keys move when replicas come and go. And ``picker scored in Envoy`` (``process: envoy,
pick: score``): the Lua script Envoy runs (on LuaJIT, through lupa: tests/lua_picker.py), one
per Envoy worker (``--envoy-workers``, each request to a random one, as connections spread over
workers), fed the same scrapes (pushed to every worker) and the prompt as the request body.

Overhead: the server's per-request work (JSON parse, block hashing, the pick, the finish) on
64 endpoints with a full prefix index, timed per call; at 500 req/s the CPU share is the mean
times 500.

    .venv/bin/python bench/picker_sim.py            # 64 servers, 300 s of traffic
    .venv/bin/python bench/picker_sim.py --quick    # 60 s
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import random
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # inferway, tests/ from here

from _common import (
    add_choice_list,
    choice_list,
    environment,
    percentile,
    print_table,
    write_results,
)

from inferway.gateway.picker.core.metrics import ServerMetrics
from inferway.gateway.picker.core.picker import Picker, PickerConfig
from inferway.gateway.picker.core.prefix import prompt_text
from inferway.gateway.picker.core.saturation import SaturationGate, SaturationLimits

CHARS_PER_TOKEN = 4
POLICIES = (
    "round robin", "least request", "inferway picker", "picker in Envoy", "picker scored in Envoy"
)  # fmt: skip
PREFIX_BYTES = 1024
LOAD_BOUND = 1.1


@dataclass(frozen=True, slots=True)
class Request:
    at: float
    prefix_id: int | None
    """The tenant whose system prompt leads it (None: nothing shared)."""
    prefix_tokens: int
    question_tokens: int
    output_tokens: int
    text: str


@dataclass
class Server:
    name: str
    cache_tokens: int
    busy_until: float = 0.0
    cache: OrderedDict[int, int] = field(default_factory=OrderedDict)
    cached: int = 0
    prefill_ends: list[float] = field(default_factory=list)
    in_flight: int = 0

    def prefill_tokens(self, request: Request) -> tuple[int, bool]:
        """Tokens to compute, and whether the system prompt was cached (then kept hot)."""
        if request.prefix_id is None:
            return request.prefix_tokens + request.question_tokens, False
        if request.prefix_id in self.cache:
            self.cache.move_to_end(request.prefix_id)
            return request.question_tokens, True
        self.cache[request.prefix_id] = request.prefix_tokens
        self.cached += request.prefix_tokens
        while self.cached > self.cache_tokens and len(self.cache) > 1:
            _, tokens = self.cache.popitem(last=False)
            self.cached -= tokens
        return request.prefix_tokens + request.question_tokens, False


def workload(kind: str, rate: float, duration: float, tenants: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** 1.1 for i in range(tenants)]
    systems = [
        " ".join(f"tenant{t}-rule{i}" for i in range(4000 * CHARS_PER_TOKEN // 14))[
            : 4000 * CHARS_PER_TOKEN
        ]
        for t in range(tenants)
    ] if kind == "shared-prefix" else []  # fmt: skip
    out: list[Request] = []
    now = 0.0
    n = 0
    while True:
        now += rng.expovariate(rate)
        if now > duration:
            return out
        n += 1
        if kind == "shared-prefix":
            tenant = rng.choices(range(tenants), weights)[0]
            question = f"question {n} " * (100 * CHARS_PER_TOKEN // 12)
            body = {"messages": [
                {"role": "system", "content": systems[tenant]},
                {"role": "user", "content": question},
            ]}  # fmt: skip
            out.append(Request(now, tenant, 4000, 100, 100, json.dumps(body)))
        else:
            prompt = f"unique {n} {rng.random()} " * (1000 * CHARS_PER_TOKEN // 24)
            out.append(Request(now, None, 1000, 0, 100, json.dumps({"prompt": prompt})))


Choose = Callable[[Request, float], tuple[int, Any]]


def simulate(
    requests: list[Request], servers: list[Server], choose: Choose,
    finish: Callable[[Any], None], scrape: Callable[[float], None] | None,
    prefill_tps: float, decode_s: float,
) -> dict[str, Any]:  # fmt: skip
    completions: list[tuple[float, int, Any]] = []
    ttfts: list[float] = []
    hits = 0
    next_scrape = 0.0
    last_done = 0.0
    for request in requests:
        now = request.at
        while completions and completions[0][0] <= now:
            _, index, token = heapq.heappop(completions)
            servers[index].in_flight -= 1
            finish(token)
        if scrape is not None and now >= next_scrape:
            scrape(now)
            next_scrape = now + 1.0
        index, token = choose(request, now)
        server = servers[index]
        tokens, hit = server.prefill_tokens(request)
        hits += hit
        start = max(now, server.busy_until)
        server.busy_until = start + tokens / prefill_tps
        server.prefill_ends.append(server.busy_until)
        ttfts.append(server.busy_until - now)
        done = server.busy_until + request.output_tokens * decode_s
        last_done = max(last_done, done)
        server.in_flight += 1
        heapq.heappush(completions, (done, index, token))
    output = sum(r.output_tokens for r in requests)
    return {
        "requests": len(requests),
        "ttft_p50_s": round(percentile(ttfts, 50), 4),
        "ttft_p90_s": round(percentile(ttfts, 90), 4),
        "ttft_p99_s": round(percentile(ttfts, 99), 4),
        "tokens_per_s": round(output / last_done, 1),
        "cache_hit_rate": round(hits / len(requests), 3),
    }


def run_policy(policy: str, requests: list[Request], args: argparse.Namespace) -> dict[str, Any]:
    servers = [
        Server(f"10.0.{i // 256}.{i % 256}:8000", args.cache_tokens) for i in range(args.servers)
    ]
    rng = random.Random(args.seed + 1)
    scrape = None
    if policy == "round robin":
        counter = iter(range(10**12))

        def choose(request: Request, now: float) -> tuple[int, Any]:
            return next(counter) % len(servers), None

        def finish(token: Any) -> None:
            return None
    elif policy == "least request":

        def choose(request: Request, now: float) -> tuple[int, Any]:
            a, b = rng.randrange(len(servers)), rng.randrange(len(servers))
            return (a if servers[a].in_flight <= servers[b].in_flight else b), None

        def finish(token: Any) -> None:
            return None
    elif policy == "picker scored in Envoy":
        choose, finish, scrape = _scored_in_envoy(servers, args, rng)
    elif policy == "picker in Envoy":
        # the gateway's scrape: saturated replicas go to Envoy as DEGRADED, off the table
        gate = SaturationGate(SaturationLimits(hold_s=2.0))
        gate.set_endpoints(s.name for s in servers)
        left_out: set[int] = set()
        index_of = {s.name: i for i, s in enumerate(servers)}

        def choose(request: Request, now: float) -> tuple[int, Any]:
            return hashed_choice(request.text, servers, rng, left_out), None

        def finish(token: Any) -> None:
            return None

        def scrape(now: float) -> None:
            for server in servers:
                gate.observe(server.name, server_metrics(server, now, args.kv_tokens), now)
            left_out.clear()
            left_out.update(index_of[e] for e in gate.decide(now))
    else:
        # the index sized like the servers' caches, as GAIE's lruCapacityPerServer is
        blocks = args.cache_tokens * CHARS_PER_TOKEN // PickerConfig().block_chars
        picker = Picker(PickerConfig(blocks_per_endpoint=blocks), rng=random.Random(args.seed + 2))
        picker.set_endpoints(s.name for s in servers)
        index_of = {s.name: i for i, s in enumerate(servers)}

        def choose(request: Request, now: float) -> tuple[int, Any]:
            text = prompt_text(json.loads(request.text))
            pick = picker.pick(picker.blocks(text))
            return index_of[pick.endpoints[0]], pick.ticket

        def finish(token: Any) -> None:
            picker.finish(token)

        def scrape(now: float) -> None:
            for server in servers:
                picker.observe(server.name, server_metrics(server, now, args.kv_tokens))

    return simulate(
        requests, servers, choose, finish, scrape, args.prefill_tps, args.decode_ms / 1000
    )


def _scored_in_envoy(
    servers: list[Server], args: argparse.Namespace, rng: random.Random
) -> tuple[Choose, Callable[[Any], None], Callable[[float], None]]:
    from inferway.gateway.picker.in_envoy import replica_load
    from inferway.resolve.ir.picker import PickerIR, ReplicaLoadIR
    from tests.lua_picker import LuaPicker

    ir = PickerIR("llm", "127.0.0.1", 1, False, True, 0.5, "x-session-id", in_envoy=True,
                  pick="score", replicas=tuple(ReplicaLoadIR(s.name) for s in servers),
                  load_bound=args.load_bound)  # fmt: skip
    blocks = args.cache_tokens * CHARS_PER_TOKEN // 256  # the index sized like the caches
    sized = {"local BLOCKS_PER_ENDPOINT = 4096": f"local BLOCKS_PER_ENDPOINT = {blocks}"}
    workers = [LuaPicker(ir, replace=sized) for _ in range(args.envoy_workers)]
    index_of = {s.name: i for i, s in enumerate(servers)}

    def choose(request: Request, now: float) -> tuple[int, Any]:
        worker = workers[rng.randrange(len(workers))]
        picked = worker.request(request.text)
        return index_of[picked.destination[0]], (worker, picked)

    def finish(token: Any) -> None:
        worker, picked = token
        worker.finish(picked)

    def scrape(now: float) -> None:
        loads = []
        for server in servers:
            load = replica_load(server_metrics(server, now, args.kv_tokens))
            loads.append(ReplicaLoadIR(server.name, load.depth, load.kv_cache))
        for worker in workers:
            worker.set_replicas(loads)

    return choose, finish, scrape


def server_metrics(server: Server, now: float, kv_tokens: int) -> ServerMetrics:
    """vLLM's gauges, as a ``/metrics`` scrape at ``now`` reads them."""
    server.prefill_ends = [t for t in server.prefill_ends if t > now]
    waiting = len(server.prefill_ends)
    used = min(1.0, server.in_flight * 4200 / kv_tokens)
    return ServerMetrics(
        waiting=float(waiting), running=float(server.in_flight - waiting), kv_cache=used
    )


def prefix_key(body: str) -> bytes | None:
    """What ``process: envoy``'s Lua filter hashes: ``PREFIX_BYTES`` after the prompt's key."""
    data = body.encode()
    for key in (b'"messages": [', b'"prompt":'):
        at = data.find(key)
        if at >= 0:
            start = at + len(key)
            return data[start : start + PREFIX_BYTES]
    return None


def hashed_choice(
    body: str, servers: list[Server], rng: random.Random, left_out: set[int] | None = None
) -> int:
    """Consistent hashing with bounded load (Envoy's ``hash_balance_factor`` rule) over the
    replicas not ``left_out`` (DEGRADED: off Maglev's table; a key whose replica is out goes
    on to the next candidate); no key: at random, as Maglev without a hash."""
    out = left_out or set()
    table = [i for i in range(len(servers)) if i not in out]
    key = prefix_key(body)
    if key is None:
        return rng.choice(table)
    total = sum(servers[i].in_flight for i in table)
    slots = max(1, math.ceil(math.ceil((total + 1) * LOAD_BOUND) / len(table)))
    for attempt in range(len(servers) * 4):
        digest = hashlib.blake2b(key, digest_size=8, salt=attempt.to_bytes(8, "little"))
        index = int.from_bytes(digest.digest(), "little") % len(servers)
        if index not in out and servers[index].in_flight < slots:
            return index
    return min(table, key=lambda i: servers[i].in_flight)


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Per-request picker work at 64 endpoints with a warm index, as the server does it: parse
    the body, hash the prompt, pick, explain (the span's attributes), finish. Wall time per
    call (this machine's other load included) and this thread's CPU time."""
    requests = workload("shared-prefix", 500.0, args.overhead_picks / 500.0, args.tenants, 7)
    picker = Picker(PickerConfig(), rng=random.Random(3))
    picker.set_endpoints(f"10.0.0.{i}:8000" for i in range(args.servers))
    wall: list[float] = []
    cpu: list[float] = []
    open_tickets: list[int | None] = []
    for request in requests:
        began, began_cpu = time.perf_counter_ns(), time.thread_time_ns()
        text = prompt_text(json.loads(request.text))
        pick = picker.pick(picker.blocks(text))
        explained = pick.explain(top=8)
        json.dumps(explained["picker.scores"])
        open_tickets.append(pick.ticket)
        if len(open_tickets) > 200:  # ~200 in flight at 500 req/s and 0.4 s each
            picker.finish(open_tickets.pop(0))
        cpu.append((time.thread_time_ns() - began_cpu) / 1000)
        wall.append((time.perf_counter_ns() - began) / 1000)
    wall, cpu = wall[1000:], cpu[1000:]  # after the index warmed up
    mean = sum(cpu) / len(cpu)
    return {
        "picks": len(wall),
        "wall_p50_us": round(percentile(wall, 50), 1),
        "wall_p99_us": round(percentile(wall, 99), 1),
        "cpu_p50_us": round(percentile(cpu, 50), 1),
        "cpu_p99_us": round(percentile(cpu, 99), 1),
        "cpu_mean_us": round(mean, 1),
        "cpu_share_at_500_rps": round(mean * 500 / 1e6, 4),
        "index_blocks": len(picker.index),
    }


def lua_overhead(args: argparse.Namespace) -> dict[str, Any]:
    """The same for the Lua picker Envoy runs (``pick: score``), on LuaJIT through lupa, with
    a stand-in for Envoy's handle: the body's blocks, the pick, its reason, the finish. An
    upper bound of its share of Envoy's CPU: lupa's calls and the stand-in count here too,
    Envoy's own calls into and out of Lua do not (bench/picker_overhead.py measures those)."""
    from inferway.resolve.ir.picker import PickerIR, ReplicaLoadIR
    from tests.lua_picker import LuaPicker

    requests = workload("shared-prefix", 500.0, args.overhead_picks / 500.0, args.tenants, 7)
    replicas = tuple(ReplicaLoadIR(f"10.0.0.{i}:8000") for i in range(args.servers))
    ir = PickerIR("llm", "127.0.0.1", 1, False, True, 0.5, "x-session-id", in_envoy=True,
                  pick="score", replicas=replicas)  # fmt: skip
    lua = LuaPicker(ir)
    cpu: list[float] = []
    opened: list[Any] = []
    for request in requests:
        began = time.thread_time_ns()
        picked = lua.request(request.text)
        opened.append(picked)
        if len(opened) > 200:
            lua.finish(opened.pop(0))
        cpu.append((time.thread_time_ns() - began) / 1000)
    cpu = cpu[1000:]
    mean = sum(cpu) / len(cpu)
    return {
        "picks": len(cpu),
        "cpu_p50_us": round(percentile(cpu, 50), 1),
        "cpu_p99_us": round(percentile(cpu, 99), 1),
        "cpu_mean_us": round(mean, 1),
        "cpu_share_at_500_rps": round(mean * 500 / 1e6, 4),
        "index_blocks": lua.blocks_held(),
        "lua_memory_kib": round(lua.memory_kib()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=64)
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s, fleet-wide")
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--tenants", type=int, default=150)
    parser.add_argument("--prefill-tps", type=float, default=10000.0)
    parser.add_argument("--decode-ms", type=float, default=20.0)
    parser.add_argument("--cache-tokens", type=int, default=40000)
    parser.add_argument("--kv-tokens", type=int, default=100000)
    parser.add_argument("--overhead-picks", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--envoy-workers", type=int, default=1,
        help="picker scored in Envoy: workers, each its own Lua picker",
    )  # fmt: skip
    parser.add_argument(
        "--load-bound", type=float, default=1.1,
        help="picker scored in Envoy: a new prompt's home has at most this x the least "
        "loaded's depth + 1 (the policy's load_bound; 0: no home, as the picker process)",
    )  # fmt: skip
    add_choice_list(parser, "--policies", POLICIES, "comma-separated policies")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    args.policies = choice_list(parser, "--policies", args.policies, POLICIES)
    if args.quick:
        args.duration, args.overhead_picks = 60.0, 5000
    results: dict[str, Any] = {"environment": environment(), "settings": vars(args)}
    rows = []
    for kind in ("shared-prefix", "no-shared-prefix"):
        requests = workload(kind, args.rate, args.duration, args.tenants, args.seed)
        for policy in args.policies:
            figures = run_policy(policy, requests, args)
            results[f"{kind} / {policy}"] = figures
            rows.append([kind, policy, figures["requests"], figures["ttft_p50_s"],
                         figures["ttft_p90_s"], figures["ttft_p99_s"],
                         figures["tokens_per_s"], figures["cache_hit_rate"]])  # fmt: skip
    print_table(
        f"{args.servers} simulated servers, {args.rate:g} req/s for {args.duration:g} s",
        ["workload", "policy", "requests", "TTFT p50 s", "TTFT p90 s", "TTFT p99 s",
         "tokens/s", "cache hits"],
        rows,
    )  # fmt: skip
    cost = overhead(args)
    results["overhead"] = cost
    print_table(
        f"picker cost per request ({args.servers} endpoints, warm index)",
        ["picks", "wall p50 us", "wall p99 us", "CPU p50 us", "CPU p99 us", "CPU mean us",
         "CPU share at 500 req/s", "blocks"],
        [[cost["picks"], cost["wall_p50_us"], cost["wall_p99_us"], cost["cpu_p50_us"],
          cost["cpu_p99_us"], cost["cpu_mean_us"], cost["cpu_share_at_500_rps"],
          cost["index_blocks"]]],
    )  # fmt: skip
    if "picker scored in Envoy" in args.policies:
        lua = lua_overhead(args)
        results["lua_overhead"] = lua
        print_table(
            f"the Lua picker (pick: score) per request ({args.servers} endpoints, warm index, "
            "through lupa)",
            ["picks", "CPU p50 us", "CPU p99 us", "CPU mean us", "CPU share at 500 req/s",
             "blocks", "Lua memory KiB"],
            [[lua["picks"], lua["cpu_p50_us"], lua["cpu_p99_us"], lua["cpu_mean_us"],
              lua["cpu_share_at_500_rps"], lua["index_blocks"], lua["lua_memory_kib"]]],
        )  # fmt: skip
    print(f"results: {write_results('picker_sim', results)}")


if __name__ == "__main__":
    main()
