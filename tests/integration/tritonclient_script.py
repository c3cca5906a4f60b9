"""Triton's own client library driving a server, run in a virtual environment of its own.

tritonclient pins protobuf below 7 and inferway's environment has protobuf 7, so the test runs
this file with that environment's Python (it imports nothing of inferway). It makes the
calls Triton's tools make (repository index, load, unload, model config, statistics, a few
inferences) over one protocol and prints what came back as one JSON object on stdout, plus
the field layout of tritonclient's messages so the test can compare inferway's proto to it.

Usage: python tritonclient_script.py {http|grpc} HOST:PORT MODEL FEATURES REQUESTS
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

PROTO_MESSAGES = (
    "ModelConfigRequest",
    "ModelConfigResponse",
    "ModelStatisticsRequest",
    "ModelStatisticsResponse",
    "ModelStatistics",
    "StatisticDuration",
    "InferStatistics",
    "InferBatchStatistics",
    "InferResponseStatistics",
    "MemoryUsage",
    "ModelRepositoryParameter",
    "RepositoryIndexRequest",
    "RepositoryIndexResponse",
    "RepositoryModelLoadRequest",
    "RepositoryModelLoadResponse",
    "RepositoryModelUnloadRequest",
    "RepositoryModelUnloadResponse",
    "ModelConfig",
    "ModelInput",
    "ModelOutput",
    "ModelVersionPolicy",
    "ModelDynamicBatching",
    "ModelInstanceGroup",
    "ModelTransactionPolicy",
)


def _type_name(field: Any) -> str:
    return field.message_type.name if field.message_type else ""


def _fields(descriptor: Any) -> dict[str, Any]:
    out = {
        f.name: [f.number, f.type, f.label == f.LABEL_REPEATED, _type_name(f)]
        for f in descriptor.fields
    }
    for nested in descriptor.nested_types:
        out.update({f"{nested.name}.{k}": v for k, v in _fields(nested).items()})
    return out


def proto_layout() -> dict[str, Any]:
    from tritonclient.grpc import model_config_pb2, service_pb2

    layout: dict[str, Any] = {}
    for name in PROTO_MESSAGES:
        for module in (service_pb2, model_config_pb2):
            if name in module.DESCRIPTOR.message_types_by_name:
                layout[name] = _fields(module.DESCRIPTOR.message_types_by_name[name])
    enum = model_config_pb2.DESCRIPTOR.enum_types_by_name["DataType"]
    layout["DataType"] = {v.name: v.number for v in enum.values}
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    layout["rpcs"] = {m.name: [m.input_type.name, m.output_type.name] for m in service.methods}
    return layout


def _error(call: Any) -> str:
    """The message of the InferenceServerException ``call`` raises ("" when it succeeds)."""
    from tritonclient.utils import InferenceServerException

    try:
        call()
    except InferenceServerException as exc:
        return str(exc.message())
    return ""


def _ready(triton: Any, model: str) -> bool:
    """is_model_ready; over gRPC a model not served is NOT_FOUND, which the client raises."""
    from tritonclient.utils import InferenceServerException

    try:
        return bool(triton.is_model_ready(model))
    except InferenceServerException:
        return False


def main(protocol: str, url: str, model: str, features: int, requests: int) -> dict[str, Any]:
    if protocol == "http":
        import tritonclient.http as client
    else:
        import tritonclient.grpc as client
    triton = client.InferenceServerClient(url=url)
    kw: dict[str, Any] = {} if protocol == "http" else {"as_json": True}
    result: dict[str, Any] = {"layout": proto_layout()}
    result["extensions"] = triton.get_server_metadata(**kw)["extensions"]
    result["index"] = triton.get_model_repository_index(**kw)
    result["config"] = triton.get_model_config(model, **kw)
    for i in range(requests):
        x = np.full((1, features), i / max(1, requests), dtype=np.float32)
        tensor = client.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        answer = triton.infer(model, [tensor])
        assert answer.as_numpy(answer.get_response(**kw)["outputs"][0]["name"]) is not None
    result["stats"] = triton.get_inference_statistics(model, **kw)
    result["all_stats"] = triton.get_inference_statistics(**kw)
    triton.unload_model(model)
    result["ready_after_unload"] = _ready(triton, model)
    result["index_after_unload"] = triton.get_model_repository_index(**kw)
    result["config_after_unload"] = _error(lambda: triton.get_model_config(model, **kw))
    triton.load_model(model)
    result["ready_after_load"] = _ready(triton, model)
    result["load_unknown"] = _error(lambda: triton.load_model("no-such-model"))
    result["config_unknown"] = _error(lambda: triton.get_model_config("no-such-model", **kw))
    result["load_with_config"] = _error(lambda: triton.load_model(model, config="{}"))
    return result


if __name__ == "__main__":
    protocol, url, model, features, requests = sys.argv[1:6]
    print(json.dumps(main(protocol, url, model, int(features), int(requests))))
