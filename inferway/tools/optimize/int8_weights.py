"""Whether INT8 weights are quantised to 7 bits (``reduce_range``) for the CPU that will run them.

On x86-64 CPUs without VNNI, ONNX Runtime's INT8 matrix kernels multiply unsigned activations by
signed weights with ``VPMADDUBSW``, whose 16-bit intermediate sums saturate when both operands
use the full 8-bit range: the quantised model then deviates far more than its rounding explains
(ORT's quantisation guide; ``quantize_dynamic``/``quantize_static(reduce_range=True)`` is its
remedy). CPUs with AVX-VNNI, AVX512-VNNI or AMX accumulate in 32 bits and keep all 8 bits; other
architectures and TensorRT's GPU kernels do not take that path.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

__all__ = ["VNNI_FLAGS", "WeightRange", "choose_weight_range", "host_weight_range"]

VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "avx_vnni_int8", "amx_int8"})
"""``/proc/cpuinfo`` flags of the x86 instructions that accumulate INT8 products in 32 bits."""

_X86 = frozenset({"x86_64", "amd64", "i386", "i686"})
_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class WeightRange:
    """The choice and why, for the report."""

    reduce_range: bool
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"reduce_range": self.reduce_range, "reason": self.reason}


def choose_weight_range(
    *,
    requested: bool | None,
    machine: str,
    cpu_flags: frozenset[str] | None,
    tensorrt: bool = False,
) -> WeightRange:
    """``requested`` (the command line's on/off) wins; otherwise 7-bit weights exactly where
    ORT's CPU kernels would saturate, or where the CPU's features cannot be read."""
    if requested is not None:
        state = "on" if requested else "off"
        return WeightRange(requested, f"--int8-reduce-range {state}")
    if tensorrt:
        return WeightRange(False, "a TensorRT engine: its GPU INT8 kernels do not saturate")
    if machine.lower() not in _X86:
        return WeightRange(False, f"{machine} CPU: ORT's saturating x86 INT8 path is not used")
    if cpu_flags is None:
        return WeightRange(True, "x86-64 CPU whose features could not be read: 7-bit weights")
    vnni = sorted(VNNI_FLAGS & cpu_flags)
    if vnni:
        return WeightRange(False, f"x86-64 CPU with {', '.join(vnni)}: full 8-bit weights")
    return WeightRange(
        True,
        "x86-64 CPU without VNNI: 8-bit weights would saturate ORT's INT8 kernels "
        "(VPMADDUBSW), so weights are quantised to 7 bits",
    )


def _cpu_flags(cpuinfo: Path = _CPUINFO) -> frozenset[str] | None:
    """The first processor's flags from ``/proc/cpuinfo``; None where there is none (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def host_weight_range(*, requested: bool | None, tensorrt: bool = False) -> WeightRange:
    """:func:`choose_weight_range` for this machine, the one whose ORT validates the model."""
    return choose_weight_range(
        requested=requested,
        machine=platform.machine(),
        cpu_flags=_cpu_flags(),
        tensorrt=tensorrt,
    )
