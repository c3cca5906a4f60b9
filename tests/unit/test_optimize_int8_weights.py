"""7-bit INT8 weights (``reduce_range``) where ORT's x86 INT8 kernels would saturate."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.tools.optimize.int8_weights import VNNI_FLAGS, _cpu_flags, choose_weight_range

AVX2 = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})


@pytest.mark.parametrize("flag", sorted(VNNI_FLAGS))
def test_x86_with_any_vnni_keeps_8_bits(flag: str) -> None:
    choice = choose_weight_range(requested=None, machine="x86_64", cpu_flags=AVX2 | {flag})
    assert choice.reduce_range is False and flag in choice.reason


@pytest.mark.parametrize("flags", [AVX2, AVX2 | {"avx512f", "avx512bw"}])
def test_x86_without_vnni_uses_7_bits(flags: frozenset[str]) -> None:
    choice = choose_weight_range(requested=None, machine="x86_64", cpu_flags=flags)
    assert choice.reduce_range is True and "without VNNI" in choice.reason


def test_unreadable_x86_features_take_the_safe_7_bits() -> None:
    choice = choose_weight_range(requested=None, machine="AMD64", cpu_flags=None)
    assert choice.reduce_range is True and "could not be read" in choice.reason


@pytest.mark.parametrize("machine", ["aarch64", "arm64", "ppc64le"])
def test_other_architectures_keep_8_bits(machine: str) -> None:
    choice = choose_weight_range(requested=None, machine=machine, cpu_flags=None)
    assert choice.reduce_range is False and machine in choice.reason


def test_tensorrt_keeps_8_bits_even_on_a_saturating_cpu() -> None:
    choice = choose_weight_range(requested=None, machine="x86_64", cpu_flags=AVX2, tensorrt=True)
    assert choice.reduce_range is False and "TensorRT" in choice.reason


@pytest.mark.parametrize("requested", [True, False])
def test_the_command_line_wins(requested: bool) -> None:
    for flags in (AVX2, AVX2 | {"avx512_vnni"}):
        choice = choose_weight_range(requested=requested, machine="x86_64", cpu_flags=flags)
        assert choice.reduce_range is requested
        assert choice.as_dict() == {
            "reduce_range": requested,
            "reason": f"--int8-reduce-range {'on' if requested else 'off'}",
        }


def test_cpu_flags_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx avx2 avx512_vnni\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert _cpu_flags(info) == frozenset({"fpu", "avx", "avx2", "avx512_vnni"})
    info.write_text("processor\t: 0\nFeatures\t: fp asimd\n")  # aarch64 names them Features
    assert _cpu_flags(info) is None
    assert _cpu_flags(tmp_path / "missing") is None
