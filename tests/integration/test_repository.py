"""ModelRepository over real files, real onnxruntime and the real BatchExecutor: loading,
version lookup and hot reload (add, remove, replace, refuse) without dropping requests."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from inferway.backends.models.config import ModelConfig
from inferway.backends.models.repository import ModelRepository
from inferway.backends.models.served_model import ModelNotFoundError, RepositoryEvent
from inferway.backends.runners.select import build_runner
from inferway.devtools.demo_models import build_mlp, mlp_reference, write_demo_repository

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)
CONFIG = {
    "provider": "cpu",
    "intra_op_threads": 1,
    "batching": {"mode": "fixed", "max_batch_size": 4, "max_queue_delay_s": 0.001},
}


def _x(rows: int = 2) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, SIZES[0]), dtype=np.float32)


def _expect(x: np.ndarray, version: int) -> np.ndarray:
    return mlp_reference(x, SIZES, seed=version - 1)  # write_demo_repository: seed = version - 1


async def _poll_until(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.05)


class GatedRunner:
    """A real OnnxRunner whose ``run`` waits on a gate, so a test can hold requests in flight."""

    def __init__(self, path: Path, config: ModelConfig, gate: threading.Event) -> None:
        self._inner = build_runner(path, config)
        self.inputs, self.outputs = self._inner.inputs, self._inner.outputs
        self.provider = self._inner.provider
        self.gate = gate
        self.running = threading.Event()
        self.closed = False

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.running.set()
        assert self.gate.wait(10), "gate never opened"
        return self._inner.run(inputs)

    def close(self) -> None:
        self.closed = True
        self._inner.close()


@pytest.fixture
async def repo(tmp_path):
    write_demo_repository(tmp_path, "demo", (1,), sizes=SIZES, config=CONFIG)
    events: list[RepositoryEvent] = []
    repository = ModelRepository(tmp_path, on_change=events.append)
    repository.events = events  # type: ignore[attr-defined]
    await repository.start(watch=False)
    yield repository
    await repository.stop()


async def test_start_loads_warms_up_and_serves(repo: ModelRepository) -> None:
    assert repo.ready
    served = repo.get("demo")
    assert (served.name, served.version) == ("demo", "1")
    assert served.platform == "onnxruntime"
    assert served.provider == "CPUExecutionProvider"
    assert served.load_seconds > 0
    assert [(s.name, s.datatype, s.shape) for s in served.inputs] == [("x", "FP32", (-1, 8))]
    x = _x(3)
    out = await served.executor.infer({"x": x})
    np.testing.assert_allclose(out["y"], _expect(x, 1), rtol=1e-4, atol=1e-5)
    assert [e.kind for e in repo.events] == ["loaded"]  # type: ignore[attr-defined]


async def test_unknown_model_and_version_errors_list_what_exists(repo: ModelRepository) -> None:
    with pytest.raises(ModelNotFoundError, match="model 'nope' not found; available: demo"):
        repo.get("nope")
    with pytest.raises(ModelNotFoundError, match="model 'demo' has no version 7; available: 1"):
        repo.get("demo", "7")


async def test_new_version_becomes_latest_and_old_keeps_serving(repo, tmp_path) -> None:
    v1 = repo.get("demo")
    x = _x(2)
    in_flight = [asyncio.create_task(v1.executor.infer({"x": x})) for _ in range(8)]
    write_demo_repository(tmp_path, "demo", (2,), sizes=SIZES, config=CONFIG)
    events = await repo.poll_once()
    assert [(e.kind, e.version) for e in events] == [("loaded", "2")]
    assert repo.get("demo").version == "2"
    assert repo.get("demo", "1") is v1
    for result in await asyncio.gather(*in_flight):
        np.testing.assert_allclose(result["y"], _expect(x, 1), rtol=1e-4, atol=1e-5)
    out = await repo.get("demo").executor.infer({"x": x})
    np.testing.assert_allclose(out["y"], _expect(x, 2), rtol=1e-4, atol=1e-5)
    assert [m.version for m in repo.models()] == ["1", "2"]
    assert await repo.poll_once() == []  # nothing changed: nothing reloaded


async def test_removed_version_drains_in_flight_requests_then_unloads(tmp_path) -> None:
    write_demo_repository(tmp_path, "demo", (1, 2), sizes=SIZES, config=CONFIG)
    gate = threading.Event()
    gate.set()  # open during warm-up
    runners: list[GatedRunner] = []

    def factory(path: Path, config: ModelConfig) -> GatedRunner:
        runners.append(GatedRunner(path, config, gate))
        return runners[-1]

    repo = ModelRepository(tmp_path, runner_factory=factory)
    await repo.start(watch=False)
    try:
        v1 = repo.get("demo", "1")
        v1_runner = next(r for r in runners if r._inner.path.parent.name == "1")
        gate.clear()
        v1_runner.running.clear()
        x = _x(1)
        in_flight = [asyncio.create_task(v1.executor.infer({"x": x})) for _ in range(3)]
        await asyncio.to_thread(v1_runner.running.wait, 5)
        shutil.rmtree(tmp_path / "demo" / "1")
        poll = asyncio.create_task(repo.poll_once())
        await _poll_until(lambda: [m.version for m in repo.models()] == ["2"])
        assert not poll.done()  # still draining the held requests
        assert not v1_runner.closed
        gate.set()
        events = await poll
        assert [(e.kind, e.version) for e in events] == [("unloaded", "1")]
        for result in await asyncio.gather(*in_flight):
            np.testing.assert_allclose(result["y"], _expect(x, 1), rtol=1e-4, atol=1e-5)
        assert v1_runner.closed
        with pytest.raises(ModelNotFoundError, match="no version 1; available: 2"):
            repo.get("demo", "1")
    finally:
        gate.set()
        await repo.stop()


async def test_corrupt_model_is_refused_and_the_old_version_keeps_serving(repo, tmp_path) -> None:
    bad = tmp_path / "demo" / "2" / "model.onnx"
    bad.parent.mkdir()
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf model")
    events = await repo.poll_once()
    assert [(e.kind, e.version) for e in events] == [("refused", "2")]
    assert str(bad) in repo.errors
    assert "onnxruntime could not load" in repo.errors[str(bad)]
    assert repo.get("demo").version == "1"
    assert await repo.poll_once() == []  # the same bad bytes are not retried every poll
    build_mlp(bad, SIZES, seed=1)  # fixed
    events = await repo.poll_once()
    assert [(e.kind, e.version) for e in events] == [("loaded", "2")]
    assert repo.errors == {}
    assert repo.get("demo").version == "2"


async def test_bad_config_is_refused_with_file_and_field(repo, tmp_path) -> None:
    write_demo_repository(tmp_path, "demo", (2,), sizes=SIZES, config=CONFIG)
    cfg = tmp_path / "demo" / "2" / "config.yaml"
    cfg.write_text("batching:\n  max_batch_size: 4\n  turbo: true\n")
    events = await repo.poll_once()
    assert [(e.kind, e.version) for e in events] == [("refused", "2")]
    assert repo.errors[str(cfg)] == f"{cfg}:3: batching.turbo: unknown setting"
    assert repo.get("demo").version == "1"


async def test_model_replaced_in_place_is_reloaded_and_old_executor_drained(repo, tmp_path) -> None:
    old = repo.get("demo", "1")
    x = _x(2)
    tmp = tmp_path / "new.onnx"
    build_mlp(tmp, SIZES, seed=5)
    tmp.replace(tmp_path / "demo" / "1" / "model.onnx")
    events = await repo.poll_once()
    assert [(e.kind, e.version) for e in events] == [("reloaded", "1")]
    new = repo.get("demo", "1")
    assert new is not old
    assert old.executor.closed
    out = await new.executor.infer({"x": x})
    np.testing.assert_allclose(out["y"], mlp_reference(x, SIZES, seed=5), rtol=1e-4, atol=1e-5)


async def test_unloadable_replacement_keeps_the_old_model(repo, tmp_path) -> None:
    old = repo.get("demo", "1")
    (tmp_path / "demo" / "1" / "model.onnx").write_bytes(b"truncated")
    events = await repo.poll_once()
    assert [e.kind for e in events] == ["refused"]
    assert repo.get("demo", "1") is old
    out = await old.executor.infer({"x": _x(1)})
    np.testing.assert_allclose(out["y"], _expect(_x(1), 1), rtol=1e-4, atol=1e-5)


async def test_watching_picks_up_a_new_version(tmp_path) -> None:
    write_demo_repository(tmp_path, "demo", (1,), sizes=SIZES, config=CONFIG)
    repo = ModelRepository(tmp_path, watch_debounce_ms=50)
    await repo.start(watch=True)
    try:
        staging = tmp_path / ".staging"
        write_demo_repository(staging, "demo", (2,), sizes=SIZES, config=CONFIG)
        (staging / "demo" / "2").rename(tmp_path / "demo" / "2")  # appears whole
        await _poll_until(lambda: repo.get("demo").version == "2")
        x = _x(2)
        out = await repo.get("demo").executor.infer({"x": x})
        np.testing.assert_allclose(out["y"], _expect(x, 2), rtol=1e-4, atol=1e-5)
    finally:
        await repo.stop()
    assert not repo.ready
    assert repo.models() == []


async def test_model_level_config_applies_to_all_versions_and_reloads_them(tmp_path) -> None:
    write_demo_repository(tmp_path, "demo", (1, 2), sizes=SIZES)
    shared = tmp_path / "demo" / "config.yaml"
    shared.write_text("provider: cpu\nintra_op_threads: 1\nbatching:\n  max_batch_size: 2\n")
    repo = ModelRepository(tmp_path)
    await repo.start(watch=False)
    try:
        assert [m.config.batching.max_batch_size for m in repo.models()] == [2, 2]
        shared.write_text("provider: cpu\nintra_op_threads: 1\nbatching:\n  max_batch_size: 3\n")
        events = await repo.poll_once()
        assert sorted((e.kind, e.version) for e in events) == [("reloaded", "1"), ("reloaded", "2")]
        assert [m.config.batching.max_batch_size for m in repo.models()] == [3, 3]
    finally:
        await repo.stop()
