"""``inferway optimize`` end to end: a new version directory from an existing one, validated
against it, published only once it is complete.

The new version is built in a dot-named staging directory beside the versions (the
repository ignores dot-names), and renamed to ``<next version>`` only after the validation
has run and the report -- and, when the gate failed, the rejection marker -- are written.
A serving repository watching the directory therefore never sees a half-written version, nor
a version before its verdict; an existing version is never overwritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from inferway.backends.models.config import (
    CONFIG_FILE,
    ModelConfig,
    load_model_config,
    resolve_model_config_path,
)
from inferway.backends.models.rejection import REJECTED_FILE, write_rejection
from inferway.backends.models.scan import MODEL_FILE
from inferway.backends.runners.base import TensorSpec
from inferway.backends.runners.select import build_runner
from inferway.backends.runners.tensorrt import tensorrt_unavailable_reason
from inferway.tools.optimize import convert
from inferway.tools.optimize.compare import compare_runners, measure_speed
from inferway.tools.optimize.inputs import build_validation_cases, load_calibration
from inferway.tools.optimize.int8_weights import WeightRange, host_weight_range
from inferway.tools.optimize.report import REPORT_FILE, build_report, build_rollout_stanza, judge

__all__ = ["NeedsTensorRTError", "OptimizeError", "OptimizeRequest", "optimize_model"]

Progress = Callable[[str], None]


class OptimizeError(ValueError):
    """The request cannot be carried out (no such model, bad calibration data, ...)."""


class NeedsTensorRTError(OptimizeError):
    """``--tensorrt`` on a machine without a usable TensorRT."""


@dataclass(frozen=True)
class OptimizeRequest:
    model_dir: Path
    fp16: bool = False
    int8: bool = False
    int8_mode: str = "auto"
    """``dynamic``, ``static`` or ``auto`` (static when calibration data is given)."""
    calibration: Path | None = None
    graph: bool = False
    tensorrt: bool = False
    tolerance_percent: float = 0.5
    source_version: str | None = None
    min_rows: int = 1000
    bench_runs: int = 20
    per_channel: bool = True
    route: str = "inference"
    int8_reduce_range: bool | None = None
    """7-bit INT8 weights: None decides from the CPU (``int8_weights``), True/False forces."""


def _version_dir(path: Path) -> bool:
    """Whether ``path`` is named like a version: ASCII digits (``str.isdigit`` alone also
    takes "²", which ``int`` refuses)."""
    return path.name.isascii() and path.name.isdigit()


def _resolve_source(request: OptimizeRequest) -> tuple[Path, Path]:
    """(model directory, source version directory)."""
    path = request.model_dir
    if _version_dir(path) and (path / MODEL_FILE).is_file() and request.source_version is None:
        return path.parent, path
    if not path.is_dir():
        raise OptimizeError(f"{path}: not a model directory (<model>/<version>/model.onnx)")
    versions = sorted(
        (p for p in path.iterdir() if _version_dir(p) and (p / MODEL_FILE).is_file()),
        key=lambda p: int(p.name),
    )
    if request.source_version is not None:
        versions = [v for v in versions if v.name == request.source_version]
        if not versions:
            raise OptimizeError(f"{path}: no version {request.source_version} with a {MODEL_FILE}")
    else:  # the highest original: not rejected, not itself an output of optimize
        versions = [
            v
            for v in versions
            if not (v / REJECTED_FILE).exists() and not (v / REPORT_FILE).exists()
        ]
    if not versions:
        raise OptimizeError(
            f"{path}: no version directory holding a plain {MODEL_FILE} that optimize did not "
            "write (name one with --from-version)"
        )
    return path, versions[-1]


def _next_version(model_dir: Path) -> str:
    numbers = [int(p.name) for p in model_dir.iterdir() if _version_dir(p)]
    return str(max(numbers, default=0) + 1)


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _steps(request: OptimizeRequest) -> list[str]:
    if request.fp16 == request.int8:
        raise OptimizeError("give exactly one of --fp16 or --int8")
    if request.int8_mode not in ("auto", "dynamic", "static"):
        raise OptimizeError(f"--int8-mode must be auto, dynamic or static, not {request.int8_mode}")
    if request.calibration is not None and not request.int8:
        raise OptimizeError("--calibration calibrates INT8 activations: use it with --int8")
    if request.tensorrt:
        reason = tensorrt_unavailable_reason(0)
        if reason is not None:
            raise NeedsTensorRTError(f"--tensorrt needs TensorRT and a CUDA GPU: {reason}")
    if request.fp16:
        steps = ["fp16"]
    else:
        mode = request.int8_mode
        if mode == "auto":
            mode = "static" if request.calibration is not None or request.tensorrt else "dynamic"
        if mode == "dynamic" and request.tensorrt:
            raise OptimizeError("TensorRT runs static INT8 (QDQ) only: use --int8-mode static")
        steps = [f"int8-{mode}"]
    if request.graph:
        if request.tensorrt:
            raise OptimizeError(
                "--graph writes ORT-only fused operators; TensorRT cannot load them"
            )
        steps.append("graph")
    if request.tensorrt:
        steps.append("tensorrt")
    return steps


def _new_config(config_path: Path | None, steps: list[str]) -> dict[str, Any]:
    """The new version's own config.yaml: the one the source version runs with (a
    version-level file replaces the model-level one whole), plus the engine choice."""
    data: dict[str, Any] = {}
    if config_path is not None:
        data = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    if "tensorrt" in steps:
        data["provider"] = "tensorrt"
        data["fp16"] = True  # FP16 engine; with INT8 QDQ, the layers left in float
    return data


def _convert(
    step: str,
    src: Path,
    dst: Path,
    calibration: dict[str, np.ndarray] | None,
    max_batch: int,
    per_channel: bool,
    steps: list[str],
    reduce_range: bool,
) -> None:
    if step == "fp16":
        convert.build_fp16(src, dst)
    elif step == "int8-dynamic":
        convert.build_int8_dynamic(src, dst, per_channel=per_channel, reduce_range=reduce_range)
    elif step == "int8-static":
        assert calibration is not None
        convert.build_int8_static(
            src,
            dst,
            calibration,
            batch=max_batch,
            per_channel=per_channel,
            symmetric="tensorrt" in steps,
            reduce_range=reduce_range,
        )
    elif step == "graph":
        convert.build_graph_optimized(src, dst)
    else:
        raise OptimizeError(f"unknown step {step!r}")


def optimize_model(request: OptimizeRequest, progress: Progress = lambda _: None) -> dict[str, Any]:
    """Build, validate and publish the new version; returns the report document."""
    steps = _steps(request)
    model_dir, source_dir = _resolve_source(request)
    config_path = resolve_model_config_path(model_dir, source_dir)
    version = _next_version(model_dir)
    weights = None
    if any(step.startswith("int8") for step in steps):
        weights = host_weight_range(
            requested=request.int8_reduce_range, tensorrt="tensorrt" in steps
        )
        progress(f"int8 weights: {7 if weights.reduce_range else 8}-bit ({weights.reason})")
    build = _Build(
        request=request,
        steps=steps,
        source_dir=source_dir,
        config_path=config_path,
        source_config=load_model_config(config_path) if config_path else ModelConfig(),
        version=version,
        staging=model_dir / f".optimize-{version}-{os.getpid()}",
        progress=progress,
        weights=weights,
    )
    build.staging.mkdir()
    try:
        report = build.run()
        target = model_dir / version
        if target.exists():
            raise OptimizeError(f"{target} appeared while optimising; not overwriting it")
        build.staging.rename(target)
        return report
    finally:
        if build.staging.exists():
            shutil.rmtree(build.staging, ignore_errors=True)


@dataclass
class _Build:
    """One new version in its staging directory: converted, configured, judged."""

    request: OptimizeRequest
    steps: list[str]
    source_dir: Path
    config_path: Path | None
    source_config: ModelConfig
    version: str
    staging: Path
    progress: Progress
    weights: WeightRange | None = None
    """How INT8 weights are quantised (None: no INT8 step)."""

    @property
    def max_batch(self) -> int:
        return self.source_config.batching.max_batch_size

    def run(self) -> dict[str, Any]:
        request = self.request
        old = build_runner(self.source_dir / MODEL_FILE, self.source_config)
        with contextlib.ExitStack() as stack:
            stack.callback(old.close)
            calibration = (
                load_calibration(request.calibration, old.inputs) if request.calibration else None
            )
            self._convert(old.inputs, calibration)
            new_config = self._write_config()
            if "tensorrt" in self.steps:
                self.progress("tensorrt: building the engine (this can take minutes)")
            new = build_runner(self.staging / MODEL_FILE, new_config)
            stack.callback(new.close)
            cases = build_validation_cases(
                old.inputs, self.max_batch, min_rows=request.min_rows, calibration=calibration
            )
            self.progress(
                f"validating on {sum(c.rows for c in cases)} rows in {len(cases)} batches"
            )
            marks = {len(cases) * q // 4 for q in (1, 2, 3)}

            def tick(done: int, total: int) -> None:
                if done in marks:
                    self.progress(f"validated {done}/{total} batches")

            comparison = compare_runners(old, new, cases, tick)
            verdict = judge(comparison, request.tolerance_percent, request.min_rows)
            self.progress("measuring latency and throughput")
            sweep = {c.rows: c.feed for c in cases if c.category == "batch-size"}
            before = measure_speed(old, sweep[1], sweep[self.max_batch], request.bench_runs)
            after = measure_speed(new, sweep[1], sweep[self.max_batch], request.bench_runs)
        model_dir = self.source_dir.parent
        report = build_report(
            model=model_dir.name,
            source_version=self.source_dir.name,
            version=self.version,
            path=str(model_dir / self.version),
            steps=self.steps,
            tolerance_percent=request.tolerance_percent,
            comparison=comparison,
            verdict=verdict,
            before=before,
            after=after,
            size_before=(self.source_dir / MODEL_FILE).stat().st_size,
            size_after=_size(self.staging),
            int8_weights=self.weights.as_dict() if self.weights else None,
            stanza=build_rollout_stanza(
                model_dir.name, self.source_dir.name, self.version, request.route
            ),
        )
        (self.staging / REPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        if not verdict.accepted:
            write_rejection(self.staging, verdict.reason, report=REPORT_FILE)
        return report

    def _convert(
        self, inputs: tuple[TensorSpec, ...], calibration: dict[str, np.ndarray] | None
    ) -> None:
        """Each step from the previous one's file; the last becomes ``model.onnx``."""
        current = self.source_dir / MODEL_FILE
        for step in self.steps:
            if step == "tensorrt":  # the engine is built by the runner that serves it
                continue
            started = time.perf_counter()
            out = self.staging / f".{step}.onnx"
            data = calibration
            if step == "int8-static" and data is None:  # generated over the default domain
                generated = build_validation_cases(inputs, self.max_batch, min_rows=512, seed=1)
                data = {
                    k: np.concatenate([c.feed[k] for c in generated]) for k in generated[0].feed
                }
            try:
                _convert(
                    step,
                    current,
                    out,
                    data,
                    self.max_batch,
                    self.request.per_channel,
                    self.steps,
                    self.weights.reduce_range if self.weights else False,
                )
            except Exception as e:  # onnx / onnxruntime raise their own types
                raise OptimizeError(f"{current}: {step} failed: {e}") from e
            current = out
            self.progress(f"{step}: {time.perf_counter() - started:.1f}s")
        current.rename(self.staging / MODEL_FILE)
        for leftover in self.staging.glob(".*.onnx"):
            leftover.unlink()

    def _write_config(self) -> ModelConfig:
        """The new version's own ``config.yaml`` when it needs one: the source had its own,
        or the engine changes. Otherwise the model-level file applies to it as to the source."""
        own = self.config_path is not None and self.config_path.parent == self.source_dir
        if not own and "tensorrt" not in self.steps:
            return self.source_config
        path = self.staging / CONFIG_FILE
        path.write_text(yaml.safe_dump(_new_config(self.config_path, self.steps), sort_keys=False))
        return load_model_config(path)
