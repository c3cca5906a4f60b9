"""Compact digests of the answers a backend gave, kept by request id, so a rollout can
compare the canary's outputs with stable's for the same (mirrored) input.

Envoy's request mirroring copies a request to the canary with the same ``x-request-id``
and throws the canary's answer away. Both versions record a digest of each answer here, in a
bounded in-memory table (oldest evicted first), and expose it at ``GET /v2/debug/outputs``;
the rollout's comparator (``controllers/rollout/agreement.py``) pairs digests by id
and counts the pairs that differ beyond a numeric tolerance.

A digest is small whatever the tensor's size: its shape and datatype, the first
``HEAD_VALUES`` values, and the sum, sum of squares, minimum and maximum of all of them
(so a change anywhere in a large output still shows). Text (BYTES) outputs are compared by
a hash.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferway.observability.masking import NO_MASKING, Masker

if TYPE_CHECKING:  # the gateway compares digests without numpy (the gateway extra has none)
    import numpy as np

__all__ = [
    "DEFAULT_CAPACITY",
    "HEAD_VALUES",
    "OutputDigest",
    "OutputRecorder",
    "TensorDigest",
    "build_tensor_digest",
]

HEAD_VALUES = 64
DEFAULT_CAPACITY = 10_000
"""About 1 KiB a record for small outputs: ~10 MiB of memory at most."""


@dataclass(frozen=True, slots=True)
class TensorDigest:
    """One output tensor, summarized. ``text_hash`` is set (and the numbers are empty) for
    BYTES / string tensors."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    head: tuple[float, ...] = ()
    total: float = 0.0
    sum_squares: float = 0.0
    minimum: float = 0.0
    maximum: float = 0.0
    text_hash: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "datatype": self.datatype, "shape": self.shape}
        if self.text_hash is not None:
            out["text_hash"] = self.text_hash
        else:
            out.update(
                head=self.head,
                sum=self.total,
                sum_squares=self.sum_squares,
                min=self.minimum,
                max=self.maximum,
            )
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorDigest:
        return cls(
            name=str(data["name"]),
            datatype=str(data["datatype"]),
            shape=tuple(int(d) for d in data["shape"]),
            head=tuple(float(v) for v in data.get("head", ())),
            total=float(data.get("sum", 0.0)),
            sum_squares=float(data.get("sum_squares", 0.0)),
            minimum=float(data.get("min", 0.0)),
            maximum=float(data.get("max", 0.0)),
            text_hash=data.get("text_hash"),
        )


@dataclass(frozen=True, slots=True)
class OutputDigest:
    """Every output of one answer. ``seq`` orders records within one backend process."""

    seq: int
    request_id: str
    model: str
    version: str
    outputs: tuple[TensorDigest, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "request_id": self.request_id,
            "model": self.model,
            "version": self.version,
            "outputs": [t.to_json() for t in self.outputs],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutputDigest:
        return cls(
            seq=int(data["seq"]),
            request_id=str(data["request_id"]),
            model=str(data["model"]),
            version=str(data["version"]),
            outputs=tuple(TensorDigest.from_json(t) for t in data["outputs"]),
        )


_KIND_PREFIX = {"f": "FP", "i": "INT", "u": "UINT"}


def _datatype(array: np.ndarray) -> str:
    """The Open Inference Protocol datatype name (FP32, INT64, BOOL, BYTES)."""
    kind = array.dtype.kind
    if kind in "OSU":
        return "BYTES"
    if kind == "b":
        return "BOOL"
    return f"{_KIND_PREFIX.get(kind, kind)}{array.dtype.itemsize * 8}"


def build_tensor_digest(name: str, array: np.ndarray, masker: Masker = NO_MASKING) -> TensorDigest:
    """``masker``: text items are masked before they are hashed, so a hash of a short text
    (an e-mail address) cannot be turned back into it by trying candidates."""
    datatype = _datatype(array)
    shape = tuple(int(d) for d in array.shape)
    if datatype == "BYTES":
        digest = hashlib.sha256()
        for item in array.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode()
            if masker.active:
                raw = masker.text(raw.decode("utf-8", "replace")).encode()
            digest.update(len(raw).to_bytes(8, "little") + raw)
        return TensorDigest(name, datatype, shape, text_hash=digest.hexdigest())
    import numpy as np  # only the backend, which has numpy, builds digests

    flat = np.asarray(array, dtype=np.float64).reshape(-1)
    if flat.size == 0:
        return TensorDigest(name, datatype, shape)
    return TensorDigest(
        name,
        datatype,
        shape,
        head=tuple(float(v) for v in flat[:HEAD_VALUES]),
        total=float(flat.sum()),
        sum_squares=float(np.dot(flat, flat)),
        minimum=float(flat.min()),
        maximum=float(flat.max()),
    )


class OutputRecorder:
    """The bounded table of recent answers' digests, by request id (a later answer for the
    same id, e.g. a retry, replaces the earlier one). Safe to call from any thread.
    ``epoch`` is new for every recorder: a reader seeing it change knows the process
    restarted and its sequence numbers began again."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, masker: Masker = NO_MASKING) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.masker = masker
        self.evicted = 0
        self.epoch = uuid.uuid4().hex
        self._records: OrderedDict[str, OutputDigest] = OrderedDict()
        self._seq = 0
        self._lock = threading.Lock()

    def record(
        self,
        request_id: str,
        model: str,
        version: str,
        outputs: Sequence[tuple[str, np.ndarray, object]],
    ) -> None:
        tensors = tuple(
            build_tensor_digest(name, array, self.masker) for name, array, *_ in outputs
        )
        with self._lock:
            self._seq += 1
            self._records.pop(request_id, None)
            self._records[request_id] = OutputDigest(self._seq, request_id, model, version, tensors)
            while len(self._records) > self.capacity:
                self._records.popitem(last=False)
                self.evicted += 1

    def since(self, seq: int, limit: int = 1000) -> tuple[list[OutputDigest], int]:
        """Records after ``seq``, oldest first, at most ``limit``; and the seq to ask from
        next (the last one returned, or ``seq`` when there is nothing new)."""
        with self._lock:
            out = [r for r in self._records.values() if r.seq > seq][:limit]
        return out, out[-1].seq if out else seq

    def __len__(self) -> int:
        return len(self._records)
