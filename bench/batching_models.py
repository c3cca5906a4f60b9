"""The benchmark's two models and their batching modes: sizes, SLOs, the ``config.yaml`` of
each (model, mode), the generated model repository, and the check that the server answers
like the numpy reference. Kept apart so ``batching.py`` is only the run's orchestration."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from loadgen_spec import request_row
from pydantic import ValidationError

from inferway.backends.batching import BatchingConfig
from inferway.devtools.demo_models import build_mlp, mlp_reference

__all__ = [
    "CLOSED_CLIENTS",
    "HEAVY_MAX_BATCH",
    "LOOP",
    "MODES",
    "NOFILL",
    "PLAIN",
    "SLO_S",
    "TINY_SIZES",
    "WORKER",
    "WORKERS_MODE",
    "batching_settings",
    "build_bench_repository",
    "check_answers",
    "heavy_max_batch_arg",
    "served_name",
]

MODES = ("off", "fixed", "adaptive")
WORKERS_MODE = "adaptive-w{n}"
"""``--workers N``: adaptive served by ``inferway serve --workers N`` (N processes, one port)."""


def served_name(model: str, mode: str) -> str:
    """The repository model a mode is measured on (the workers mode serves adaptive's)."""
    return f"{model}-adaptive" if mode.startswith("adaptive-w") else f"{model}-{mode}"


NOFILL = "adaptive-nofill"
"""The repository's adaptive model with ``fill_when_busy: false`` (an A/B beside adaptive)."""
WORKER = "adaptive-worker"
"""The repository's adaptive model with ``compute_thread: worker``: every batch on the worker
thread, as before ``auto`` moved a CPU model's batches onto the loop's thread on one CPU (an
A/B beside adaptive)."""
LOOP = "adaptive-loop"
"""The repository's adaptive model with ``compute_thread: loop``: every batch on the event
loop's thread, however many CPUs (an A/B beside adaptive)."""
PLAIN = "plain-aiohttp"
"""The issue's yardstick: tiny behind a bare aiohttp handler, ORT inline (tiny, HTTP JSON)."""
TINY_SIZES = (256, 1024, 1024, 10)
SLO_S = {"heavy": 0.100, "tiny": 0.020}
"""p99 latency a rate must meet to count as sustained (tiny also reports 50 ms)."""
HEAVY_MAX_BATCH = 64
"""heavy ``adaptive``'s ``max_batch_size`` unless the run names another (``--heavy-max-batch``)."""


def heavy_max_batch_arg(text: str) -> int:
    """``--heavy-max-batch``: an int the model config accepts as ``max_batch_size``."""
    try:
        size = int(text)
        BatchingConfig(max_batch_size=size)
    except (ValueError, ValidationError) as exc:
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else "not an int"
        raise argparse.ArgumentTypeError(f"{text!r}: {reason}") from None
    return size


CLOSED_CLIENTS = {"heavy": 128, "tiny": 16}
"""heavy: enough clients that a max-size batch (64) can form while another one computes."""


def batching_settings(
    model: str, mode: str, *, heavy_max_batch: int = HEAVY_MAX_BATCH
) -> dict[str, Any]:
    """The ``config.yaml`` of one benchmark model: CPU provider, one instance. ``NOFILL`` is
    adaptive without its rule for a busy event loop (``fill_when_busy``), ``WORKER`` and
    ``LOOP`` adaptive with every batch on the worker or the loop's thread (``compute_thread``),
    each for an A/B."""
    slo = SLO_S[model]
    if mode == "off":
        batching: dict[str, Any] = {"mode": "off", "max_batch_size": 1}
    elif mode == "fixed":
        batching = {
            "mode": "fixed",
            "max_batch_size": 32 if model == "heavy" else 64,
            "max_queue_delay_s": 0.010 if model == "heavy" else 0.002,
        }
    else:
        batching = {
            "mode": "adaptive",
            "max_batch_size": heavy_max_batch if model == "heavy" else 128,
            "max_queue_delay_s": 0.040 if model == "heavy" else 0.005,
            "latency_slo_s": slo / 2,
            "fill_when_busy": mode != NOFILL,
        }
        if mode in (WORKER, LOOP):
            batching["compute_thread"] = "worker" if mode == WORKER else "loop"
    batching["max_queue_size"] = 2048
    return {"batching": batching, "provider": "cpu"}


def build_bench_repository(
    root: Path, sizes: dict[str, tuple[int, ...]], *, heavy_max_batch: int = HEAVY_MAX_BATCH
) -> dict[str, Path]:
    """One model per (model, mode) named ``<model>-<mode>``; returns model -> onnx file."""
    built = {}
    for model, widths in sizes.items():
        onnx_path = build_mlp(root / ".src" / f"{model}.onnx", widths)
        built[model] = onnx_path
        # every mode, and adaptive without fill_when_busy or on its worker thread (A/B runs)
        for mode in (*MODES, NOFILL, WORKER, LOOP):
            settings = batching_settings(model, mode, heavy_max_batch=heavy_max_batch)
            _place(root, model, mode, onnx_path, settings)
    return built


def _place(root: Path, model: str, mode: str, onnx_path: Path, settings: dict[str, Any]) -> None:
    """``<model>-<mode>/1/model.onnx`` (a hard link where it can) and its ``config.yaml``."""
    vdir = root / f"{model}-{mode}" / "1"
    vdir.mkdir(parents=True)
    try:
        os.link(onnx_path, vdir / "model.onnx")
    except OSError:
        shutil.copyfile(onnx_path, vdir / "model.onnx")
    (vdir.parent / "config.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))


def check_answers(port: int, model: str, sizes: tuple[int, ...]) -> None:
    """One JSON request per served model, compared with the numpy oracle."""
    row = request_row(sizes[0], 0)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, sizes[0]]}]}
    body["inputs"][0]["data"] = row.reshape(-1).tolist()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        answer = json.loads(resp.read())
    got = np.asarray(answer["outputs"][0]["data"], dtype=np.float32).reshape(1, -1)
    want = mlp_reference(row, sizes)
    if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
        raise RuntimeError(f"{model}: the server's answer differs from the numpy reference")
