"""The inputs an optimised version is judged on: the calibration data when given, and always
the generated cases that find what calibration data rarely holds -- every batch size up to
the model's maximum, random and uniform values over the input domain, zeros, the domain's
extremes, and the edge values of the input dtype (signed zero, subnormals, the smallest
normal, one step inside and outside the domain's bounds).

The domain is the calibration data's range per input when there is some (random values then
follow its mean and standard deviation), else [-3, 3] for float inputs (standard-normal
data) and [0, 10] for integer ones. Deterministic (seeded):
the same model and data give the same cases, so two reports compare.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferway.backends.runners.base import TensorSpec
from inferway.backends.runners.dtypes import numpy_dtype

__all__ = [
    "CalibrationError",
    "ValidationCase",
    "build_validation_cases",
    "iter_batches",
    "load_calibration",
]

_FLOAT_DOMAIN = (-3.0, 3.0)
_INT_DOMAIN = (0, 10)


class CalibrationError(ValueError):
    """A calibration file that does not fit the model; the message names the file."""


@dataclass(frozen=True)
class ValidationCase:
    """One batch run through both versions; ``category`` says which kind of input it is."""

    category: str
    feed: dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        return int(next(iter(self.feed.values())).shape[0])


def load_calibration(path: Path, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """``FILE.npz`` with one array per model input (named like it), rows along the first
    axis, in the input's dtype (floats are cast between float widths, nothing else is)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as e:
        raise CalibrationError(f"{path}: cannot read calibration data: {e}") from e
    wanted = {s.name for s in specs}
    if set(arrays) != wanted:
        raise CalibrationError(
            f"{path}: arrays must be exactly the model inputs {sorted(wanted)}; "
            f"got {sorted(arrays)}"
        )
    out: dict[str, np.ndarray] = {}
    rows = {a.shape[0] if a.ndim else 0 for a in arrays.values()}
    if len(rows) != 1 or 0 in rows:
        raise CalibrationError(f"{path}: every array needs the same number (>= 1) of rows")
    for spec in specs:
        arr = arrays[spec.name]
        dtype = numpy_dtype(spec.datatype)
        if arr.dtype != dtype:
            if arr.dtype.kind == "f" and dtype.kind == "f":
                arr = arr.astype(dtype)
            else:
                raise CalibrationError(
                    f"{path}: {spec.name!r} has dtype {arr.dtype}, the model wants {dtype}"
                )
        fixed = spec.shape[1:]
        if len(arr.shape) != len(spec.shape) or any(
            d >= 0 and d != a for d, a in zip(fixed, arr.shape[1:], strict=True)
        ):
            raise CalibrationError(
                f"{path}: {spec.name!r} has shape {arr.shape}, the model wants {spec.shape}"
            )
        out[spec.name] = arr
    return out


def iter_batches(data: dict[str, np.ndarray], batch: int) -> Iterator[dict[str, np.ndarray]]:
    """Rows of ``data`` in batches of at most ``batch``."""
    total = next(iter(data.values())).shape[0]
    for start in range(0, total, batch):
        yield {k: v[start : start + batch] for k, v in data.items()}


def _row_shape(spec: TensorSpec, calibration: dict[str, np.ndarray] | None) -> tuple[int, ...]:
    if calibration is not None:
        return tuple(calibration[spec.name].shape[1:])
    return tuple(1 if d < 0 else d for d in spec.shape[1:])


def _domain(spec: TensorSpec, calibration: dict[str, np.ndarray] | None) -> tuple[float, float]:
    dtype = numpy_dtype(spec.datatype)
    if calibration is not None and dtype.kind in "fiu":
        arr = calibration[spec.name]
        finite = arr[np.isfinite(arr)] if dtype.kind == "f" else arr
        if finite.size:
            return float(finite.min()), float(finite.max())
    return _FLOAT_DOMAIN if dtype.kind == "f" else _INT_DOMAIN


