"""Init container of the backend pod: build the model repository `inferway serve` reads from the
read-only model store, with the batching settings of the pod's environment.

Batching is a per-model setting (``config.yaml`` beside the versions); this turns the
``INFERWAY_*`` variables below into that file for every model whose store has no model-level
``config.yaml`` (the store's own file is linked, not overwritten; a version's own file wins
over either, as the backend looks it up). Versions
are linked, not copied, so a large model costs no extra disk. The backend validates the
result when it loads the model and refuses a bad value with its file, line and field.

    INFERWAY_MODEL_STORE        the store, <model>/<version>/model.onnx  (required)
    INFERWAY_MODEL_REPOSITORY   the folder to build, an emptyDir          (required)
    INFERWAY_BATCHING_MODE      off | fixed | adaptive
    INFERWAY_MAX_BATCH_SIZE     rows per batch
    INFERWAY_MAX_QUEUE_DELAY_S  longest wait for a fuller batch (fixed)
    INFERWAY_LATENCY_SLO_S      latency target the adaptive batcher keeps
    INFERWAY_MAX_QUEUE_SIZE     queued requests before 503
    INFERWAY_INSTANCES          model instances per pod
    INFERWAY_PROVIDER           auto | tensorrt | cuda | cpu
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

BATCHING = {
    "INFERWAY_BATCHING_MODE": ("mode", str),
    "INFERWAY_MAX_BATCH_SIZE": ("max_batch_size", int),
    "INFERWAY_MAX_QUEUE_DELAY_S": ("max_queue_delay_s", float),
    "INFERWAY_LATENCY_SLO_S": ("latency_slo_s", float),
    "INFERWAY_MAX_QUEUE_SIZE": ("max_queue_size", int),
    "INFERWAY_INSTANCES": ("instances", int),
}
TOP_LEVEL = {"INFERWAY_PROVIDER": ("provider", str)}
CONFIG_FILE = "config.yaml"


def settings(environ: dict[str, str]) -> dict[str, object]:
    """The config.yaml the environment asks for; an unparsable number names its variable."""
    config: dict[str, object] = {}
    batching: dict[str, object] = {}
    for table, into in ((BATCHING, batching), (TOP_LEVEL, config)):
        for variable, (key, kind) in table.items():
            raw = environ.get(variable, "").strip()
            if not raw:
                continue
            try:
                into[key] = kind(raw)
            except ValueError:
                raise SystemExit(f"{variable}={raw!r}: expected {kind.__name__}") from None
    if batching:
        config["batching"] = batching
    return config


def build_repository(store: Path, repository: Path, config: dict[str, object]) -> list[str]:
    """Link the store's models into ``repository``; write ``config`` where a model has none."""
    if not store.is_dir():
        raise SystemExit(f"INFERWAY_MODEL_STORE={store}: not a directory")
    written = []
    for model in sorted(p for p in store.iterdir() if p.is_dir()):
        target = repository / model.name
        target.mkdir(parents=True, exist_ok=True)
        for entry in model.iterdir():
            link = target / entry.name
            if not link.exists():
                link.symlink_to(entry)
        # A version's own config.yaml still wins over this model-level one (the backend's lookup).
        if config and not (model / CONFIG_FILE).is_file():
            (target / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=True))
            written.append(model.name)
    return written


def main() -> None:
    environ = dict(os.environ)
    missing = [v for v in ("INFERWAY_MODEL_STORE", "INFERWAY_MODEL_REPOSITORY") if v not in environ]
    if missing:
        raise SystemExit(f"missing environment variables: {', '.join(missing)}")
    config = settings(environ)
    written = build_repository(
        Path(environ["INFERWAY_MODEL_STORE"]), Path(environ["INFERWAY_MODEL_REPOSITORY"]), config
    )
    for name in written:
        print(f"{name}/{CONFIG_FILE}: {config}")
    print(f"model repository {environ['INFERWAY_MODEL_REPOSITORY']} ready", file=sys.stderr)


if __name__ == "__main__":
    main()
