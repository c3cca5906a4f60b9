"""The fast HTTP front end's CPU per request, in process and without sockets.

Requests are fed to the front end's own protocol objects
(``fast_http_connection.FastHttpConnection``) through an in-memory transport, closed loop (each
connection sends its next request when its answer is written), over a real ``start_backend``
with adaptive batching and ONNX Runtime on the CPU.
No kernel networking and no load generator share the measurement, so the figure is steadier
than a socket benchmark's: use it to compare changes to the per-request path. It prints the
process CPU per request, the part of it ONNX Runtime's batches took (``compute_seconds``), and
the rest: the front end (parse, decode, queue, settle, encode, write). With ``--connections
new`` every request comes on a connection of its own (``Connection: close``): the protocol
object's set-up and tear-down join the figure, the kernel's accept and close do not (a socket
benchmark's difference between the two, ``peers_profile.py --pin-cores``, has both).

    .venv/bin/python bench/frontend_cost.py                       # tiny JSON and binary, c=64
    .venv/bin/python bench/frontend_cost.py --modes adaptive,adaptive-nofill --pin 1 -o json
    .venv/bin/python bench/frontend_cost.py --bodies binary --plans on,off --pin 1  # an A/B
    .venv/bin/python bench/frontend_cost.py --bodies json --connections keepalive,new --pin 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from _common import environment, print_table, write_results
from batching_models import NOFILL, TINY_SIZES, build_bench_repository, served_name
from loadgen_spec import request_row

from inferway.backends.app import start_backend
from inferway.backends.process_tuning import freeze_startup_heap, tune_for_serving
from inferway.backends.protocol import fast_http_connection
from inferway.backends.protocol.decode_plans import DEFAULT_CAPACITY, DecodePlans
from inferway.backends.serving.settings import ServingSettings

BODIES = ("json", "binary")
CONNECTIONS = ("keepalive", "new")
Case = tuple[str, str, str, str]
"""(mode, body, decode plans, connections)"""


def request_bytes(model: str, width: int, body: str, *, close: bool = False) -> bytes:
    """One whole HTTP/1.1 infer request for ``model``, as the peers' clients send it
    (``close``: asking for ``Connection: close``, as ``urllib`` does)."""
    row = request_row(width, 0)
    if body == "json":
        doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, width]}]}
        doc["inputs"][0]["data"] = row.reshape(-1).tolist()
        payload, extra = json.dumps(doc).encode(), b"Content-Type: application/json\r\n"
    else:
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1, width],
                        "parameters": {"binary_data_size": row.nbytes},
                    }
                ],
                "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
            }
        ).encode()
        payload = head + row.tobytes()
        extra = (
            b"Content-Type: application/octet-stream\r\n"
            b"Inference-Header-Content-Length: " + str(len(head)).encode() + b"\r\n"
        )
    if close:
        extra += b"Connection: close\r\n"
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: bench\r\n".encode()
        + extra
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )


class _Transport:
    """What the protocol writes to: counts answers and asks for the next request."""

    def __init__(self, on_answer: Any) -> None:
        self._on_answer = on_answer
        self.closing = False

    def write(self, data: bytes) -> None:
        if not data.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected answer: {data[:200]!r}")
        self._on_answer()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def measure(
    fast: Any,
    request: bytes,
    *,
    requests: int,
    concurrency: int,
    warmup: int,
    new_connections: bool = False,
) -> dict[str, float]:
    """Drive ``requests`` (after ``warmup``) closed loop over ``concurrency`` connections
    (``new_connections``: each request on a connection of its own, opened when the previous
    one's answer was written and the protocol closed it)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    state = {"answered": 0, "sent": 0}
    total = warmup + requests
    marks: dict[str, float] = {}

    live: dict[Any, _Transport] = {}

    def open_connection() -> Any:
        conn = fast_http_connection.FastHttpConnection(fast)
        transport = _Transport(lambda: answered(conn))
        conn.connection_made(cast(asyncio.BaseTransport, transport))  # in memory: no socket
        live[conn] = transport
        return conn

    def send(conn: Any) -> None:
        state["sent"] += 1
        conn.data_received(request)

    def send_next(conn: Any) -> None:
        if new_connections:
            if not live.pop(conn).closing:
                raise RuntimeError("the front end kept a Connection: close connection open")
            conn.connection_lost(None)  # as the loop reports the closed transport
            conn = open_connection()
        send(conn)

    def answered(conn: Any) -> None:
        state["answered"] += 1
        if state["answered"] == warmup:
            marks["cpu"], marks["wall"] = time.process_time(), time.perf_counter()
        if state["answered"] >= total:
            if not done.done():
                done.set_result(None)
        elif state["sent"] < total:
            loop.call_soon(send_next, conn)  # as the next request's bytes would arrive

    for conn in [open_connection() for _ in range(concurrency)]:
        send(conn)
    await done
    cpu, wall = time.process_time() - marks["cpu"], time.perf_counter() - marks["wall"]
    for conn in list(live):
        conn.connection_lost(None)
    return {"cpu_s": cpu, "wall_s": wall}


def _compute_seconds(handle: Any) -> tuple[float, float]:
    """(sum of batch compute seconds, batches) over every model, from the registry."""
    total = count = 0.0
    for metric in handle.metrics.registry.collect():
        if metric.name == "inferway_backend_compute_seconds":
            for s in metric.samples:
                if s.name.endswith("_sum"):
                    total += s.value
                elif s.name.endswith("_count"):
                    count += s.value
    return total, count


async def run(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    settings = ServingSettings(http_frontend="fast")
    handle = await start_backend(str(root), watch=False, settings=settings)
    freeze_startup_heap()
    fast = handle._fast
    if fast is None:
        raise SystemExit("the fast front end is not running")
    rows = []
    try:
        cases = args.cases
        per: dict[Case, list[float]] = {c: [] for c in cases}
        compute: dict[Case, list[float]] = {c: [] for c in cases}
        batch: dict[Case, list[float]] = {c: [] for c in cases}
        for round_ in range(args.rounds):  # every case once a round, the order rotated
            for case in cases[round_ % len(cases) :] + cases[: round_ % len(cases)]:
                mode, body, plans, connections = case
                new = connections == "new"
                fast.plans = DecodePlans(capacity=DEFAULT_CAPACITY if plans == "on" else 0)
                request = request_bytes(served_name("tiny", mode), TINY_SIZES[0], body, close=new)
                c0, n0 = _compute_seconds(handle)
                got = await measure(
                    fast,
                    request,
                    requests=args.requests,
                    concurrency=args.concurrency,
                    warmup=args.warmup,
                    new_connections=new,
                )
                c1, n1 = _compute_seconds(handle)
                per[case].append(got["cpu_s"] / args.requests * 1e6)
                # the warm-up's batches are in the difference too: scale to the measured part
                share = args.requests / (args.requests + args.warmup)
                compute[case].append((c1 - c0) * share / args.requests * 1e6)
                batch[case].append((args.requests + args.warmup) / max(n1 - n0, 1))
                print(
                    f"  {mode} {body:6} plans {plans:3} {connections:9} c={args.concurrency}: "
                    f"{per[case][-1]:6.1f} us CPU a request ({compute[case][-1]:.1f} in ONNX "
                    f"Runtime), {batch[case][-1]:.1f}-request batches",
                    file=sys.stderr,
                    flush=True,
                )
        for case in cases:
            mode, body, plans, connections = case
            cpu = statistics.median(per[case])
            ort = statistics.median(compute[case])
            rows.append(
                {
                    "mode": mode,
                    "body": body,
                    "decode_plans": plans,
                    "connections": connections,
                    "concurrency": args.concurrency,
                    "requests": args.requests,
                    "rounds": args.rounds,
                    "cpu_us_per_request": round(cpu, 1),
                    "cpu_us_rounds": [round(v, 1) for v in per[case]],
                    "ort_us_per_request": round(ort, 1),
                    "frontend_us_per_request": round(cpu - ort, 1),
                    "mean_batch": round(statistics.median(batch[case]), 1),
                }
            )
    finally:
        await handle.stop(grace=1.0)
    return rows


def _cases(args: argparse.Namespace) -> list[Case]:
    """Every (mode, body, plans, connections) asked for; a value not known is refused here,
    before the backend starts."""
    cases = [
        (mode, body, plans, connections)
        for mode in args.modes.split(",")
        if mode
        for body in args.bodies.split(",")
        if body
        for plans in args.plans.split(",")
        if plans
        for connections in args.connections.split(",")
        if connections
    ]
    for mode, body, plans, connections in cases:
        if body not in BODIES:
            raise SystemExit(f"--bodies: {body!r} is not one of {', '.join(BODIES)}")
        if mode not in ("adaptive", NOFILL):
            raise SystemExit(f"--modes: {mode!r} is not adaptive or {NOFILL}")
        if plans not in ("on", "off"):
            raise SystemExit(f"--plans: {plans!r} is not on or off")
        if connections not in CONNECTIONS:
            raise SystemExit(f"--connections: {connections!r} is not keepalive or new")
    if not cases:
        raise SystemExit("--modes, --bodies, --plans and --connections: nothing to measure")
    return cases


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bodies", default=",".join(BODIES), help="json, binary or both")
    p.add_argument("--modes", default="adaptive", help=f"adaptive and/or {NOFILL} (an A/B)")
    p.add_argument(
        "--plans", default="on", help="on and/or off: the front end's decoding plans (an A/B)"
    )
    p.add_argument(
        "--connections",
        default="keepalive",
        help="keepalive and/or new: a connection per request (Connection: close; an A/B)",
    )
    p.add_argument("--requests", type=int, default=20000, help="measured per round")
    p.add_argument("--warmup", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3, help="the median is reported")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--pin", type=int, default=None, help="run on this CPU alone (Linux)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--out", default=None, help="results file (default bench/results/)")
    args = p.parse_args(argv)
    if args.requests < 1 or args.rounds < 1 or args.concurrency < 1 or args.warmup < 0:
        raise SystemExit("--requests, --rounds and --concurrency must be >= 1, --warmup >= 0")
    args.cases = _cases(args)
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    tune_for_serving()
    import uvloop

    with tempfile.TemporaryDirectory(prefix="inferway-frontend-") as tmp:
        root = Path(tmp)
        build_bench_repository(root, {"tiny": TINY_SIZES})
        rows = uvloop.run(run(args, root))
    results = {"environment": environment(), "pinned_cpu": args.pin, "rows": rows}
    path = write_results("frontend_cost", results, Path(args.out) if args.out else None)
    if args.output == "json":
        print(json.dumps(results, indent=2))
    else:
        print_table(
            "fast front end, in process: CPU per request (medians)",
            [
                "mode",
                "body",
                "decode plans",
                "connections",
                "c",
                "CPU us",
                "ONNX Runtime us",
                "front end us",
                "mean batch",
            ],
            [
                [
                    r["mode"],
                    r["body"],
                    r["decode_plans"],
                    r["connections"],
                    r["concurrency"],
                    r["cpu_us_per_request"],
                    r["ort_us_per_request"],
                    r["frontend_us_per_request"],
                    r["mean_batch"],
                ]
                for r in rows
            ],
        )
        print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
