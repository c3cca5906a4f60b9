"""Demo pipelines over the deterministic demo MLPs: a three-model chain with two parallel
branches, and a mixture of experts behind a router. Each comes with its numpy reference, the
oracle tests and benchmarks compare the served answers with.

``python -m inferway.devtools.demo_pipelines --out models/`` writes both into a repository.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from inferway.devtools.demo_models import build_mlp, mlp_reference

__all__ = [
    "CHAIN",
    "MOE",
    "DemoModel",
    "chain_reference",
    "moe_reference",
    "write_chain_pipeline",
    "write_moe_pipeline",
]


@dataclass(frozen=True)
class DemoModel:
    """One demo MLP: its name, layer widths and weight seed (input ``x``, output ``y``)."""

    name: str
    sizes: tuple[int, ...]
    seed: int

    def reference(self, x: np.ndarray) -> np.ndarray:
        return mlp_reference(x, self.sizes, self.seed)


CHAIN: tuple[DemoModel, ...] = (
    DemoModel("chain_embed", (32, 128, 64), 11),
    DemoModel("chain_left", (64, 256, 8), 12),
    DemoModel("chain_right", (64, 256, 8), 13),
)
"""embed -> (left || right): the two branches read embed's output and run side by side."""
MOE: tuple[DemoModel, ...] = (
    DemoModel("moe_router", (16, 32, 4), 21),
    *(DemoModel(f"moe_expert_{i}", (16, 32, 8), 30 + i) for i in range(4)),
)
"""The router scores 4 experts; each row goes to its top 2."""
MOE_TOP_K = 2


def _write_models(
    root: Path, models: Sequence[DemoModel], config: dict[str, Any] | None, scale: int
) -> None:
    for m in models:
        sizes = (m.sizes[0], *(s * scale for s in m.sizes[1:-1]), m.sizes[-1])
        build_mlp(root / m.name / "1" / "model.onnx", sizes, seed=m.seed)
        if config is not None:
            (root / m.name / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def write_chain_pipeline(
    root: str | Path,
    name: str = "chain",
    *,
    config: dict[str, Any] | None = None,
    cache: bool = True,
    scale: int = 1,
) -> Path:
    """The three chain models (``config`` as each one's config.yaml) and ``<name>/pipeline.yaml``:
    outputs ``left`` and ``right``. ``cache`` marks every step deterministic and cached;
    ``scale`` multiplies the hidden widths (heavier steps for benchmarks). Returns the path."""
    root = Path(root)
    _write_models(root, CHAIN, config, scale)
    embed, left, right = (m.name for m in CHAIN)
    flags = {"deterministic": True, "cache": True} if cache else {}
    spec = {
        "steps": [
            {"name": "embed", "model": embed, "inputs": {"x": "request.x"}, **flags},
            {"name": "left", "model": left, "inputs": {"x": "embed.y"}, **flags},
            {"name": "right", "model": right, "inputs": {"x": "embed.y"}, **flags},
        ],
        "outputs": {"left": "left.y", "right": "right.y"},
        "cache": {"max_bytes": 16 * 1024 * 1024, "ttl_s": 300},
    }
    path = root / name / "pipeline.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def chain_reference(x: np.ndarray) -> dict[str, np.ndarray]:
    """What the chain pipeline answers (``scale`` 1)."""
    embed, left, right = CHAIN
    h = embed.reference(x)
    return {"left": left.reference(h), "right": right.reference(h)}


def write_moe_pipeline(
    root: str | Path, name: str = "moe", *, config: dict[str, Any] | None = None
) -> Path:
    """The router, the four experts and ``<name>/pipeline.yaml`` (output ``y``)."""
    root = Path(root)
    _write_models(root, MOE, config, 1)
    router, *experts = (m.name for m in MOE)
    spec = {
        "steps": [
            {"name": "gate", "model": router, "inputs": {"x": "request.x"}},
            {
                "name": "experts",
                "moe": {"router": "gate.y", "experts": experts, "top_k": MOE_TOP_K, "output": "y"},
                "inputs": {"x": "request.x"},
            },
        ],
        "outputs": {"y": "experts.y"},
    }
    path = root / name / "pipeline.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def moe_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The MoE pipeline's answer and the experts each row chose [rows, top_k], in numpy."""
    router, *experts = MOE
    scores = router.reference(x).astype(np.float64)
    chosen = np.argsort(-scores, axis=1, kind="stable")[:, :MOE_TOP_K]
    top = np.take_along_axis(scores, chosen, axis=1)
    weights = np.exp(top - top.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    outs = np.stack([e.reference(x) for e in experts], axis=1)  # [rows, experts, 8]
    picked = np.take_along_axis(outs, chosen[:, :, None], axis=1)
    return (weights[:, :, None] * picked).sum(axis=1).astype(np.float32), chosen


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m inferway.devtools.demo_pipelines",
        description="Write the demo pipelines (chain with two branches, mixture of experts).",
    )
    parser.add_argument("--out", type=Path, default=Path("models"), help="repository root")
    args = parser.parse_args(argv)
    config = {"batching": {"mode": "adaptive", "max_batch_size": 32}}
    print(f"wrote {write_chain_pipeline(args.out, config=config)}")
    print(f"wrote {write_moe_pipeline(args.out, config=config)}")


if __name__ == "__main__":
    main()
