"""What the way Envoy asks the picker costs (issue 35: "< 1 ms p99 per request at 500 req/s"):
one static Envoy (1 worker) in front of 4 fast upstreams, balanced by ``override_host`` as
inferway configures it, open-loop Poisson load with 20 tenants' 4000-character prompts, and per
target a fresh Envoy and picker process, rounds rotated, medians:

* ``none``: no picker (the service's round robin);
* ``ext_proc``: inferway's picker process (``python -m inferway.gateway.picker``, the sidecar)
  asked over Envoy's ext_proc gRPC stream as inferway configures it (request headers SEND, body
  BUFFERED: two messages each way per request);
* ``http_lane``: ``picker: {transport: http}`` as inferway configures it: the same picker
  process serving Envoy's ``ext_authz`` HTTP service (one HTTP/1.1 request per pick, the body
  with it) and ending each pick from Envoy's gRPC access log (batched every 10 ms);
* ``envoy_hash``: ``picker: {process: envoy}`` as inferway configures it: no picker process,
  Envoy's Lua filter hashes the prompt's first 1,024 bytes and Maglev with bounded load picks;
* ``http_floor``: ``http_lane``'s ext_authz asking bench/static_http_server.py (uvloop and
  httptools, a fixed 200 at once: no pick, no access log) instead of the picker: the hop's
  own cost, what no Python picker behind it can go under.

Columns: latency p50/p99 (from the scheduled send), added p50/p99 against ``none`` in the same
round; the hold, as Envoy's own clock saw it per request (its first byte in to its first byte
sent upstream: the pick's round trip is inside it), at p50/p99 and its p99 against ``none``;
Envoy's whole time per request (first byte in to last byte out) at p99 against ``none``; the
picker process's and Envoy's CPU per request (``/proc``), whether Envoy's per-host
request counts equal the picker's picks (``override_host`` honoured), and for ``http_lane``
whether every pick was ended by the access log (nothing left in flight after the run).

Why this exists: bench/picker_overhead.py shows the picker's CPU per request, mostly grpc.aio's
per-message work, is what its added p99 is made of on a shared 2-core machine. ext_proc with
request headers SKIP would halve the messages but Envoy then lets the headers (and the router's
host choice) through before the body's answer, so the pick would be ignored: the header must
come back before the router runs, which ext_authz's HTTP service does in one request.

    .venv/bin/python bench/picker_transport.py               # 3 rounds x 6 s per target
    .venv/bin/python bench/picker_transport.py --quick       # 2 rounds x 3 s
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil
from _common import environment, free_port, percentile, print_table, write_results
from _picker_procs import backends_main, chat_payloads, load_main
from google.protobuf.json_format import MessageToDict

from inferway.gateway.picker.sidecar import STATUS_REQUEST, pools_line
from inferway.policies.picker import Picker as PickerPolicy
from inferway.resolve.ir.picker import PickerIR
from inferway.xds.envoy_binary import find_envoy
from inferway.xds.translate.picker import (
    ACCESS_LOG_FLUSH_S,
    HTTP_MAX_BODY_BYTES,
    HTTP_PATH_PREFIX,
    TICKET_HEADER,
)
from inferway.xds.translate.picker_envoy import prefix_hash_lb, prefix_hash_script

__all__ = ["main"]

TARGETS = ("none", "ext_proc", "http_lane", "envoy_hash", "http_floor")
PREFIX_BYTES = 1024
T = "type.googleapis.com/envoy."
HEADER = "x-gateway-destination-endpoint"


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _cluster(name: str, ports: list[int], **extra: Any) -> dict[str, Any]:
    hosts = [{"endpoint": {"address": _address(p)}} for p in ports]
    return {"name": name, "connect_timeout": "1s", "type": "STATIC",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": hosts}]},
            **extra}  # fmt: skip


def _finish_log() -> list[dict[str, Any]]:
    """``transport: http``: the gRPC access log that ends each pick, as the translator sets it."""
    config = {
        "@type": T + "extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
        "common_config": {
            "log_name": "inferway.picker.llm",
            "grpc_service": {"envoy_grpc": {"cluster_name": "picker_grpc"}},
            "transport_api_version": "V3",
            "buffer_flush_interval": f"{ACCESS_LOG_FLUSH_S}s",
        },
        "additional_request_headers_to_log": [TICKET_HEADER],
    }
    present = {"header": {"name": TICKET_HEADER, "present_match": True}}
    return [{"name": "envoy.access_loggers.http_grpc", "filter": {"header_filter": present},
             "typed_config": config}]  # fmt: skip


def _picker_filter(target: str, picker: int) -> list[dict[str, Any]]:
    config: dict[str, Any]
    if target == "ext_proc":  # as inferway's translator configures it (xds/translate/picker.py)
        mode = {"request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                "request_trailer_mode": "SKIP", "response_header_mode": "SKIP",
                "response_body_mode": "NONE", "response_trailer_mode": "SKIP"}  # fmt: skip
        config = {
            "@type": T + "extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {
                "envoy_grpc": {"cluster_name": "picker"},
                "initial_metadata": [{"key": "x-inferway-picker-service", "value": "llm"}],
            },
            "message_timeout": "2s",
            "processing_mode": mode,
            "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]}},
        }
    elif target in ("http_lane", "http_floor"):  # as the translator configures transport: http
        config = {
            "@type": T + "extensions.filters.http.ext_authz.v3.ExtAuthz",
            "transport_api_version": "V3",
            "failure_mode_allow": True,
            "with_request_body": {"max_request_bytes": HTTP_MAX_BODY_BYTES,
                                  "allow_partial_message": True},
            "allowed_headers": {"patterns": [{"exact": "x-session-id"}]},
            "http_service": {
                "server_uri": {"uri": f"http://127.0.0.1:{picker}", "cluster": "picker",
                               "timeout": "2s"},
                "path_prefix": HTTP_PATH_PREFIX + "llm",
                "authorization_response": {
                    "allowed_upstream_headers": {
                        "patterns": [{"exact": HEADER}, {"exact": TICKET_HEADER}]
                    }
                },
            },
        }  # fmt: skip
    elif target == "envoy_hash":  # as the translator configures process: envoy
        config = {
            "@type": T + "extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": prefix_hash_script(PREFIX_BYTES)},
        }
    else:
        return []
    return [{"name": "picker", "typed_config": config}]


def _policy(name: str, config: str) -> dict[str, Any]:
    extension = {
        "name": f"envoy.load_balancing_policies.{name}",
        "typed_config": {"@type": T + config},
    }
    return {"policies": [{"typed_extension_config": extension}]}


HOLD_FORMAT = (
    "%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)% %COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%\n"
)


def _timing_log(path: Path) -> dict[str, Any]:
    """A file access log of two durations a request, as Envoy's own clock saw them: its hold
    (the request's first byte in to its first byte sent upstream: for a picker target, the
    pick's round trip is in it) and its whole time in Envoy (first byte in to last byte out)."""
    config = {
        "@type": T + "extensions.access_loggers.file.v3.FileAccessLog",
        "path": str(path),
        "log_format": {"text_format_source": {"inline_string": HOLD_FORMAT}},
    }
    return {"name": "envoy.access_loggers.file", "typed_config": config}


def _timings(path: Path, count: int) -> tuple[list[float], list[float]]:
    """The last ``count`` requests' hold and time in Envoy (seconds) from ``_timing_log``."""
    holds: list[float] = []
    totals: list[float] = []
    for line in path.read_text().splitlines()[-count:]:
        hold, _, total = line.partition(" ")
        if hold.isdigit() and total.isdigit():
            holds.append(int(hold) / 1e6)
            totals.append(int(total) / 1e6)
    return holds, totals


def bootstrap(
    target: str,
    listener: int,
    admin: int,
    picker: int,
    upstreams: list[int],
    grpc_port: int,
    timing_log: Path | None = None,
) -> str:
    """Envoy's bootstrap (JSON) for ``target``: the listener, the filter that asks the picker
    (none for ``none``; for ``http_lane`` also the access log to ``grpc_port``) and the
    service's cluster balanced by ``override_host``; with ``timing_log``, the per-request
    timings there (``_timing_log``)."""
    router = {
        "name": "router",
        "typed_config": {"@type": T + "extensions.filters.http.router.v3.Router"},
    }
    manager = {
        "@type": T + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "ingress",
        "route_config": {"virtual_hosts": [{
            "name": "all", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "llm"}}],
        }]},
        "http_filters": [*_picker_filter(target, picker), router],
    }  # fmt: skip
    manager["access_log"] = [
        *(_finish_log() if target == "http_lane" else []),
        *([_timing_log(timing_log)] if timing_log is not None else []),
    ]
    override = _policy(
        "override_host", "extensions.load_balancing_policies.override_host.v3.OverrideHost"
    )
    override["policies"][0]["typed_extension_config"]["typed_config"] |= {
        "override_host_sources": [
            {"header": HEADER},
            {"metadata": {"key": "envoy.lb", "path": [{"key": HEADER}]}},
        ],
        "fallback_policy": _policy(
            "round_robin", "extensions.load_balancing_policies.round_robin.v3.RoundRobin"
        ),
    }
    h2 = {"typed_extension_protocol_options": {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": T + "extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }}}  # fmt: skip
    grpc = [_cluster("picker_grpc", [grpc_port], **h2)] if target == "http_lane" else []
    lb = {"load_balancing_policy": override}
    if target == "envoy_hash":
        hashing = PickerIR("llm", "", 0, False, True, 1.0, "", in_envoy=True,
                           prefix_bytes=PREFIX_BYTES)  # fmt: skip
        lb = {"load_balancing_policy": MessageToDict(prefix_hash_lb(hashing))}
    document = {
        "admin": {"address": _address(admin)},
        "static_resources": {
            "listeners": [{
                "name": "ingress", "address": _address(listener),
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": manager,
                }]}],
            }],
            "clusters": [
                _cluster("llm", upstreams, **lb),
                _cluster("picker", [picker], **(h2 if target == "ext_proc" else {})),
                *grpc,
            ],
        },
    }  # fmt: skip
    return json.dumps(document)