class _Generator:
    """Batches for one model's inputs, all drawn from one seeded generator."""

    def __init__(
        self, specs: Sequence[TensorSpec], calibration: dict[str, np.ndarray] | None, seed: int
    ) -> None:
        self.specs = specs
        self.rng = np.random.default_rng(seed)
        self.shapes = {s.name: _row_shape(s, calibration) for s in specs}
        self.domains = {s.name: _domain(s, calibration) for s in specs}
        self.dtypes = {s.name: numpy_dtype(s.datatype) for s in specs}
        self.moments: dict[str, tuple[float, float]] = {}
        for name, arr in (calibration or {}).items():
            if arr.dtype.kind == "f" and np.isfinite(arr).any():
                finite = arr[np.isfinite(arr)].astype(np.float64)
                self.moments[name] = (float(finite.mean()), float(finite.std()))

    def _values(self, name: str, rows: int, kind: str) -> np.ndarray:
        shape = (rows, *self.shapes[name])
        dtype = self.dtypes[name]
        lo, hi = self.domains[name]
        if dtype == np.dtype(np.bool_):
            if kind in ("zeros", "low"):
                return np.zeros(shape, dtype=bool)
            if kind == "high":
                return np.ones(shape, dtype=bool)
            return self.rng.random(shape) < 0.5
        if dtype == np.dtype(object):
            return np.full(shape, b"", dtype=object)
        if kind == "zeros":
            return np.zeros(shape, dtype=dtype)
        if kind == "low":
            return np.full(shape, lo, dtype=dtype)
        if kind == "high":
            return np.full(shape, hi, dtype=dtype)
        if kind == "alternating":
            flat = np.where(np.arange(int(np.prod(shape))) % 2 == 0, lo, hi)
            return flat.reshape(shape).astype(dtype)
        if dtype.kind in "iu":
            return self.rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
        if kind == "uniform":
            return self.rng.uniform(lo, hi, size=shape).astype(dtype)
        # "random": normal data like the calibration's, else centred with 3 sigma spanning
        # the domain; clipped to the domain either way.
        centre, spread = self.moments.get(name, ((lo + hi) / 2, (hi - lo) / 6))
        spread = max(spread, float(np.finfo(dtype).tiny))
        return np.clip(self.rng.normal(centre, spread, size=shape), lo, hi).astype(dtype)

    def batch(self, rows: int, kind: str) -> dict[str, np.ndarray]:
        return {s.name: self._values(s.name, rows, kind) for s in self.specs}

    def dtype_edges(self) -> dict[str, np.ndarray]:
        """One row per edge value, the same value in every element of the row."""
        columns: dict[str, list[float]] = {}
        for spec in self.specs:
            dtype, (lo, hi) = self.dtypes[spec.name], self.domains[spec.name]
            if dtype.kind == "f":
                info = np.finfo(dtype)
                sub = float(np.nextafter(dtype.type(0), dtype.type(1)))
                values = [0.0, -0.0, sub, -sub, float(info.tiny), -float(info.tiny)]
                values += [float(info.eps), 1.0, -1.0]
                values += [float(np.nextafter(dtype.type(v), dtype.type(0))) for v in (lo, hi)]
            elif dtype.kind in "iu":
                values = [0.0, lo, hi, min(lo + 1, hi), max(hi - 1, lo)]
            else:
                values = [0.0, 1.0]
            columns[spec.name] = values
        rows = max(len(v) for v in columns.values())
        feed = {}
        for spec in self.specs:
            values = columns[spec.name]
            values = [values[i % len(values)] for i in range(rows)]
            shape = (rows, *self.shapes[spec.name])
            dtype = self.dtypes[spec.name]
            if dtype == np.dtype(object):
                feed[spec.name] = np.full(shape, b"", dtype=object)
                continue
            column = np.array(values, dtype=np.float64).reshape(rows, *([1] * (len(shape) - 1)))
            feed[spec.name] = np.broadcast_to(column, shape).astype(dtype)
        return feed


def build_validation_cases(
    specs: Sequence[TensorSpec],
    max_batch_size: int,
    *,
    min_rows: int = 1000,
    calibration: dict[str, np.ndarray] | None = None,
    seed: int = 0,
) -> list[ValidationCase]:
    """At least ``min_rows`` rows in batches of at most ``max_batch_size``: the calibration
    rows first, then every batch size, the value kinds and the dtype edges, then random
    batches until ``min_rows`` is reached."""
    gen = _Generator(specs, calibration, seed)
    cases: list[ValidationCase] = []
    if calibration is not None:
        cases += [
            ValidationCase("calibration", b) for b in iter_batches(calibration, max_batch_size)
        ]
    cases += [
        ValidationCase("batch-size", gen.batch(b, "random")) for b in range(1, max_batch_size + 1)
    ]
    rows = min(max_batch_size, 16)
    for kind in ("uniform", "zeros", "low", "high", "alternating"):
        category = "extremes" if kind in ("low", "high", "alternating") else kind
        cases.append(ValidationCase(category, gen.batch(rows, kind)))
    edges = gen.dtype_edges()
    cases += [ValidationCase("dtype-edges", b) for b in iter_batches(edges, max_batch_size)]
    while sum(c.rows for c in cases) < min_rows:
        cases.append(ValidationCase("random", gen.batch(max_batch_size, "random")))
    return cases
