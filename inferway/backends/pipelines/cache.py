"""The step-result cache: a deterministic step's outputs kept by a hash of its inputs.

A byte budget (least recently used results go first) and a time to live, on an injected
clock so both are unit tested without waiting. Hand-written rather than ``cachetools``
because the metrics need every eviction with its reason (budget or age) and the budget is
counted in the arrays' bytes, which a few lines here do exactly.

The key hashes the step's identity (pipeline, step, the model versions and their file
fingerprints, so a reloaded model never answers from its predecessor's results) and each
input's name, dtype, shape and bytes.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["CacheStats", "StepCache", "build_cache_key"]

Outputs = dict[str, np.ndarray]


def build_cache_key(identity: Iterable[object], inputs: Mapping[str, np.ndarray]) -> bytes:
    """A content hash (BLAKE2b, 128 bits) of ``identity`` and the input tensors."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(tuple(identity)).encode())
    for name in sorted(inputs):
        array = inputs[name]
        h.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        if array.dtype == np.dtype(object):  # BYTES: hash the elements, not the pointers
            for item in array.reshape(-1):
                data = item if isinstance(item, bytes) else str(item).encode()
                h.update(len(data).to_bytes(8, "little"))
                h.update(data)
        else:
            h.update(np.ascontiguousarray(array).data)
    return h.digest()


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    evicted_budget: int = 0
    evicted_expired: int = 0


@dataclass(slots=True)
class _Entry:
    outputs: Outputs
    nbytes: int
    expires: float


class StepCache:
    """Results of deterministic steps, at most ``max_bytes`` of arrays, each for ``ttl_s``.
    ``on_evict(reason, count)`` hears of every eviction (``budget`` or ``expired``)."""

    def __init__(
        self,
        max_bytes: int,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[str, int], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.stats = CacheStats()
        self.nbytes = 0
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._on_evict = on_evict

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Outputs | None:
        """The cached outputs (read-only arrays) or None; counts the hit or miss."""
        entry = self._entries.get(key)
        if entry is not None and entry.expires <= self.clock():
            self._drop(key, "expired")
            entry = None
        if entry is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return entry.outputs

    def put(self, key: bytes, outputs: Mapping[str, np.ndarray]) -> bool:
        """Keep ``outputs`` under ``key``; False when they alone exceed the budget."""
        nbytes = sum(int(a.nbytes) for a in outputs.values()) + len(key)
        if nbytes > self.max_bytes:
            return False
        if key in self._entries:
            self._drop(key, None)
        self._expire()
        while self.nbytes + nbytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)), "budget")
        frozen: Outputs = {}
        for name, array in outputs.items():
            copy = np.array(array, copy=True)  # the caller's array may be written later
            copy.setflags(write=False)
            frozen[name] = copy
        self._entries[key] = _Entry(frozen, nbytes, self.clock() + self.ttl_s)
        self.nbytes += nbytes
        return True

    def _expire(self) -> None:
        """Drop expired entries from the old end (entries expire in insertion order, but a
        hit moves one to the end: stop at the first live one, the rest go when touched)."""
        now = self.clock()
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.expires > now:
                return
            self._drop(key, "expired")

    def _drop(self, key: bytes, reason: str | None) -> None:
        entry = self._entries.pop(key)
        self.nbytes -= entry.nbytes
        if reason == "budget":
            self.stats.evicted_budget += 1
        elif reason == "expired":
            self.stats.evicted_expired += 1
        if reason is not None and self._on_evict is not None:
            self._on_evict(reason, 1)