def _start(target: Any, *args: Any) -> tuple[mp.process.BaseProcess, Connection]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(*args, child), daemon=True)
    process.start()
    child.close()
    return process, parent


def _picker(
    target: str, port: int, grpc_port: int, endpoints: list[str], profile: Path | None = None
) -> subprocess.Popen[str] | None:
    """The picker process for ``target`` (the sidecar of ``process: sidecar``), serving
    ``port`` (for ``http_lane`` the HTTP lane there and gRPC on ``grpc_port``); None for
    ``none`` and ``envoy_hash`` (no picker process)."""
    if target in ("none", "envoy_hash"):
        return None
    listen = port if target == "ext_proc" else grpc_port
    command = [sys.executable, "-m", "inferway.gateway.picker", "127.0.0.1", str(listen)]
    if profile is not None:  # cProfile of the whole process, written when it exits
        command[1:1] = ["-m", "cProfile", "-o", str(profile)]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    settings = {"listen": f"127.0.0.1:{listen}", "metrics_path": None}
    if target == "http_lane":
        settings |= {"transport": "http", "http_listen": f"127.0.0.1:{port}"}
    policy = PickerPolicy.model_validate(settings)
    process.stdin.write(pools_line({"llm": (policy, endpoints)}).decode())
    process.stdin.flush()
    if process.stdout.readline().strip() != "applied":
        process.kill()
        raise RuntimeError(f"picker transport bench: the {target} picker did not start")
    return process


