"""Mosec serving the benchmark's ONNX model, run by bench/peers.py inside Mosec's own venv.

KServe v2 JSON in and out (the same request bytes every server of the benchmark gets), ONNX
Runtime on the CPU, Mosec's dynamic batching (``max_batch_size``, ``max_wait_time``) with one
worker process: Mosec's documented set-up for a single CPU model. Mosec serves ``POST
/inference``. Env: PEER_MODEL, PEER_MAX_BATCH, PEER_MAX_WAIT_MS, PEER_ORT_INTRA and
PEER_ORT_INTER (ONNX Runtime's threads; unset or 0: ONNX Runtime's default); Mosec's own flags
(--port, --address) on the command line.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnxruntime as ort
from mosec import Server, Worker

MODEL = os.environ["PEER_MODEL"]
MAX_BATCH = int(os.environ.get("PEER_MAX_BATCH", "64"))
MAX_WAIT_MS = int(os.environ.get("PEER_MAX_WAIT_MS", "5"))
ORT_INTRA = int(os.environ.get("PEER_ORT_INTRA") or "0")
ORT_INTER = int(os.environ.get("PEER_ORT_INTER") or "0")


class Mlp(Worker):
    def __init__(self) -> None:
        super().__init__()
        options = ort.SessionOptions()
        if ORT_INTRA:
            options.intra_op_num_threads = ORT_INTRA
        if ORT_INTER:
            options.inter_op_num_threads = ORT_INTER
        self.session = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])

    def deserialize(self, data: bytes) -> np.ndarray:
        tensor = json.loads(data)["inputs"][0]
        return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])

    def forward(self, data: list[np.ndarray]) -> list[np.ndarray]:
        rows = [x.shape[0] for x in data]
        out = self.session.run(None, {"x": np.concatenate(data)})[0]
        return np.split(out, np.cumsum(rows)[:-1])

    def serialize(self, data: np.ndarray) -> bytes:
        tensor = {"name": "y", "datatype": "FP32", "shape": list(data.shape)}
        tensor["data"] = data.ravel().tolist()
        return json.dumps({"outputs": [tensor]}).encode()


if __name__ == "__main__":
    server = Server()
    server.append_worker(Mlp, num=1, max_batch_size=MAX_BATCH, max_wait_time=MAX_WAIT_MS)
    sys.exit(server.run())
