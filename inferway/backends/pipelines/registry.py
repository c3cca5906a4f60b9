"""The pipelines of a model repository: ``<root>/<name>/pipeline.yaml`` found, checked against
the models being served, and kept in step with both.

A pipeline is rebuilt when its file changes or when a model it names changes (a reload, a
new highest version, one gone): the key it was built from is the file's ``stat`` plus each
named model's version and fingerprint. A file that does not check out is refused with
located errors; the pipeline already serving keeps serving when its own file still lines up
with the models, and is taken out when it no longer does (a step model gone or changed
shape), which is how "ready only when its steps' models are" holds. The repository records
the refusals and drains what is retired; this module decides.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from opentelemetry.trace import TracerProvider

from inferway.backends.batching.config import BatchingConfig
from inferway.backends.models.config import ModelConfig
from inferway.backends.models.scan import Fingerprint
from inferway.backends.models.served_model import ModelNotFoundError, ServedModel
from inferway.backends.pipelines.executor import PipelineExecutor
from inferway.backends.pipelines.plan import (
    ModelRef,
    ModelSignature,
    PipelinePlan,
    PlanProblems,
    build_pipeline_plan,
    model_refs,
)
from inferway.backends.pipelines.spec import (
    PIPELINE_FILE,
    PipelineError,
    PipelineSpec,
    load_pipeline_spec,
    locate_problems,
)
from inferway.backends.telemetry.pipeline_metrics import PipelineMetrics

__all__ = [
    "PIPELINE_PLATFORM",
    "PIPELINE_VERSION",
    "PipelineChange",
    "PipelineSet",
    "scan_pipelines",
]

log = logging.getLogger(__name__)

PIPELINE_VERSION = "1"
"""A pipeline has one version: its file. Edit it to change the pipeline (hot reloaded)."""
PIPELINE_PLATFORM = "pipeline"
ModelLookup = Callable[[str, str | None], ServedModel]
"""A served model by name and version (None: highest); raises ModelNotFoundError."""


def scan_pipelines(root: Path) -> dict[str, tuple[Path, Fingerprint]]:
    """Every ``<root>/<name>/pipeline.yaml`` now: name -> (path, stat fingerprint)."""
    found: dict[str, tuple[Path, Fingerprint]] = {}
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        path = model_dir / PIPELINE_FILE
        if model_dir.name.startswith("."):
            continue
        try:
            st = path.stat()
        except OSError:
            continue
        found[model_dir.name] = (path, (str(path), st.st_ino, st.st_size, st.st_mtime_ns))
    return found


@dataclass(frozen=True)
class PipelineChange:
    """What one reconcile did to one pipeline. ``served``: the one now serving (None when
    none does); ``retired``: the one to drain; ``key``: what it was built (or refused) from."""

    kind: Literal["loaded", "reloaded", "unloaded", "refused"]
    name: str
    key: Fingerprint
    where: str
    served: ServedModel | None = None
    retired: ServedModel | None = None
    message: str = ""
    load_seconds: float | None = None


@dataclass(frozen=True)
class _Source:
    spec: PipelineSpec
    tree: yaml.Node | None


class PipelineSet:
    """The served pipelines of one repository (see the module docstring)."""

    def __init__(
        self,
        *,
        metrics: PipelineMetrics | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self._metrics = metrics
        self._tracer_provider = tracer_provider
        self._served: dict[str, ServedModel] = {}
        self._sources: dict[str, _Source] = {}
        """The file each served pipeline was built from (to recheck it when models change)."""

    def get(self, name: str) -> ServedModel | None:
        return self._served.get(name)

    def models(self) -> list[ServedModel]:
        return [self._served[n] for n in sorted(self._served)]

    def names(self) -> list[str]:
        return sorted(self._served)

    def clear(self) -> list[ServedModel]:
        """Forget every pipeline (the repository is stopping); returns them to drain."""
        served, self._served, self._sources = self.models(), {}, {}
        return served

    def reconcile(
        self,
        found: Mapping[str, tuple[Path, Fingerprint]],
        lookup: ModelLookup,
        refused_key: Callable[[str], Fingerprint | None],
    ) -> list[PipelineChange]:
        """Bring the served pipelines in line with ``found`` (``scan_pipelines``) and the
        models ``lookup`` serves. ``refused_key(name)``: the key its last refusal was for, so
        the same failure is not retried on every poll."""
        changes: list[PipelineChange] = []
        for name in sorted(set(self._served) - set(found)):
            old = self._served.pop(name)
            self._sources.pop(name, None)
            changes.append(
                PipelineChange("unloaded", name, old.fingerprint, str(old.path), retired=old)
            )
        for name, (path, stat) in sorted(found.items()):
            change = self._reconcile_one(name, path, stat, lookup, refused_key(name))
            if change is not None:
                changes.append(change)
        return changes

    def _reconcile_one(
        self,
        name: str,
        path: Path,
        stat: Fingerprint,
        lookup: ModelLookup,
        refused: Fingerprint | None,
    ) -> PipelineChange | None:
        source: _Source | None = None
        error: PipelineError | None = None
        try:
            source = _Source(*load_pipeline_spec(path))
            lookup(name, None)
        except PipelineError as e:
            error = e
        except ModelNotFoundError:
            pass  # the directory is not a model too: good
        else:
            source, error = (
                None,
                PipelineError(
                    path,
                    [
                        f"{path}: {name!r} holds model versions too; a directory is a model "
                        "or a pipeline"
                    ],
                ),
            )
        key = (stat, _identity(source.spec, lookup) if source is not None else ())
        old = self._served.get(name)
        if (old is not None and old.fingerprint == key) or refused == key:
            return None
        started = time.perf_counter()
        if source is not None:
            try:
                served = self._build(name, path, source, key, lookup)
            except PipelineError as e:
                error = e
            else:
                self._served[name], self._sources[name] = served, source
                log.info("pipeline %s %s", name, "reloaded" if old is not None else "loaded")
                return PipelineChange(
                    "reloaded" if old is not None else "loaded",
                    name,
                    key,
                    str(path),
                    served=served,
                    retired=old,
                    load_seconds=time.perf_counter() - started,
                )
        assert error is not None
        keep = old is not None and self._still_lines_up(name, lookup)
        if old is not None and not keep:
            del self._served[name]
            self._sources.pop(name, None)
        return PipelineChange(
            "refused",
            name,
            key,
            str(path),
            served=old if keep else None,
            retired=None if keep else old,
            message=str(error),
        )

    def _still_lines_up(self, name: str, lookup: ModelLookup) -> bool:
        source = self._sources.get(name)
        if source is None:
            return False
        try:
            build_pipeline_plan(source.spec, _signatures(lookup))
        except PlanProblems:
            return False
        return True

    def _build(
        self, name: str, path: Path, source: _Source, key: Fingerprint, lookup: ModelLookup
    ) -> ServedModel:
        started = time.perf_counter()
        try:
            plan: PipelinePlan = build_pipeline_plan(source.spec, _signatures(lookup))
        except PlanProblems as p:
            raise locate_problems(path, source.tree, p.problems) from None
        executor = PipelineExecutor(
            name,
            plan,
            lambda ref: lookup(ref.name, ref.version),
            metrics=self._metrics,
            tracer_provider=self._tracer_provider,
        )
        # the most rows one request may carry: what every step model's batcher takes
        rows = min(lookup(r.name, r.version).config.batching.max_batch_size for r in plan.models())
        config = ModelConfig(
            max_input_bytes=source.spec.max_input_bytes,
            batching=BatchingConfig(mode="off", max_batch_size=rows),
        )
        return ServedModel(
            name=name,
            version=PIPELINE_VERSION,
            config=config,
            inputs=plan.inputs,
            outputs=tuple(spec for spec, _ in plan.outputs),
            executor=executor,
            load_seconds=time.perf_counter() - started,
            platform=PIPELINE_PLATFORM,
            provider=PIPELINE_PLATFORM,
            path=path,
            fingerprint=key,
        )


def _signatures(lookup: ModelLookup) -> Callable[[ModelRef], ModelSignature]:
    def signature(ref: ModelRef) -> ModelSignature:
        served = lookup(ref.name, ref.version)
        return ModelSignature(served.name, str(served.version), served.inputs, served.outputs)

    return signature


def _identity(spec: PipelineSpec, lookup: ModelLookup) -> Fingerprint:
    """What the pipeline's models are now: (name, version, fingerprint) each, None if gone."""
    out: list[tuple[str, str | None, Fingerprint | None]] = []
    for ref in model_refs(spec):
        try:
            served = lookup(ref.name, ref.version)
        except ModelNotFoundError:
            out.append((ref.name, ref.version, None))
        else:
            out.append((ref.name, served.version, served.fingerprint))
    return tuple(out)
