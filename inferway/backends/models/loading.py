"""One model version's file and config -> warmed-up runners, ready to hand to an executor.

Warm-up happens here, before the repository swaps a version in, so the first real request
pays no lazy initialisation and a broken model fails while the old version still serves; so
do a version the accuracy gate rejected and an encrypted file that does not decrypt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferway.backends.batching.config import BatchingConfig
from inferway.backends.models.config import ModelConfig
from inferway.backends.models.encrypted import decrypt_model_file, is_encrypted
from inferway.backends.models.rejection import check_not_rejected
from inferway.backends.runners.base import Runner, TensorSpec
from inferway.backends.runners.dtypes import numpy_dtype

__all__ = [
    "ExecutorFactory",
    "RunnerFactory",
    "build_warmup_inputs",
    "default_executor_factory",
    "default_runner_factory",
    "load_runners",
]

ExecutorFactory = Callable[[Sequence[Runner], BatchingConfig, str], Any]
RunnerFactory = Callable[[Path, ModelConfig], Runner]


def build_warmup_inputs(specs: Sequence[TensorSpec], rows: int) -> dict[str, np.ndarray]:
    """Zero inputs with ``rows`` in a dynamic batch dim (other dynamic dims become 1)."""
    feed = {}
    for spec in specs:
        shape = tuple((rows if i == 0 else 1) if d < 0 else d for i, d in enumerate(spec.shape))
        dtype = numpy_dtype(spec.datatype)
        if dtype == np.dtype(object):
            feed[spec.name] = np.full(shape, b"", dtype=object)
        else:
            feed[spec.name] = np.zeros(shape, dtype=dtype)
    return feed


def default_executor_factory(runners: Sequence[Runner], config: BatchingConfig, name: str) -> Any:
    from inferway.backends.batching import BatchExecutor

    return BatchExecutor(runners, config, name=name)


def default_runner_factory(path: Path, config: ModelConfig) -> Runner:
    from inferway.backends.runners.select import build_runner

    model_bytes = decrypt_model_file(path, config.encryption) if is_encrypted(path) else None
    return build_runner(path, config, model_bytes=model_bytes)


def load_runners(model: Path, config: ModelConfig, runner_factory: RunnerFactory) -> list[Runner]:
    """Create ``instances`` runners and run a batch of 1 and of max rows through each, so
    the first real request pays no lazy initialisation (and a broken model fails here)."""
    check_not_rejected(model.parent)
    runners: list[Runner] = []
    try:
        for _ in range(config.instances):
            runner = runner_factory(model, config)
            runners.append(runner)
            max_rows = config.batching.max_batch_size
            for rows in sorted({1, max_rows}):
                runner.run(build_warmup_inputs(runner.inputs, rows))
    except BaseException:
        for r in runners:
            with contextlib.suppress(Exception):
                r.close()
        raise
    return runners
