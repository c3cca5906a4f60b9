"""Native TensorRT runner: builds an engine from ``model.onnx`` once, caches the serialized
engine on disk, and runs it with ``execute_async_v3``.

Import-safe: without ``tensorrt``, a CUDA memory library (``cuda-python`` or ``cupy``) and a
GPU, ``tensorrt_unavailable_reason()`` says what is missing and ``select.build_runner`` uses
onnxruntime instead. The engine cache key covers everything that makes an engine invalid:
the ONNX bytes, the TensorRT version, the GPU name, fp16 and the batch profile.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from inferway.backends.runners.base import TensorSpec
from inferway.backends.runners.dtypes import datatype_from_numpy

try:  # pragma: no cover - only on GPU machines
    import tensorrt as trt
except Exception:  # ImportError, or a broken CUDA install raising at import
    trt = None

__all__ = [
    "TensorRTRunner",
    "engine_cache_key",
    "tensorrt_unavailable_reason",
]

log = logging.getLogger(__name__)


class _CudaPython:
    """Device memory through ``cuda-python``'s runtime bindings."""

    def __init__(self, device_id: int) -> None:
        try:
            from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
        except ImportError:
            from cuda import cudart  # older cuda-python
        self._rt = cudart
        self._device_id = device_id
        self.activate()
        self.device_name = self._call(
            cudart.cudaGetDeviceProperties(device_id), "cudaGetDeviceProperties"
        ).name
        if isinstance(self.device_name, bytes):
            self.device_name = self.device_name.split(b"\0", 1)[0].decode()
        self._stream = self._call(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.stream_handle = int(self._stream)

    def activate(self) -> None:
        """Make the device current for the calling thread (the current device is per thread)."""
        self._call(self._rt.cudaSetDevice(self._device_id), "cudaSetDevice")

    def _call(self, result: Any, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self._rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"{what} failed: {err}")
        return rest[0] if len(rest) == 1 else rest

    def malloc(self, nbytes: int) -> int:
        return int(self._call(self._rt.cudaMalloc(nbytes), "cudaMalloc"))

    def free(self, ptr: int) -> None:
        self._rt.cudaFree(ptr)

    def to_device(self, ptr: int, host: np.ndarray) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._call(
            self._rt.cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes, kind, self._stream),
            "cudaMemcpyAsync(HtoD)",
        )

    def to_host(self, host: np.ndarray, ptr: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._call(
            self._rt.cudaMemcpyAsync(host.ctypes.data, ptr, host.nbytes, kind, self._stream),
            "cudaMemcpyAsync(DtoH)",
        )

    def synchronize(self) -> None:
        self._call(self._rt.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    def close(self) -> None:
        self._rt.cudaStreamDestroy(self._stream)


class _CuPy:
    """Device memory through ``cupy`` (used when ``cuda-python`` is absent)."""

    def __init__(self, device_id: int) -> None:
        import cupy

        self._cp = cupy
        self._device = cupy.cuda.Device(device_id)
        self.activate()
        name = cupy.cuda.runtime.getDeviceProperties(device_id)["name"]
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self.stream_handle = int(self._stream.ptr)
        self._blocks: dict[int, Any] = {}

    def activate(self) -> None:
        self._device.use()

    def malloc(self, nbytes: int) -> int:
        mem = self._cp.cuda.alloc(nbytes)
        self._blocks[int(mem.ptr)] = mem
        return int(mem.ptr)

    def free(self, ptr: int) -> None:
        self._blocks.pop(ptr, None)

    def to_device(self, ptr: int, host: np.ndarray) -> None:
        self._blocks[ptr].copy_from_host_async(host.ctypes.data, host.nbytes, self._stream)

    def to_host(self, host: np.ndarray, ptr: int) -> None:
        self._blocks[ptr].copy_to_host_async(host.ctypes.data, host.nbytes, self._stream)

    def synchronize(self) -> None:
        self._stream.synchronize()

    def close(self) -> None:
        self._blocks.clear()


def _open_device(device_id: int) -> _CudaPython | _CuPy:
    errors = []
    for backend in (_CudaPython, _CuPy):
        try:
            return backend(device_id)
        except Exception as e:
            errors.append(f"{backend.__name__.strip('_')}: {e}")
    raise RuntimeError("no CUDA memory library usable: " + "; ".join(errors))


_probe_lock = threading.Lock()
_probe_result: dict[int, str | None] = {}


def tensorrt_unavailable_reason(device_id: int = 0) -> str | None:
    """``None`` when the native runner can run on ``device_id``; else why not (cached)."""
    with _probe_lock:
        if device_id not in _probe_result:
            if trt is None:
                reason: str | None = "the 'tensorrt' package is not importable"
            else:
                try:
                    dev = _open_device(device_id)
                    dev.close()
                    reason = None
                except Exception as e:
                    reason = f"no usable CUDA device {device_id}: {e}"
            _probe_result[device_id] = reason
        return _probe_result[device_id]


def engine_cache_key(
    onnx_bytes: bytes, *, trt_version: str, gpu_name: str, fp16: bool, max_batch_size: int
) -> str:
    """Hash of everything an engine depends on; a change in any of them means a rebuild."""
    h = hashlib.sha256()
    h.update(onnx_bytes)
    h.update(f"\0trt={trt_version}\0gpu={gpu_name}\0fp16={fp16}\0mbs={max_batch_size}".encode())
    return h.hexdigest()[:24]


def _dims(shape: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


class TensorRTRunner:
    """One TensorRT engine + execution context + CUDA stream. ``run`` is called by one thread
    at a time; device buffers grow to the largest batch seen and are reused."""

    platform = "tensorrt"
    provider = "tensorrt"

    def __init__(
        self,
        path: str | Path,
        *,
        max_batch_size: int = 32,
        fp16: bool = False,
        device_id: int = 0,
        cache_dir: str | Path | None = None,
        workspace_bytes: int = 1 << 30,
        model_bytes: bytes | None = None,
    ) -> None:
        reason = tensorrt_unavailable_reason(device_id)
        if reason is not None:
            raise RuntimeError(f"{path}: native TensorRT unavailable: {reason}")
        self.path = Path(path)
        self.max_batch_size = max_batch_size
        self.fp16 = fp16
        self._cache_dir = cache_dir
        self._model_bytes = model_bytes  # a decrypted model: its engine is never cached on disk
        self._dev = _open_device(device_id)
        self._engine = None
        try:
            self._load(workspace_bytes)
        except BaseException:
            self._dev.close()
            raise
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device ptr, capacity bytes)

    def _load(self, workspace_bytes: int) -> None:
        self._logger = trt.Logger(trt.Logger.WARNING)
        onnx_bytes = self._model_bytes if self._model_bytes is not None else self.path.read_bytes()
        key = engine_cache_key(
            onnx_bytes,
            trt_version=trt.__version__,
            gpu_name=self._dev.device_name,
            fp16=self.fp16,
            max_batch_size=self.max_batch_size,
        )
        cache = Path(self._cache_dir) if self._cache_dir else self.path.parent / ".trt_cache"
        self.engine_path = cache / f"{self.path.stem}-{key}.engine"
        plan, cached = self._load_or_build(onnx_bytes, workspace_bytes)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None and cached:
            log.warning("%s: cached engine unusable; rebuilding", self.engine_path)
            self.engine_path.unlink(missing_ok=True)
            plan, _ = self._load_or_build(onnx_bytes, workspace_bytes)
            self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            raise RuntimeError(f"{self.engine_path}: TensorRT could not deserialize the engine")
        self._context: Any = self._engine.create_execution_context()
        ins, outs = [], []
        self._dtypes: dict[str, np.dtype] = {}
        for i in range(self._engine.num_io_tensors):
            name = self._engine.get_tensor_name(i)
            dtype = np.dtype(trt.nptype(self._engine.get_tensor_dtype(name)))
            self._dtypes[name] = dtype
            spec = TensorSpec(
                name, datatype_from_numpy(dtype), _dims(self._engine.get_tensor_shape(name))
            )
            is_input = self._engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            (ins if is_input else outs).append(spec)
        self.inputs: tuple[TensorSpec, ...] = tuple(ins)
        self.outputs: tuple[TensorSpec, ...] = tuple(outs)

    def _load_or_build(self, onnx_bytes: bytes, workspace_bytes: int) -> tuple[bytes, bool]:
        """The serialized engine, and whether it came from the cache."""
        if self._model_bytes is not None:
            return self._build(onnx_bytes, workspace_bytes), False
        if self.engine_path.is_file():
            log.info("%s: using cached TensorRT engine %s", self.path, self.engine_path)
            return self.engine_path.read_bytes(), True
        plan = self._build(onnx_bytes, workspace_bytes)
        self.engine_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.engine_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(plan)
        tmp.replace(self.engine_path)  # atomic: a concurrent loader never reads half a plan
        return plan, False

    def _build(self, onnx_bytes: bytes, workspace_bytes: int) -> bytes:
        builder = trt.Builder(self._logger)
        network = builder.create_network(0)  # TensorRT 10: networks are always explicit-batch
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse(onnx_bytes, str(self.path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"{self.path}: TensorRT cannot parse the model: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
        if self.fp16:
            config.set_flag(trt.BuilderFlag.FP16)
        if any(
            network.get_layer(i).type == trt.LayerType.QUANTIZE for i in range(network.num_layers)
        ):
            # explicit INT8: Q/DQ pairs in the model (``inferway optimize --int8 --tensorrt``)
            config.set_flag(trt.BuilderFlag.INT8)
        profile = builder.create_optimization_profile()
        dynamic = False
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            shape = _dims(tensor.shape)
            if any(d < 0 for d in shape[1:]):
                raise RuntimeError(
                    f"{self.path}: input {tensor.name!r} has dynamic non-batch dims {shape}; "
                    "the native TensorRT runner profiles only the batch dimension"
                )
            if shape and shape[0] < 0:
                dynamic = True
                rest = shape[1:]
                profile.set_shape(
                    tensor.name,
                    (1, *rest),
                    (self.max_batch_size, *rest),
                    (self.max_batch_size, *rest),
                )
        if dynamic:
            config.add_optimization_profile(profile)
        log.info(
            "%s: building TensorRT engine (fp16=%s); this can take minutes", self.path, self.fp16
        )
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise RuntimeError(f"{self.path}: TensorRT engine build failed (see TensorRT log)")
        return bytes(plan)

    def _buffer(self, name: str, nbytes: int) -> int:
        ptr, capacity = self._buffers.get(name, (0, 0))
        if nbytes > capacity:
            if ptr:
                self._dev.free(ptr)
            capacity = max(nbytes, 256)
            ptr = self._dev.malloc(capacity)
            self._buffers[name] = (ptr, capacity)
        return ptr

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Copy inputs in, run the engine on this runner's stream, copy outputs out."""
        self._dev.activate()
        names = {s.name for s in self.inputs}
        if set(inputs) != names:
            raise ValueError(
                f"{self.path}: inputs must be exactly {sorted(names)}, got {sorted(inputs)}"
            )
        staged = []  # host copies stay referenced until the stream is synchronized
        for spec in self.inputs:
            host = np.ascontiguousarray(inputs[spec.name], dtype=self._dtypes[spec.name])
            staged.append(host)
            if not self._context.set_input_shape(spec.name, host.shape):
                raise ValueError(
                    f"{self.path}: input {spec.name!r} shape {host.shape} is outside the engine "
                    f"profile (model shape {spec.shape}, max batch {self.max_batch_size})"
                )
            ptr = self._buffer(spec.name, host.nbytes)
            self._dev.to_device(ptr, host)
            self._context.set_tensor_address(spec.name, ptr)
        results: dict[str, np.ndarray] = {}
        for spec in self.outputs:
            shape = _dims(self._context.get_tensor_shape(spec.name))
            host = np.empty(shape, dtype=self._dtypes[spec.name])
            ptr = self._buffer(spec.name, host.nbytes)
            self._context.set_tensor_address(spec.name, ptr)
            results[spec.name] = host
        if not self._context.execute_async_v3(self._dev.stream_handle):
            raise RuntimeError(f"{self.path}: TensorRT execution failed")
        for spec in self.outputs:
            self._dev.to_host(results[spec.name], self._buffers[spec.name][0])
        self._dev.synchronize()
        del staged
        return results

    def close(self) -> None:
        """Free device buffers and the stream; the engine goes with the last reference."""
        if self._engine is None:
            return
        self._dev.activate()
        for ptr, _ in self._buffers.values():
            self._dev.free(ptr)
        self._buffers.clear()
        self._context = None
        self._engine = None
        self._dev.close()

    def __repr__(self) -> str:
        return f"TensorRTRunner({str(self.path)!r}, fp16={self.fp16})"
