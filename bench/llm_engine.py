"""The test LLM engine's own speed on this CPU (docs/llm.md, "The test engine"): how long the
tiny model takes to write, the server to start, a prompt to be read and tokens to come out,
direct to llama-cpp-python's server (no gateway), one request at a time.

These are the floor the gateway's LLM benchmarks stand on: the engine, not the gateway, is
what limits tokens/s there.

    .venv/bin/python bench/llm_engine.py --starts 5 --tokens 500
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _common import environment, print_table, summarize, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests.* helpers

from inferway.devtools.tiny_gguf import count_tokens, write_tiny_gguf
from tests.llm_engine import LLMEngine, start_llm_engine


def _completion(client: httpx.Client, engine: LLMEngine, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    response = client.post(f"{engine.url}/v1/completions", json={"model": "tiny", **body})
    response.raise_for_status()
    return time.perf_counter() - started


def _stream(client: httpx.Client, engine: LLMEngine, tokens: int) -> tuple[float, float, int]:
    """TTFT (first content chunk), total seconds, content chunks of one streamed chat."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": tokens,
        "stream": True,
    }
    started = time.perf_counter()
    first, chunks = 0.0, 0
    with client.stream("POST", f"{engine.url}/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            if json.loads(line[6:])["choices"][0]["delta"].get("content"):
                chunks += 1
                first = first or time.perf_counter() - started
    return first, time.perf_counter() - started, chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5, help="engine starts timed")
    parser.add_argument("--tokens", type=int, default=500, help="completion tokens per request")
    parser.add_argument("--runs", type=int, default=3, help="requests per figure")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="llm-bench-") as scratch:
        model = Path(scratch) / "tiny.gguf"
        started = time.perf_counter()
        write_tiny_gguf(model)
        write_s = time.perf_counter() - started
        starts = []
        for _ in range(args.starts):
            with start_llm_engine(model, verbose=False) as engine:
                starts.append(engine.started_in)
        rows: list[list[Any]] = []
        results: dict[str, Any] = {
            "model_bytes": model.stat().st_size,
            "model_write_s": write_s,
            "engine_start": summarize(starts),
        }
        with (
            start_llm_engine(model, n_ctx=4096, verbose=False) as engine,
            httpx.Client(trust_env=False, timeout=120) as client,
        ):
            for label, temperature in (("greedy", 0.0), ("sampled (temperature 0.8)", 0.8)):
                body = {"prompt": "Once upon a time", "max_tokens": args.tokens}
                body["temperature"] = temperature
                seconds = [_completion(client, engine, body) for _ in range(args.runs)]
                rate = args.tokens / min(seconds)
                results[f"completion_tokens_per_s_{temperature}"] = rate
                rows.append([f"completion, {label}", f"{rate:.0f} tokens/s", ""])
            streams = [_stream(client, engine, args.tokens) for _ in range(args.runs)]
            ttft = min(s[0] for s in streams)
            rate = max(s[2] / s[1] for s in streams)
            results |= {"stream_ttft_s": ttft, "stream_tokens_per_s": rate}
            rows.append(["streamed chat", f"{rate:.0f} tokens/s", f"TTFT {ttft * 1000:.1f} ms"])
            prompt = "a" * 4000
            body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
            # a different prompt each time: the server reuses the previous prompt's prefix
            seconds = [
                _completion(client, engine, body | {"prompt": f"{i}{prompt}"})
                for i in range(args.runs)
            ]
            rate = count_tokens(prompt) / min(seconds)
            results["prompt_tokens_per_s_4k"] = rate
            rows.append(["prompt of 4002 tokens read", f"{rate:.0f} tokens/s", ""])
            big = "x" * (1 << 20)
            started = time.perf_counter()
            refused = client.post(
                f"{engine.url}/v1/completions",
                json={"model": "tiny", "prompt": big, "max_tokens": 8},
            )
            refuse_s = time.perf_counter() - started
            assert refused.status_code == 400, refused.text[:200]
            results["refuse_1mib_s"] = refuse_s
            rows.append(["1 MiB prompt refused (400)", f"{refuse_s * 1000:.0f} ms", ""])
    rows[:0] = [
        ["model written", f"{write_s * 1000:.0f} ms", f"{results['model_bytes']} bytes"],
        [
            "engine start to /v1/models",
            f"{results['engine_start']['p50_ms']:.0f} ms p50",
            f"max {max(starts) * 1000:.0f} ms",
        ],
    ]
    print_table("test LLM engine (llama-cpp-python, tiny model)", ["what", "figure", ""], rows)
    write_results("llm_engine", {"environment": environment(), "results": results})


if __name__ == "__main__":
    main()
