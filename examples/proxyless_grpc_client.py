"""A proxyless gRPC client of the gateway: grpcio reads xDS from ``inferway run`` and calls
the backends' Open Inference Protocol service directly (see proxyless-grpc.yaml).

    python examples/proxyless_grpc_client.py --target models --calls 100

It writes the xDS bootstrap grpcio needs (the gateway's xDS address and this client's node)
to a temporary file, points ``GRPC_XDS_BOOTSTRAP`` at it, and prints how many calls each
model version answered.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter

import grpc

from inferway.backends.protocol import pb2, pb2_grpc


def write_bootstrap(xds_address: str, node_id: str) -> str:
    """grpcio's bootstrap: one xDS server (plaintext on loopback) and the node it sends;
    grpcio adds its user agent and client features, by which the gateway tells it apart
    from an Envoy."""
    bootstrap = {
        "xds_servers": [
            {
                "server_uri": xds_address,
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": {"id": node_id, "cluster": "proxyless", "locality": {}},
    }
    handle, path = tempfile.mkstemp(prefix="grpc-xds-bootstrap-", suffix=".json")
    with os.fdopen(handle, "w") as out:
        json.dump(bootstrap, out)
    return path


def add_request(model: str) -> pb2.ModelInferRequest:
    request = pb2.ModelInferRequest(model_name=model)
    for name in ("a", "b"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    return request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xds", default="127.0.0.1:18000", help="the gateway's xDS address")
    parser.add_argument("--target", default="models", help="a grpc_targets name")
    parser.add_argument("--model", default="add")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--node-id", default=f"proxyless-{os.getpid()}")
    args = parser.parse_args()
    os.environ["GRPC_XDS_BOOTSTRAP"] = write_bootstrap(args.xds, args.node_id)
    answered: Counter[str] = Counter()
    with grpc.insecure_channel(f"xds:///{args.target}") as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(args.calls):
            try:
                reply = stub.ModelInfer(add_request(args.model), timeout=10)
            except grpc.RpcError as error:
                answered[f"error {error.code().name}"] += 1
            else:
                answered[f"version {reply.model_version}"] += 1
    os.unlink(os.environ["GRPC_XDS_BOOTSTRAP"])
    for outcome, count in sorted(answered.items()):
        print(f"{outcome}: {count}")


if __name__ == "__main__":
    main()
