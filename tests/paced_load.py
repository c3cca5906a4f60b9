"""Paced GET load from a process of its own, for tests that judge latency: the test process
hosts a control plane and, late in a full run, thousands of tests' objects, so a garbage
collection or a busy event loop there would add its pause to every request in flight and be
read as the proxy's latency. Here the client is alone.

    python -m tests.paced_load --rate 100 --seconds 3 URL [URL ...]

Open loop: request i is sent at ``begin + i / rate`` to ``URLS[i % len(URLS)]`` and timed from
its send, so a slow answer never delays the next request. Prints ``{"begin": t}`` (the
``time.monotonic()`` of the first send, one clock for every process on the machine) as soon
as it starts, then one JSON line: a list of ``[url index, sent, latency, status, body]``,
status 0 and body "" for a request that got no answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import aiohttp

__all__ = ["Reply", "parse_output"]

Reply = tuple[int, float, float, int, str]
"""url index, sent (monotonic s), latency (s), HTTP status (0: none), body."""


async def _run(urls: list[str], rate: float, seconds: float, timeout: float) -> list[Reply]:
    replies: list[Reply] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:

        async def one(index: int) -> None:
            start = time.monotonic()
            status, body = 0, ""
            try:
                async with session.get(urls[index]) as response:
                    body = (await response.read()).decode(errors="replace")
                    status = response.status
            except (aiohttp.ClientError, TimeoutError):
                pass
            replies.append((index, start, time.monotonic() - start, status, body))

        tasks = []
        begin = time.monotonic()
        print(json.dumps({"begin": begin}), flush=True)
        for i in range(int(seconds * rate)):
            delay = begin + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i % len(urls))))
        await asyncio.gather(*tasks)
    return replies


def parse_output(lines: list[str]) -> tuple[float, list[Reply]]:
    """(begin, replies) from the command's two output lines."""
    begin = float(json.loads(lines[0])["begin"])
    return begin, [tuple(row) for row in json.loads(lines[1])]  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--timeout", type=float, default=5.0, help="per request, seconds")
    args = parser.parse_args()
    replies = asyncio.run(_run(args.urls, args.rate, args.seconds, args.timeout))
    sys.stdout.write(json.dumps(replies) + "\n")


if __name__ == "__main__":
    main()
