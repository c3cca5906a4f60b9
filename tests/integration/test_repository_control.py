"""Loading and unloading models on request (Triton's repository extension) over real files,
real onnxruntime and the real BatchExecutor: an unload holds through file changes, a failed
load says why, and the index says what each version's state is and why."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from inferway.backends.models.index import IndexEntry, repository_index
from inferway.backends.models.repository import ModelRepository
from inferway.backends.models.served_model import ModelLoadError, ModelNotFoundError
from inferway.devtools.demo_models import write_demo_repository

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)
CONFIG = {"provider": "cpu", "intra_op_threads": 1, "batching": {"mode": "off"}}


@pytest.fixture
async def repo(tmp_path: Path) -> AsyncIterator[ModelRepository]:
    write_demo_repository(tmp_path / "models", versions=(1,), sizes=SIZES, config=CONFIG)
    write_demo_repository(tmp_path / "models", "other", versions=(1,), sizes=SIZES, config=CONFIG)
    repository = ModelRepository(tmp_path / "models")
    await repository.start(watch=False)  # polls are driven by the test
    try:
        yield repository
    finally:
        await repository.stop()


async def test_unload_holds_through_file_changes_until_load(
    repo: ModelRepository, tmp_path: Path
) -> None:
    await repo.unload_model("demo")
    with pytest.raises(ModelNotFoundError):
        repo.get("demo")
    assert repo.ready  # an unloaded model does not make the server unready
    write_demo_repository(tmp_path / "models", versions=(2,), sizes=SIZES, config=CONFIG)
    await repo.poll_once()  # a new version on disk: still held out
    assert [m.name for m in repo.models()] == ["other"]
    assert repository_index(repo) == [
        IndexEntry("demo", "1", "UNAVAILABLE", "unloaded"),
        IndexEntry("demo", "2", "UNAVAILABLE", "unloaded"),
        IndexEntry("other", "1", "READY"),
    ]
    await repo.load_model("demo")
    assert [(m.name, m.version) for m in repo.models()] == [
        ("demo", "1"),
        ("demo", "2"),
        ("other", "1"),
    ]
    x = np.zeros((1, SIZES[0]), dtype=np.float32)
    assert (await repo.get("demo").executor.infer({"x": x}))["y"].shape == (1, 4)
    assert repository_index(repo, ready_only=True) == [
        IndexEntry("demo", "1", "READY"),
        IndexEntry("demo", "2", "READY"),
        IndexEntry("other", "1", "READY"),
    ]


async def test_a_failed_load_reports_why_and_a_fixed_model_loads(
    repo: ModelRepository, tmp_path: Path
) -> None:
    broken = tmp_path / "models" / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"not onnx")
    await repo.poll_once()
    (entry,) = [e for e in repository_index(repo) if e.name == "broken"]
    assert (entry.version, entry.state) == ("1", "UNAVAILABLE")
    assert str(broken / "model.onnx") in entry.reason
    with pytest.raises(ModelLoadError, match=r"model 'broken' failed to load: .*model\.onnx"):
        await repo.load_model("broken")
    # Fixed on disk: a load serves it.
    shutil.copyfile(tmp_path / "models" / "demo" / "1" / "model.onnx", broken / "model.onnx")
    await repo.load_model("broken")
    assert repo.get("broken").version == "1"
    assert repo.ready


async def test_unknown_models_are_refused_with_the_repository_named(repo: ModelRepository) -> None:
    with pytest.raises(ModelNotFoundError, match=r"'nope' is not in the model repository"):
        await repo.load_model("nope")
    with pytest.raises(ModelNotFoundError, match=r"'nope' is not in the model repository"):
        await repo.unload_model("nope")


async def test_an_empty_model_directory_is_listed_by_name(
    repo: ModelRepository, tmp_path: Path
) -> None:
    (tmp_path / "models" / "empty").mkdir()
    assert IndexEntry("empty") in repository_index(repo)
    assert IndexEntry("empty") not in repository_index(repo, ready_only=True)
