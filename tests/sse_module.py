"""The pure core of Envoy's native SSE reader (``inferway/xds/sse_module/sse_core.c``),
compiled alone with the host's C compiler and called through ctypes: the same reader the
Envoy module runs, without Envoy (the module in real Envoy: tests/integration)."""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from inferway.xds.sse_module_build import module_sources


@dataclass
class Read:
    passed: bytes
    """What the client gets: each chunk as the reader left it."""
    chunks: int
    first_us: int
    last_us: int
    prompt: str
    completion: str
    model: str
    done: bool


class SseCore:
    def __init__(self, compiler: str, folder: Path) -> None:
        target = folder / "libsse_core_test.so"
        source = module_sources() / "sse_core.c"
        command = [compiler, "-O2", "-std=c11", "-fPIC", "-shared", "-Wall", "-Werror"]
        subprocess.run([*command, "-o", str(target), str(source)], check=True)
        lib = ctypes.CDLL(str(target))
        lib.inferway_sse_new.restype = ctypes.c_void_p
        lib.inferway_sse_new.argtypes = [ctypes.c_int]
        lib.inferway_sse_free.argtypes = [ctypes.c_void_p]
        lib.inferway_sse_feed.restype = ctypes.c_int
        lib.inferway_sse_feed.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int64,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_size_t),
        ]
        for name in ("chunks", "first_us", "last_us"):
            getattr(lib, f"inferway_sse_{name}").restype = ctypes.c_int64
            getattr(lib, f"inferway_sse_{name}").argtypes = [ctypes.c_void_p]
        for name in ("prompt", "completion", "model"):
            getattr(lib, f"inferway_sse_{name}").restype = ctypes.c_char_p
            getattr(lib, f"inferway_sse_{name}").argtypes = [ctypes.c_void_p]
        lib.inferway_sse_done.argtypes = [ctypes.c_void_p]
        self.lib = lib

    def read(self, parts: Sequence[bytes], *, drop: bool, start_us: int = 1_000_000) -> Read:
        """``parts``: the answer's body as Envoy hands it over; the i-th arrives at
        ``start_us + i + 1``. An empty list is an answer whose end came with its headers."""
        lib = self.lib
        reader = lib.inferway_sse_new(int(drop))
        assert reader
        try:
            passed = bytearray()
            out, out_len = ctypes.c_void_p(), ctypes.c_size_t()
            for i, part in enumerate(parts):
                end = int(i == len(parts) - 1)
                now = start_us + i + 1
                replaced = lib.inferway_sse_feed(
                    reader, part, len(part), end, now, ctypes.byref(out), ctypes.byref(out_len)
                )
                assert replaced in (0, 1)
                if replaced:
                    passed += (
                        ctypes.string_at(out.value or 0, out_len.value) if out_len.value else b""
                    )
                else:
                    passed += part
            return Read(
                bytes(passed),
                lib.inferway_sse_chunks(reader),
                lib.inferway_sse_first_us(reader),
                lib.inferway_sse_last_us(reader),
                lib.inferway_sse_prompt(reader).decode(),
                lib.inferway_sse_completion(reader).decode(),
                lib.inferway_sse_model(reader).decode(),
                bool(lib.inferway_sse_done(reader)),
            )
        finally:
            lib.inferway_sse_free(reader)
