"""Deterministic demo models built with ``onnx.helper`` and numpy: no downloads, same bytes
for the same arguments, so tests, benchmarks and the quickstart all serve identical models.

``python -m inferway.devtools.demo_models --out models/`` writes the demo repository.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "HEAVY_SIZES",
    "build_add",
    "build_mlp",
    "mlp_reference",
    "write_demo_repository",
]

HEAVY_SIZES: tuple[int, ...] = (4096, 4096, 4096, 16)
"""Two 4096x4096 FP32 layers (~128 MB of weights): a batch-1 run is bound by reading the
weights, so batching many rows into one run multiplies throughput."""

_OPSET = 17
_IR_VERSION = 8  # readable by every onnxruntime >= 1.14


def _mlp_weights(sizes: Sequence[int], seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    layers = []
    for n_in, n_out in itertools.pairwise(sizes):
        # He-style scaling keeps activations in a sane range through many Relu layers.
        w = (rng.standard_normal((n_in, n_out), dtype=np.float32) * np.sqrt(2.0 / n_in)).astype(
            np.float32
        )
        b = (rng.standard_normal(n_out, dtype=np.float32) * 0.01).astype(np.float32)
        layers.append((w, b))
    return layers


def build_mlp_model(sizes: Sequence[int] = (256, 1024, 1024, 10), seed: int = 0) -> onnx.ModelProto:
    """The MLP as an in-memory ``ModelProto``: input ``x`` FP32 [-1, sizes[0]], output ``y``
    FP32 [-1, sizes[-1]], Gemm layers with Relu between them (not after the last)."""
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise ValueError(f"sizes must hold at least two positive widths, got {tuple(sizes)}")
    initializers = []
    nodes = []
    current = "x"
    layers = _mlp_weights(sizes, seed)
    for i, (w, b) in enumerate(layers):
        initializers += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(layers) - 1
        out = "y" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [current, f"w{i}", f"b{i}"], [out], name=f"gemm{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"], name=f"relu{i}"))
            current = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", sizes[-1]])],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="inferway"
    )
    model.ir_version = _IR_VERSION
    return model


def build_mlp(
    path: str | Path, sizes: Sequence[int] = (256, 1024, 1024, 10), seed: int = 0
) -> Path:
    """Write the deterministic MLP to ``path`` (see ``build_mlp_model``) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = build_mlp_model(sizes, seed)
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def mlp_reference(
    x: np.ndarray, sizes: Sequence[int] = (256, 1024, 1024, 10), seed: int = 0
) -> np.ndarray:
    """What ``build_mlp(sizes, seed)`` computes, in numpy: the oracle for tests."""
    layers = _mlp_weights(sizes, seed)
    h = x.astype(np.float32)
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0)
    return h


def build_add(path: str | Path, features: int = 4, datatype: str = "FP32") -> Path:
    """A tiny model with two inputs ``a``, ``b`` [-1, features] and outputs ``sum`` = a + b and
    ``diff`` = a - b: cheap enough for tests that only care about plumbing."""
    from inferway.backends.runners.dtypes import onnx_elem_type

    elem = onnx_elem_type(datatype)
    shape: list[str | int | None] = ["batch", features]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["sum"], name="add"),
            helper.make_node("Sub", ["a", "b"], ["diff"], name="sub"),
        ],
        "add",
        [helper.make_tensor_value_info(n, elem, shape) for n in ("a", "b")],
        [helper.make_tensor_value_info(n, elem, shape) for n in ("sum", "diff")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="inferway"
    )
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def write_demo_repository(
    root: str | Path,
    name: str = "demo",
    versions: Sequence[int] = (1,),
    *,
    sizes: Sequence[int] = (256, 1024, 1024, 10),
    config: dict[str, Any] | None = None,
    heavy: bool = False,
) -> Path:
    """Create ``root/<name>/<version>/model.onnx`` (+ ``config.yaml`` when ``config`` is given)
    for each version. Version ``v`` uses seed ``v - 1`` so versions give different answers.
    Returns the model directory ``root/<name>``."""
    root = Path(root)
    model_dir = root / name
    for v in versions:
        if v < 1:
            raise ValueError(f"versions are positive integers, got {v}")
        vdir = model_dir / str(v)
        if heavy:
            build_mlp(vdir / "model.onnx", HEAVY_SIZES, seed=v - 1)
        else:
            build_mlp(vdir / "model.onnx", sizes, seed=v - 1)
        if config is not None:
            (vdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return model_dir


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m inferway.devtools.demo_models",
        description="Write the deterministic demo model repository.",
    )
    parser.add_argument("--out", type=Path, default=Path("models"), help="repository root")
    parser.add_argument("--versions", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--no-heavy", action="store_true", help="skip the ~128 MB weight-bound 'heavy' model"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    batching = {"batching": {"mode": "adaptive", "max_batch_size": 64}}
    write_demo_repository(args.out, "demo", args.versions, config=batching)
    print(f"wrote {args.out / 'demo'} versions {args.versions}")
    if not args.no_heavy:
        write_demo_repository(args.out, "heavy", (1,), heavy=True, config=batching)
        print(f"wrote {args.out / 'heavy'} version 1 (sizes {HEAVY_SIZES})")
    print(f"done in {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
