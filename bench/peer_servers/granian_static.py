"""The least a Python handler on a native HTTP core does, run by bench/frontend_floor.py in
granian's own venv: granian (Rust, tokio; RSGI) parses HTTP, and a Python coroutine per
request reads the body, views its tensor bytes (the binary extension's tail, or the whole
JSON body) and answers a fixed KServe v2 body. No model, no batching: what is left is the
per-request price of calling Python from a native server.

    granian --interface rsgi --workers 1 --runtime-threads 1 --loop uvloop granian_static:app
"""

from __future__ import annotations

from typing import Any

import numpy as np

BODY = (
    b'{"model_name":"floor","outputs":[{"name":"y","datatype":"FP32","shape":[1,1],"data":[0.0]}]}'
)
HEADERS = [("content-type", "application/json")]


async def app(scope: Any, protocol: Any) -> None:
    body = await protocol()
    head = scope.headers.get("inference-header-content-length")
    if head is not None:  # the binary extension: a JSON header, then the raw tensor
        np.frombuffer(body, dtype=np.float32, offset=int(head))
    protocol.response_bytes(200, HEADERS, BODY)
