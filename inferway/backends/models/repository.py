"""The model repository: every version under ``root/<name>/<version>/model.onnx`` loaded,
warmed up and served through a ``BatchExecutor``, kept in step with the directory; and every
pipeline, ``root/<name>/pipeline.yaml`` (see ``pipelines/registry.py``), served beside them.

Hot reload never interrupts service: a new or changed version is loaded and warmed up
beside the old one and only then swapped in (one dict assignment, atomic for the event loop);
a removed or replaced version drains its in-flight requests before its runners close; a
version that fails to load (bad ONNX, bad ``config.yaml``) is refused, recorded in
``errors`` and logged, and whatever served before keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferway import background
from inferway.backends.models.config import ModelConfig, load_model_config
from inferway.backends.models.loading import (
    ExecutorFactory,
    RunnerFactory,
    default_executor_factory,
    default_runner_factory,
    load_runners,
)
from inferway.backends.models.scan import Fingerprint, VersionKey, scan_repository
from inferway.backends.models.served_model import (
    ModelLoadError,
    ModelNotFoundError,
    RepositoryEvent,
    ServedModel,
)
from inferway.backends.pipelines.registry import PIPELINE_VERSION, PipelineSet, scan_pipelines

__all__ = ["ModelRepository"]

log = logging.getLogger(__name__)


class ModelRepository:
    """Loads and serves every model version under ``root``; see the module docstring."""

    def __init__(
        self,
        root: str | Path,
        *,
        on_change: Callable[[RepositoryEvent], Any] | None = None,
        executor_factory: ExecutorFactory | None = None,
        runner_factory: RunnerFactory | None = None,
        watch_debounce_ms: int = 300,
        resync_s: float = 30.0,
        pipelines: PipelineSet | None = None,
    ) -> None:
        self.root = Path(root)
        self.on_change = on_change
        self.errors: dict[str, str] = {}
        """Refused files (``model.onnx`` or ``config.yaml`` path) -> why; cleared on success."""
        self.loaded = False
        """True once the first scan has tried every version (and until ``stop``)."""
        self._executor_factory = executor_factory or default_executor_factory
        self._runner_factory = runner_factory or default_runner_factory
        self._debounce_ms = watch_debounce_ms
        self._resync_s = resync_s
        self._models: dict[str, dict[str, ServedModel]] = {}
        self._pipelines = pipelines if pipelines is not None else PipelineSet()
        self._refused: dict[VersionKey, tuple[Fingerprint, str]] = {}
        self._held: set[str] = set()  # unloaded on request: skipped by every poll
        self._lock = asyncio.Lock()
        self._watch_task: asyncio.Task[None] | None = None
        self._stop_watch: asyncio.Event | None = None

    # -- serving ------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The served version ``version`` of ``name``, or its highest version when ``None``;
        a pipeline is served like a model with one version."""
        return self._get(name, version, pipelines=True)

    def _get(self, name: str, version: str | None, *, pipelines: bool) -> ServedModel:
        versions = self._models.get(name)
        pipeline = self._pipelines.get(name) if pipelines and not versions else None
        if pipeline is not None:
            versions = {pipeline.version: pipeline}
        if not versions and not pipelines and name in self._pipelines.names():
            raise ModelNotFoundError(
                f"{name!r} is a pipeline, not a model: a pipeline step names a model "
                "(pipelines do not nest); models: " + (", ".join(sorted(self._models)) or "none")
            )
        if not versions:
            names = {*self._models, *(self._pipelines.names() if pipelines else ())}
            available = ", ".join(sorted(names)) or "none"
            raise ModelNotFoundError(f"model {name!r} not found; available: {available}")
        if version is None:
            return versions[max(versions, key=int)]
        served = versions.get(str(version))
        if served is None:
            available = ", ".join(sorted(versions, key=int))
            raise ModelNotFoundError(
                f"model {name!r} has no version {version}; available: {available}"
            )
        return served

    @property
    def ready(self) -> bool:
        """Loaded, and every model in the directory serves at least one version. A model whose
        only versions were refused makes the server unready (its requests would all be 404);
        a refused new version beside one still serving does not, since that one answers."""
        return self.loaded and not self.unserved()

    def unserved(self) -> list[str]:
        """Models in the directory with no version serving (why the server is not ready)."""
        return sorted({name for name, _ in self._refused if not self._served(name)})

    def _served(self, name: str) -> bool:
        return bool(self._models.get(name)) or self._pipelines.get(name) is not None

    @property
    def held(self) -> frozenset[str]:
        """Models unloaded on request (``unload_model``), kept out until ``load_model``."""
        return frozenset(self._held)

    def refusals(self) -> dict[VersionKey, str]:
        """Refused versions -> why (the message in ``errors``)."""
        return {key: self.errors.get(where, "refused") for key, (_, where) in self._refused.items()}

    def models(self) -> list[ServedModel]:
        """Every served version, pipelines too, sorted by name then version."""
        served = [*self._model_versions(), *self._pipelines.models()]
        return sorted(served, key=lambda s: (s.name, int(s.version)))

    def _model_versions(self) -> list[ServedModel]:
        return [
            self._models[n][v]
            for n in sorted(self._models)
            for v in sorted(self._models[n], key=int)
        ]

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, *, watch: bool = True) -> None:
        """Load and warm up everything under ``root``, then become ready; with ``watch``,
        keep following the directory. Versions that fail are refused (see ``errors``); the
        repository is loaded once every version has been tried (see ``ready``)."""
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository {self.root} is not a directory")
        if watch:
            # Watch first, then scan: a change made during the initial load is not missed.
            await self.start_watching()
        await self.poll_once()
        self.loaded = True

    async def stop(self) -> None:
        """Stop watching, drain every executor and close every runner."""
        self.loaded = False
        if self._watch_task is not None:
            assert self._stop_watch is not None
            self._stop_watch.set()
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
            self._watch_task = None
        async with self._lock:
            served = [*self._pipelines.clear(), *self._model_versions()]  # pipelines drain first
            self._models = {}
            for s in served:
                await self._retire(s)

    async def start_watching(self) -> None:
        """Follow ``root`` with ``watchfiles``: every batch of changes runs ``poll_once``, and
        so does every ``resync_s`` of quiet (a safety net for events a filesystem drops)."""
        if self._watch_task is None:
            self._stop_watch = asyncio.Event()
            self._watch_task = background.start(self._watch(), name=f"watch {self.root}", log=log)
            # One loop turn lets the task create its inotify watch before we return.
            await asyncio.sleep(0)

    async def _watch(self) -> None:
        import watchfiles

        root = self.root.resolve()

        def relevant(_change: watchfiles.Change, path: str) -> bool:
            try:
                parts = Path(path).relative_to(root).parts
            except ValueError:
                return True
            return not any(part.startswith(".") for part in parts)

        assert self._stop_watch is not None
        async for _changes in watchfiles.awatch(
            root,
            watch_filter=relevant,
            debounce=self._debounce_ms,
            stop_event=self._stop_watch,
            rust_timeout=int(self._resync_s * 1000),
            yield_on_timeout=True,
        ):
            try:
                await self.poll_once()
            except Exception:  # a failed poll must not end hot reload
                log.exception("model repository %s: reload failed", self.root)

    # -- on request (Triton's model repository extension) --------------------------------

    async def load_model(self, name: str) -> None:
        """Serve ``name`` again after ``unload_model``, and retry its refused versions (the
        same bytes too: the caller asked). A version already serving unchanged is kept as it
        is, not reloaded. Raises ModelNotFoundError when the directory holds no such model,
        ModelLoadError when none of its versions loads."""
        if not self._on_disk(name):
            raise ModelNotFoundError(f"model {name!r} is not in the model repository {self.root}")
        self._held.discard(name)
        for key in [k for k in self._refused if k[0] == name]:
            self._clear_refusal(key)
        await self.poll_once()
        if not self._served(name):
            why = "; ".join(m for (n, _), m in sorted(self.refusals().items()) if n == name)
            raise ModelLoadError(f"model {name!r} failed to load: {why or 'no version found'}")

    async def unload_model(self, name: str) -> None:
        """Take ``name`` out of service (its in-flight requests finish first) and keep it
        out through file changes until ``load_model``. Raises ModelNotFoundError when the
        model is neither served nor in the directory."""
        if not (self._served(name) or self._on_disk(name)):
            raise ModelNotFoundError(f"model {name!r} is not in the model repository {self.root}")
        self._held.add(name)
        await self.poll_once()

    def _on_disk(self, name: str) -> bool:
        on_disk = any(key[0] == name for key in scan_repository(self.root))
        return on_disk or name in scan_pipelines(self.root)

    # -- reconciliation -----------------------------------------------------------------

    async def poll_once(self) -> list[RepositoryEvent]:
        """Bring the served set in line with the directory once; returns what changed."""
        async with self._lock:
            events: list[RepositoryEvent] = []
            found = {k: v for k, v in scan_repository(self.root).items() if k[0] not in self._held}
            pipelines = {n: v for n, v in scan_pipelines(self.root).items() if n not in self._held}
            current = {(s.name, s.version): s for s in self._model_versions()}
            for key in sorted(set(current) - set(found)):
                events.append(await self._unload(current[key]))
            for key in list(self._refused):
                if key not in found and key[0] not in pipelines:
                    self._clear_refusal(key)
            for key, (model, cfg, fp) in sorted(found.items()):
                old = current.get(key)
                if old is not None and old.fingerprint == fp:
                    continue
                refused = self._refused.get(key)
                if refused is not None and refused[0] == fp:
                    continue  # same bytes that failed last time: do not retry every poll
                events.append(await self._load(key, model, cfg, fp, old))
            events.extend(await self._reconcile_pipelines(pipelines))
            return events

    async def _reconcile_pipelines(self, found: dict[str, Any]) -> list[RepositoryEvent]:
        """Pipelines after models: each is checked against the models now served."""
        events: list[RepositoryEvent] = []
        models = functools.partial(self._get, pipelines=False)
        for c in self._pipelines.reconcile(found, models, self._refused_fingerprint):
            key = (c.name, PIPELINE_VERSION)
            if c.kind == "refused":
                events.append(self._refuse(key, c.key, c.where, c.message, serving=c.served))
            else:
                self._clear_refusal(key)
                events.append(
                    self._emit(RepositoryEvent(c.kind, *key, load_seconds=c.load_seconds))
                )
            if c.retired is not None:
                await self._retire(c.retired)
        return events

    def _refused_fingerprint(self, name: str) -> Fingerprint | None:
        return self._refused.get((name, PIPELINE_VERSION), (None, ""))[0]

    async def _load(
        self,
        key: VersionKey,
        model: Path,
        cfg: Path | None,
        fp: Fingerprint,
        old: ServedModel | None,
    ) -> RepositoryEvent:
        name, version = key
        started = time.perf_counter()
        culprit = cfg if cfg is not None else model
        try:
            config = load_model_config(cfg) if cfg is not None else ModelConfig()
            culprit = model
            runners = await asyncio.to_thread(load_runners, model, config, self._runner_factory)
            try:
                executor = self._executor_factory(runners, config.batching, f"{name}:{version}")
                await executor.start()
            except BaseException:
                for r in runners:
                    r.close()
                raise
        except Exception as e:
            message = f"{culprit}: {e}" if str(culprit) not in str(e) else str(e)
            return self._refuse(key, fp, str(culprit), message, serving=old)
        seconds = time.perf_counter() - started
        first = runners[0]
        served = ServedModel(
            name=name,
            version=version,
            config=config,
            inputs=tuple(first.inputs),
            outputs=tuple(first.outputs),
            executor=executor,
            load_seconds=seconds,
            platform=getattr(first, "platform", "onnxruntime"),
            provider=first.provider,
            path=model,
            runners=tuple(runners),
            fingerprint=fp,
        )
        versions = dict(self._models.get(name, {}))
        versions[version] = served
        self._models = {**self._models, name: versions}  # the swap: one assignment
        self._clear_refusal(key)
        log.info(
            "model %s version %s %s in %.2fs (%s, %s, %d instance%s)",
            name,
            version,
            "reloaded" if old else "loaded",
            seconds,
            served.platform,
            served.provider,
            len(runners),
            "" if len(runners) == 1 else "s",
        )
        if old is not None:
            await self._retire(old)
        return self._emit(
            RepositoryEvent("reloaded" if old else "loaded", name, version, load_seconds=seconds)
        )

    def _refuse(
        self,
        key: VersionKey,
        fp: Fingerprint,
        where: str,
        message: str,
        *,
        serving: ServedModel | None,
    ) -> RepositoryEvent:
        self._clear_refusal(key)
        self._refused[key] = (fp, where)
        self.errors[where] = message
        still = f"; version {serving.version} keeps serving" if serving is not None else ""
        log.error("model %s version %s refused: %s%s", key[0], key[1], message, still)
        return self._emit(RepositoryEvent("refused", key[0], key[1], message=message))

    def _clear_refusal(self, key: VersionKey) -> None:
        refused = self._refused.pop(key, None)
        if refused is not None and not any(w == refused[1] for _, w in self._refused.values()):
            self.errors.pop(refused[1], None)

    async def _unload(self, served: ServedModel) -> RepositoryEvent:
        versions = {
            v: s for v, s in self._models.get(served.name, {}).items() if v != served.version
        }
        models = dict(self._models)
        if versions:
            models[served.name] = versions
        else:
            models.pop(served.name, None)
        self._models = models
        await self._retire(served)
        log.info("model %s version %s unloaded", served.name, served.version)
        return self._emit(RepositoryEvent("unloaded", served.name, served.version))

    async def _retire(self, served: ServedModel) -> None:
        """Let in-flight requests finish; the executor owns the runners and closes them."""
        try:
            await served.executor.stop(drain=True)
        except Exception:
            log.exception(
                "model %s version %s: stopping executor failed", served.name, served.version
            )

    def _emit(self, event: RepositoryEvent) -> RepositoryEvent:
        if self.on_change is not None:
            try:
                self.on_change(event)
            except Exception:
                log.exception("model repository on_change callback failed for %s", event)
        return event

    def __repr__(self) -> str:
        return f"ModelRepository({str(self.root)!r}, models={len(self.models())})"