def _floor(port: int) -> subprocess.Popen[str]:
    """``http_floor``: bench/static_http_server.py on ``port`` (a fixed 200 at once, no pick,
    no access log): what the ext_authz hop costs with a picker that does nothing."""
    script = Path(__file__).with_name("static_http_server.py")
    process = subprocess.Popen([sys.executable, str(script), str(port)], text=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("picker transport bench: the floor server did not listen within 10 s")


def _picker_stats(process: subprocess.Popen[str]) -> dict[str, dict[str, float]]:
    """The picker process's per-endpoint stats (picks, in flight), asked over its stdin."""
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(STATUS_REQUEST.decode())
    process.stdin.flush()
    line = process.stdout.readline()
    if not line.startswith("status "):
        raise RuntimeError(f"picker transport bench: a bad status answer {line[:80]!r}")
    return dict(json.loads(line[len("status ") :])["llm"]["endpoints"])


def _wait_ready(admin: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("picker transport bench: Envoy not ready within 30 s")


def measure(
    args: argparse.Namespace, target: str, load: Connection, upstreams: list[int], seed: int
) -> dict[str, Any]:
    listener, admin, port, grpc_port = free_port(), free_port(), free_port(), free_port()
    endpoints = [f"127.0.0.1:{u}" for u in upstreams]
    workdir = Path(tempfile.mkdtemp(prefix="picker-transport-"))
    (workdir / "envoy.json").write_text(
        bootstrap(target, listener, admin, port, upstreams, grpc_port, workdir / "timing.log")
    )
    profile = None
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        profile = args.profile / f"{target}-round{seed}.prof"
    picker = (
        _picker(target, port, grpc_port, endpoints, profile) if target != "http_floor" else None
    )
    floor = _floor(port) if target == "http_floor" else None
    envoy = subprocess.Popen(
        [find_envoy(), "-c", str(workdir / "envoy.json"), "--concurrency", "1", "-l", "warning",
         "--base-id", str(port)],
        stdout=(workdir / "envoy.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    result: dict[str, Any] | None = None
    holds: list[float] = []
    in_envoy: list[float] = []
    try:
        _wait_ready(admin)
        pids = {"envoy": envoy.pid} | ({"picker": picker.pid} if picker is not None else {})
        pids |= {"picker": floor.pid} if floor is not None else {}
        before = {k: sum(psutil.Process(p).cpu_times()[:2]) for k, p in pids.items()}
        payloads = chat_payloads(listener, "/v1/chat/completions", args.tenants, args.prefix_chars)
        load.send((payloads, listener, args.rate, args.duration, args.warmup, seed))
        result = load.recv()
        spent = {k: sum(psutil.Process(p).cpu_times()[:2]) - before[k] for k, p in pids.items()}
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/clusters", timeout=5) as answer:
            clusters = answer.read().decode()
        picks: dict[str, int] | None = None
        in_flight: float | None = None
        if picker is not None:
            time.sleep(4 * ACCESS_LOG_FLUSH_S)  # the access log's last batch
            stats = _picker_stats(picker)
            picks = {e: int(s["picks"] or 0) for e, s in stats.items()}
            in_flight = sum(s["in_flight"] or 0 for s in stats.values())
    finally:
        if picker is not None:
            picker.communicate(timeout=15)  # stdin closes: the picker exits
        if floor is not None:
            floor.terminate()
            floor.wait(15)
        envoy.send_signal(signal.SIGTERM)
        envoy.wait(15)
        if result is not None:
            holds, in_envoy = _timings(workdir / "timing.log", result["sent"])
        shutil.rmtree(workdir, ignore_errors=True)
    assert result is not None
    hosts = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^llm::(\S+)::rq_total::(\d+)", clusters, re.MULTILINE)
    }
    requests = result["sent"] * (args.duration + args.warmup) / args.duration
    latencies = result["latencies_s"]
    return {
        "target": target,
        "sent": result["sent"],
        "errors": len(result["errors"]),
        "statuses": result["statuses"],
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "hold_p50_ms": percentile(holds, 50) * 1000,
        "hold_p99_ms": percentile(holds, 99) * 1000,
        "envoy_p50_ms": percentile(in_envoy, 50) * 1000,
        "envoy_p99_ms": percentile(in_envoy, 99) * 1000,
        "cpu_us": {k: v / requests * 1e6 for k, v in spent.items()},
        "override_honoured": None if picks is None else hosts == {h: picks[h] for h in hosts},
        "left_in_flight": in_flight,
        "send_lag_p99_ms": result["send_lag_p99_ms"],
    }


def summarize(
    rounds: list[dict[str, Any]], count: int, targets: tuple[str, ...] = TARGETS
) -> dict[str, dict[str, Any]]:
    by = {(r["round"], r["target"]): r for r in rounds}
    summary: dict[str, dict[str, Any]] = {}
    for target in targets:
        mine = [by[(i, target)] for i in range(count)]
        base = [by[(i, "none")] for i in range(count)]
        pairs = list(zip(mine, base, strict=True))
        summary[target] = {
            "p50_ms": statistics.median(r["p50_ms"] for r in mine),
            "p99_ms": statistics.median(r["p99_ms"] for r in mine),
            "added_p50_ms": statistics.median(m["p50_ms"] - b["p50_ms"] for m, b in pairs),
            "added_p99_ms": statistics.median(m["p99_ms"] - b["p99_ms"] for m, b in pairs),
            "hold_p50_ms": statistics.median(r["hold_p50_ms"] for r in mine),
            "hold_p99_ms": statistics.median(r["hold_p99_ms"] for r in mine),
            "added_hold_p99_ms": statistics.median(
                m["hold_p99_ms"] - b["hold_p99_ms"] for m, b in pairs
            ),
            "added_envoy_p99_ms": statistics.median(
                m["envoy_p99_ms"] - b["envoy_p99_ms"] for m, b in pairs
            ),
            "picker_cpu_us": statistics.median(r["cpu_us"].get("picker", 0.0) for r in mine),
            "envoy_cpu_us": statistics.median(r["cpu_us"]["envoy"] for r in mine),
            "override_honoured": [r["override_honoured"] for r in mine],
            "left_in_flight": [r["left_in_flight"] for r in mine],
            "errors": sum(r["errors"] for r in mine),
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--upstreams", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--prefix-chars", type=int, default=4000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 s")
    parser.add_argument(
        "--targets", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}"
    )
    parser.add_argument(
        "--profile", type=Path, help="write cProfile of each picker process here (slows it)"
    )
    args = parser.parse_args(argv)
    targets = tuple(t for t in args.targets.split(",") if t)
    if "none" not in targets:
        parser.error("--targets: 'none' is the baseline every other target is compared with")
    if unknown := sorted(set(targets) - set(TARGETS)):
        parser.error(f"--targets: unknown {', '.join(unknown)} (known: {', '.join(TARGETS)})")
    if args.quick:
        args.rounds, args.duration = 2, 3.0
    backends, backend_conn = _start(backends_main, args.upstreams)
    load, load_conn = _start(load_main)
    rounds: list[dict[str, Any]] = []
    try:
        upstreams = backend_conn.recv()
        for r in range(args.rounds):
            for target in targets[r % len(targets) :] + targets[: r % len(targets)]:
                rounds.append(measure(args, target, load_conn, upstreams, r) | {"round": r})
    finally:
        load_conn.send(None)
        backend_conn.send("stop")
        load.join(10)
        backends.join(10)
    summary = summarize(rounds, args.rounds, targets)
    print_table(
        f"Asking the picker at {args.rate:.0f} req/s open loop through Envoy "
        f"(medians of {args.rounds} rounds x {args.duration:.0f} s)",
        ["target", "p50 ms", "p99 ms", "added p50", "added p99", "hold p50/p99 ms",
         "added hold p99", "added in Envoy p99", "picker CPU us/req",
         "envoy CPU us/req", "override honoured", "left in flight", "errors"],
        [[t, f"{s['p50_ms']:.2f}", f"{s['p99_ms']:.2f}", f"{s['added_p50_ms']:+.2f}",
          f"{s['added_p99_ms']:+.2f}", f"{s['hold_p50_ms']:.2f}/{s['hold_p99_ms']:.2f}",
          f"{s['added_hold_p99_ms']:+.2f}", f"{s['added_envoy_p99_ms']:+.2f}",
          f"{s['picker_cpu_us']:.0f}", f"{s['envoy_cpu_us']:.0f}",
          "-" if None in s["override_honoured"] else all(s["override_honoured"]),
          "-" if None in s["left_in_flight"] else max(s["left_in_flight"]), s["errors"]]
         for t, s in summary.items()],
    )  # fmt: skip
    path = write_results(
        "picker_transport",
        {"environment": environment(), "args": vars(args), "summary": summary,
         "rounds": rounds, "target_p99_added_ms": 1.0},
    )  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
