"""``inferway optimize MODEL_DIR --fp16 | --int8``: a new, validated version of a model
(``optimize/pipeline.py``), reported as a table on screen (progress on stderr) or as the
report document with ``-o json|yaml``, followed by the ``rollouts:`` stanza that would ship it.

Exit 0: the version passed the accuracy gate; 1: it was written but rejected (marked, never
loaded), or the input is unusable; 2: ``--tensorrt`` without TensorRT. numpy and onnxruntime
are imported inside the command, so the gateway-only install keeps its CLI.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table
from rich.text import Text

from inferway.cli.output import OutputFormat, OutputOption, write_document
from inferway.console import make_console
from inferway.exit_codes import EXIT_CANNOT_START, EXIT_INVALID

__all__ = ["optimize", "render_report"]


class Int8Mode(enum.StrEnum):
    auto = "auto"
    dynamic = "dynamic"
    static = "static"


class ReduceRange(enum.StrEnum):
    auto = "auto"
    on = "on"
    off = "off"

    def requested(self) -> bool | None:
        return None if self is ReduceRange.auto else self is ReduceRange.on


def _percent(value: str) -> float:
    text = value.strip().removesuffix("%").strip()
    try:
        number = float(text)
    except ValueError:
        raise typer.BadParameter(
            f"expected a percentage such as 0.5% or 1, got {value!r}"
        ) from None
    if not 0 < number < 100:
        raise typer.BadParameter(f"the tolerance must be above 0% and below 100%, got {value!r}")
    return number


def _num(value: float | None, fmt: str = ".4g") -> str:
    return "-" if value is None else format(value, fmt)


def render_report(report: dict[str, Any]) -> None:
    """The report as people read it: verdict, deviation per output, speed and size."""
    console = make_console(soft_wrap=False)
    validation = report["validation"]
    outputs = Table(
        title=f"{report['model']} v{report['source_version']} -> v{report['version']}"
        f" ({', '.join(report['steps'])}) on {validation['rows']} rows"
    )
    for column in ("output", "max abs err", "max rel err", "deviation", "top-1 agreement"):
        outputs.add_column(column, justify="left" if column == "output" else "right")
    for out in validation["outputs"]:
        top1 = out["top1_agreement"]
        outputs.add_row(
            out["name"],
            _num(out["max_abs_error"]),
            _num(out["max_rel_error"]),
            f"{out['deviation_percent']:.3g}%",
            "-" if top1 is None else f"{top1 * 100:.2f}%",
        )
    console.print(outputs)
    perf, size = report["performance"], report["size_bytes"]
    speed = Table(title="before / after")
    for column in ("", "before", "after", "ratio"):
        speed.add_column(column, justify="left" if not column else "right")
    speed.add_row(
        "latency p50, 1 row (ms)",
        _num(perf["before"]["latency_ms_p50"], ".3f"),
        _num(perf["after"]["latency_ms_p50"], ".3f"),
        _num(perf["latency_ratio"], ".2f"),
    )
    speed.add_row(
        f"throughput, {perf['before']['batch']} rows (rows/s)",
        _num(perf["before"]["throughput_rows_s"], ".0f"),
        _num(perf["after"]["throughput_rows_s"], ".0f"),
        _num(perf["throughput_ratio"], ".2f"),
    )
    speed.add_row(
        "size on disk (bytes)", str(size["before"]), str(size["after"]), _num(size["ratio"], ".2f")
    )
    console.print(speed)
    weights = report.get("int8_weights")
    if weights:
        bits = 7 if weights["reduce_range"] else 8
        console.print(Text(f"int8 weights: {bits}-bit ({weights['reason']})"))
    rows = ", ".join(f"{k} {v}" for k, v in validation["rows_by_category"].items())
    console.print(Text(f"inputs: {rows}"))
    if report["accepted"]:
        console.print(
            Text(
                f"ACCEPTED: within {report['tolerance_percent']:g}% -> {report['path']}",
                style="green",
            )
        )
        console.print(Text("\nthe rollout that would ship it as a canary (policy YAML):"))
        console.print(
            Text(
                yaml.safe_dump(report["rollout"], sort_keys=False, default_flow_style=None).rstrip()
            )
        )
    else:
        console.print(
            Text(
                f"REJECTED: {report['path']} is marked rejected and will not be loaded", style="red"
            )
        )
        for reason in report["reasons"]:
            console.print(Text(f"  - {reason}", style="red"))


def optimize(
    model_dir: Annotated[
        Path,
        typer.Argument(
            metavar="MODEL_DIR",
            help="A model's directory in a repository (<model>/<version>/model.onnx); the "
            "highest version is the source, or the version directory itself.",
            show_default=False,
        ),
    ],
    fp16: Annotated[bool, typer.Option("--fp16", help="FP16 weights and arithmetic.")] = False,
    int8: Annotated[
        bool, typer.Option("--int8", help="INT8, per-channel weights (dynamic or static).")
    ] = False,
    int8_mode: Annotated[
        Int8Mode,
        typer.Option(help="auto: static with --calibration (or --tensorrt), else dynamic."),
    ] = Int8Mode.auto,
    int8_reduce_range: Annotated[
        ReduceRange,
        typer.Option(
            help="7-bit INT8 weights. auto: on for x86-64 CPUs without VNNI, whose ORT INT8 "
            "kernels saturate with 8-bit weights; off elsewhere and for --tensorrt."
        ),
    ] = ReduceRange.auto,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="FILE.npz, one array per model input: calibrates static INT8 and is "
            "validated on (else generated data is).",
            dir_okay=False,
            exists=True,
        ),
    ] = None,
    graph: Annotated[
        bool, typer.Option("--graph", help="Also ORT's offline graph optimisation.")
    ] = False,
    tensorrt: Annotated[
        bool, typer.Option("--tensorrt", help="A TensorRT engine (FP16/INT8); needs TensorRT.")
    ] = False,
    tolerance: Annotated[
        str, typer.Option(help="Largest deviation accepted, e.g. 0.5% or 1.")
    ] = "0.5%",
    version: Annotated[
        str | None, typer.Option("--from-version", help="Source version (default: highest).")
    ] = None,
    min_rows: Annotated[
        int, typer.Option(min=1, help="Validate on at least this many rows.")
    ] = 1000,
    bench_runs: Annotated[int, typer.Option(min=1, help="Runs per speed measurement.")] = 20,
    route: Annotated[str, typer.Option(help="Route named in the printed rollout.")] = "inference",
    output: OutputOption = OutputFormat.text,
) -> None:
    """Write an FP16 or INT8 (optionally graph-optimised, or TensorRT) version of a model as
    a new version directory, validate it against the source on >= 1,000 inputs, and mark it
    rejected when it deviates more than --tolerance. Exit 0 accepted, 1 rejected or invalid
    input, 2 --tensorrt without TensorRT."""
    from inferway.tools.optimize.pipeline import (
        NeedsTensorRTError,
        OptimizeError,
        OptimizeRequest,
        optimize_model,
    )

    err = make_console(stderr=True)
    request = OptimizeRequest(
        model_dir=model_dir,
        fp16=fp16,
        int8=int8,
        int8_mode=int8_mode.value,
        int8_reduce_range=int8_reduce_range.requested(),
        calibration=calibration,
        graph=graph,
        tensorrt=tensorrt,
        tolerance_percent=_percent(tolerance),
        source_version=version,
        min_rows=min_rows,
        bench_runs=bench_runs,
        route=route,
    )
    try:
        report = optimize_model(request, lambda line: err.print(Text(line, style="dim")))
    except NeedsTensorRTError as e:
        err.print(Text(str(e), style="red"))
        raise typer.Exit(EXIT_CANNOT_START) from None
    except (OptimizeError, OSError, RuntimeError, ValueError) as e:
        err.print(
            Text(f"{model_dir}: {e}" if str(model_dir) not in str(e) else str(e), style="red")
        )
        raise typer.Exit(EXIT_INVALID) from None
    if output is OutputFormat.text:
        render_report(report)
    else:
        write_document(report, output)
    if not report["accepted"]:
        raise typer.Exit(EXIT_INVALID)
