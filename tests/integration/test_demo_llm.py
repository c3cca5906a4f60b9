"""``inferway demo --llm`` as a person runs it (``make demo DEMO_ARGS=--llm``): with the real
engine installed, one streamed request through real Envoy to llama.cpp, its TTFT, the tokens
the gateway counted and their cost at the demo policy's prices; without the engine, the
command that installs it, and success (``make demo`` never fails for the LLM scene)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from inferway.devtools.demo_llm import PRICE_INPUT_PER_1M, PRICE_OUTPUT_PER_1M
from tests.llm_engine import require_llm_engine

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "COLUMNS": "200"}


def test_the_llm_scene_streams_through_the_gateway_and_shows_ttft_tokens_and_cost() -> None:
    require_llm_engine()
    result = subprocess.run(
        [sys.executable, "-m", "inferway.cli.main", "demo", "--llm"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "✓ llama.cpp engine (llama-cpp-python) on 127.0.0.1:" in out
    assert "✓ gateway ready: openai route 'chat'" in out
    gateway_ttft = re.search(r"TTFT\s+│\s+([\d.]+) ms\s+│ gateway", out)
    assert gateway_ttft is not None and float(gateway_ttft.group(1)) > 0, out
    tokens = {
        kind: int(m.group(1))
        for kind in ("prompt", "completion")
        if (m := re.search(rf"{kind} tokens\s+│\s+(\d+)\s+│", out))
    }
    assert tokens["completion"] == 24, out  # max_tokens: the engine streams one token a chunk
    assert tokens["prompt"] > 0, out
    cost = re.search(r"cost\s+│\s+\$([\d.]+)\s+│", out)
    expected = tokens["prompt"] * PRICE_INPUT_PER_1M + tokens["completion"] * PRICE_OUTPUT_PER_1M
    assert cost is not None and float(cost.group(1)) == pytest.approx(expected / 1e6), out


def test_without_the_engine_the_scene_says_how_to_install_it_and_succeeds() -> None:
    # sys.modules[name] = None is Python's own "this module is absent" (find_spec answers None)
    blocked = (
        "import runpy, sys\n"
        "sys.modules['llama_cpp'] = None\n"
        "sys.argv = ['inferway', 'demo', '--llm']\n"
        "runpy.run_module('inferway.cli.main', run_name='__main__')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", blocked],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=ENV,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "LLM scene skipped" in out and "llama_cpp missing" in out, out
    assert "python scripts/build_llm_engine.py" in out, out
