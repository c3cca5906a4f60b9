"""aiohttp's share of a request, for bench/frontend_floor.py: a handler that reads the body and
answers a fixed KServe v2 body, no model (the project's own venv; uvloop runs the loop).

    python aiohttp_static.py PORT
"""

from __future__ import annotations

import sys

import uvloop
from aiohttp import web

BODY = (
    b'{"model_name":"floor","outputs":[{"name":"y","datatype":"FP32","shape":[1,1],"data":[0.0]}]}'
)


async def infer(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=BODY, content_type="application/json")


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: aiohttp_static.py PORT")
    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    loop = uvloop.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, backlog=4096, loop=loop)


if __name__ == "__main__":
    main()
