"""What decoding one infer request's body costs the fast front end, with and without its
decoding plans (``protocol/decode_plans.py``), in process: ``FastCall.decode`` timed on the
benchmark models' request bodies, the two ways side by side in rotated rounds.

    .venv/bin/python bench/decode_cost.py                 # ~30 s
    .venv/bin/python bench/decode_cost.py --pin 1 -o json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import timeit
from functools import partial
from typing import Any

import numpy as np
from _common import environment, print_table, write_results
from batching_models import TINY_SIZES

from inferway.backends.protocol.decode_plans import DEFAULT_CAPACITY, DecodePlans
from inferway.backends.protocol.fast_wire import FastCall
from inferway.backends.runners.base import TensorSpec
from inferway.devtools.demo_models import HEAVY_SIZES


class _Model:
    """What FastCall.decode reads of a served model."""

    def __init__(self, width: int) -> None:
        self.name, self.version = "bench", "1"
        self.inputs = (TensorSpec("x", "FP32", (-1, width)),)


def _body(width: int, binary: bool) -> tuple[bytes, dict[str, str]]:
    row = np.random.default_rng(width).random((1, width), dtype=np.float32)
    doc: dict[str, Any] = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, width]}]}
    if not binary:
        doc["inputs"][0]["data"] = row.reshape(-1).tolist()
        return json.dumps(doc).encode(), {}
    doc["inputs"][0]["parameters"] = {"binary_data_size": row.nbytes}
    head = json.dumps(doc).encode()
    return head + row.tobytes(), {"inference-header-content-length": str(len(head))}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="the median is reported")
    p.add_argument("--number", type=int, default=20000, help="decodes timed per round")
    p.add_argument("--pin", type=int, default=None, help="run on this CPU alone (Linux)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--out", default=None, help="results file (default bench/results/)")
    args = p.parse_args(argv)
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    cases = [
        ("heavy", "binary", HEAVY_SIZES[0]),
        ("tiny", "binary", TINY_SIZES[0]),
        ("tiny", "json", TINY_SIZES[0]),
    ]
    rows = []
    for model, kind, width in cases:
        body, headers = _body(width, kind == "binary")
        served: Any = _Model(width)  # what decode reads of a ServedModel
        calls = {
            plans: FastCall("bench", None, headers, body, DecodePlans(capacity=cap))
            for plans, cap in (("on", DEFAULT_CAPACITY), ("off", 0))
        }
        timed: dict[str, list[float]] = {"on": [], "off": []}
        for round_ in range(args.rounds):
            order = ("on", "off") if round_ % 2 == 0 else ("off", "on")
            for plans in order:
                call = calls[plans]
                seconds = timeit.timeit(partial(call.decode, served), number=args.number)
                timed[plans].append(seconds / args.number * 1e6)
        row: dict[str, Any] = {
            "model": model,
            "body": kind,
            "bytes": len(body),
            "plans_us": round(statistics.median(timed["on"]), 2),
            "full_us": round(statistics.median(timed["off"]), 2),
            "plans_us_rounds": [round(v, 2) for v in timed["on"]],
            "full_us_rounds": [round(v, 2) for v in timed["off"]],
        }
        rows.append(row)
        print(
            f"  {model} {kind}: plans {row['plans_us']} us, full decode {row['full_us']} us",
            file=sys.stderr,
        )
    results = {"environment": environment(), "pinned_cpu": args.pin, "rows": rows}
    path = write_results("decode_cost", results, args.out)
    if args.output == "json":
        print(json.dumps(results, indent=2))
    else:
        print_table(
            f"FastCall.decode, us a request (medians of {args.rounds} rotated rounds)",
            ["model", "body", "bytes", "with plans", "full decode", "saved"],
            [
                [
                    r["model"],
                    r["body"],
                    r["bytes"],
                    r["plans_us"],
                    r["full_us"],
                    f"{r['full_us'] - r['plans_us']:.2f}",
                ]
                for r in rows
            ],
        )
        print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
