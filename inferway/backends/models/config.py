"""Per-model serving settings (``config.yaml`` beside ``model.onnx``), validated up front so a
typo refuses the model with a message naming the file, line and field instead of being
silently ignored.

Lookup: ``<root>/<name>/<version>/config.yaml`` if present, else ``<root>/<name>/config.yaml``
(shared by all versions), else defaults. The version-level file replaces the model-level one
as a whole; they are not merged, so what a version runs with is visible in one file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferway.backends.batching.config import BatchingConfig
from inferway.backends.models.hsm import ModelEncryption
from inferway.backends.models.yaml_file import read_yaml_file

__all__ = [
    "CONFIG_FILE",
    "ModelConfig",
    "ModelConfigError",
    "load_model_config",
    "resolve_model_config_path",
    "yaml_line",
]

CONFIG_FILE = "config.yaml"


class ModelConfig(BaseModel):
    """How one model version is served."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    provider: Literal["auto", "tensorrt", "cuda", "cpu"] = "auto"
    """Execution engine: ``auto`` picks native TensorRT, then the TensorRT / CUDA execution
    providers, then CPU -- whatever this machine has. A named one that is missing is an error."""
    fp16: bool = False
    """Let TensorRT (native or execution provider) run layers in FP16. Ignored on CUDA EP/CPU."""
    max_input_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    """Largest request body the servers accept for this model."""
    intra_op_threads: int | None = Field(default=None, ge=1, le=256)
    """onnxruntime threads per instance; default splits the cores between the instances."""
    device_id: int = Field(default=0, ge=0)
    encryption: ModelEncryption | None = None
    """Where the key of an encrypted ``model.onnx.enc`` is (docs/security.md)."""

    @property
    def instances(self) -> int:
        return self.batching.instances


class ModelConfigError(ValueError):
    """A ``config.yaml`` that cannot be used; ``str()`` is one ``file:line: field: message``
    line per problem."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__("\n".join(problems))


def yaml_line(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at ``loc`` (deepest node found on the way)."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
            if nxt is None:
                # Unknown keys: point at the key itself.
                k = next((k for k, _ in node.value if getattr(k, "value", None) == key), None)
                return k.start_mark.line + 1 if k is not None else line
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
        line = node.start_mark.line + 1
    return line


_YAML_BOOL_HINT = "YAML reads an unquoted yes, no, on, off as a boolean: quote the word you meant"


def load_model_config(path: str | Path) -> ModelConfig:
    """Parse and validate one ``config.yaml``; an empty file means all defaults."""
    path = Path(path)
    data, tree, problem = read_yaml_file(path)
    if problem is not None:
        raise ModelConfigError(path, [problem])
    if data is None:
        return ModelConfig()
    if not isinstance(data, dict):
        raise ModelConfigError(
            path, [f"{path}:1: expected a mapping of settings, got {type(data).__name__}"]
        )
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as e:
        located: list[tuple[int, str]] = []
        for err in e.errors():
            loc = tuple(err["loc"])
            field = ".".join(str(p) for p in loc) or "<root>"
            line = yaml_line(tree, loc)
            where = f"{path}:{line}" if line else str(path)
            msg = "unknown setting" if err["type"] == "extra_forbidden" else err["msg"]
            if err["type"] == "literal_error" and isinstance(err.get("input"), bool):
                msg += f", got {str(err['input']).lower()} ({_YAML_BOOL_HINT})"
            located.append((line or 0, f"{where}: {field}: {msg}"))
        raise ModelConfigError(path, [p for _, p in sorted(located)]) from None


def resolve_model_config_path(model_dir: Path, version_dir: Path) -> Path | None:
    """Which ``config.yaml`` applies to a version: its own, else the model's, else none."""
    for candidate in (version_dir / CONFIG_FILE, model_dir / CONFIG_FILE):
        if candidate.is_file():
            return candidate
    return None
