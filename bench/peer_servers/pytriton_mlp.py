"""Triton (through PyTriton) serving the benchmark's ONNX model, run by bench/peers.py inside
PyTriton's own venv: Triton's HTTP/gRPC front end and dynamic batcher, the model's Python
callable running ONNX Runtime on the CPU, KServe v2 at ``/v2/models/mlp/infer``.

Env: PEER_MODEL, PEER_HTTP_PORT, PEER_GRPC_PORT, PEER_METRICS_PORT, PEER_MAX_BATCH,
PEER_MAX_WAIT_MS, PEER_ORT_INTRA and PEER_ORT_INTER (ONNX Runtime's threads; unset or 0: its
default).
"""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

options = ort.SessionOptions()
if int(os.environ.get("PEER_ORT_INTRA") or "0"):
    options.intra_op_num_threads = int(os.environ["PEER_ORT_INTRA"])
if int(os.environ.get("PEER_ORT_INTER") or "0"):
    options.inter_op_num_threads = int(os.environ["PEER_ORT_INTER"])
session = ort.InferenceSession(
    os.environ["PEER_MODEL"], options, providers=["CPUExecutionProvider"]
)
width = session.get_inputs()[0].shape[1]
classes = session.get_outputs()[0].shape[1]


@batch
def infer(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": session.run(None, {"x": x})[0]}


config = TritonConfig(
    http_address="127.0.0.1",
    grpc_address="127.0.0.1",
    http_port=int(os.environ["PEER_HTTP_PORT"]),
    grpc_port=int(os.environ["PEER_GRPC_PORT"]),
    metrics_port=int(os.environ["PEER_METRICS_PORT"]),
)
# Loopback benchmark: no endpoint behind PyTriton's access token, so Triton's own tools
# (perf_analyzer reads the statistics extension) work as they do against a plain Triton.
with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
    triton.bind(
        model_name="mlp",
        infer_func=infer,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(width,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(classes,))],
        config=ModelConfig(
            max_batch_size=int(os.environ.get("PEER_MAX_BATCH", "64")),
            batcher=DynamicBatcher(
                max_queue_delay_microseconds=1000 * int(os.environ.get("PEER_MAX_WAIT_MS", "5"))
            ),
        ),
        strict=True,
    )
    triton.serve()
