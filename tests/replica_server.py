"""A tiny replica command for the replica manager's tests: an aiohttp server on ``--port``
answering ``{"backend": "<port>", "device": "<CUDA_VISIBLE_DEVICES>"}`` after ``--delay``
seconds, with a readiness path that answers 200 (or never, with ``--never-ready``).

    python -m tests.replica_server --port {port} [--host 127.0.0.1] [--delay 0.05] [--never-ready]

SIGTERM is aiohttp's graceful exit: the listening socket closes and requests in flight are
answered before the process ends, as a real model server does.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--never-ready", action="store_true")
    args = parser.parse_args()
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "")

    async def ready(_request: web.Request) -> web.Response:
        return web.Response(status=503 if args.never_ready else 200, text="ready")

    async def answer(_request: web.Request) -> web.Response:
        if args.delay:
            await asyncio.sleep(args.delay)
        return web.json_response({"backend": str(args.port), "device": device})

    app = web.Application()
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_route("*", "/{tail:.*}", answer)
    print(f"replica serving on {args.host}:{args.port}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, shutdown_timeout=10)


if __name__ == "__main__":
    main()
