"""The schema of ``models/<pipeline>/pipeline.yaml`` and its loader with located errors.

The file names steps (each a model, or a mixture of experts behind a router step), maps each
step input from the request (``request.<input>``) or from another step's output
(``<step>.<output>``), and maps the pipeline's outputs from steps. This module only checks
the file's own shape; whether the named models, tensors, dtypes and shapes line up is the
planner's job (``plan.py``), which needs the served models.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from inferway.backends.models.config import yaml_line
from inferway.backends.models.yaml_file import read_yaml_file

__all__ = [
    "PIPELINE_FILE",
    "REQUEST",
    "CacheSpec",
    "ExpertSpec",
    "MoeSpec",
    "PipelineError",
    "PipelineSpec",
    "StepSpec",
    "load_pipeline_spec",
    "locate_problems",
    "parse_source",
]

PIPELINE_FILE = "pipeline.yaml"
REQUEST = "request"
"""The source prefix of the request's own inputs (``request.x``); no step may take the name."""
_STEP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def parse_source(text: str) -> tuple[str, str]:
    """``"embed.y"`` -> ("embed", "y"); ``"request.x"`` -> ("request", "x"). Step names hold
    no dot, so the first dot splits (tensor names may hold dots: ONNX allows ``out.1``)."""
    step, dot, tensor = text.partition(".")
    if not dot or not step or not tensor:
        raise ValueError(f"source {text!r} must be 'request.<input>' or '<step>.<output>'")
    return step, tensor


def _check_source(value: str) -> str:
    parse_source(value)
    return value


class ExpertSpec(BaseModel):
    """One expert of a mixture: a served model (its highest version unless ``version``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    version: str | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class MoeSpec(BaseModel):
    """A mixture of experts: per row, the ``top_k`` experts with the highest router scores
    run (in parallel, each through its own batcher) and their ``output`` tensors are summed,
    weighted by the chosen scores normalised over the top k (``softmax`` for logits, ``sum``
    for scores that are already non-negative weights)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    router: str
    """The scores: ``<step>.<output>``, shape [rows, experts]."""
    experts: list[ExpertSpec] = Field(min_length=2)
    top_k: int = Field(default=1, ge=1)
    weights: Literal["softmax", "sum"] = "softmax"
    output: str = Field(min_length=1)
    """The experts' output tensor to combine; the step's output has the same name."""

    @field_validator("router")
    @classmethod
    def _router_source(cls, value: str) -> str:
        return _check_source(value)

    @field_validator("experts", mode="before")
    @classmethod
    def _expert_shorthand(cls, value: object) -> object:
        """``experts: [a, b]`` is short for ``[{model: a}, {model: b}]``."""
        if isinstance(value, list):
            return [{"model": v} if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _k_within_experts(self) -> MoeSpec:
        if self.top_k > len(self.experts):
            raise ValueError(
                f"top_k {self.top_k} exceeds the number of experts ({len(self.experts)})"
            )
        return self


class StepSpec(BaseModel):
    """One step: a ``model`` (optionally a ``version``), or a ``moe`` mixture."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    model: str | None = None
    version: str | None = None
    moe: MoeSpec | None = None
    inputs: dict[str, str] = Field(default_factory=dict)
    """The model's input name -> its source (``request.<input>`` or ``<step>.<output>``)."""
    deterministic: bool = False
    """The same inputs always give the same outputs (what makes caching the step sound)."""
    cache: bool = False
    """Keep this step's results in the pipeline's cache (deterministic steps only)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _STEP_NAME.match(value):
            raise ValueError(
                f"step name {value!r} must start with a letter or '_' and hold only letters, "
                "digits, '_' and '-'"
            )
        if value == REQUEST:
            raise ValueError(f"'{REQUEST}' names the request's inputs; choose another step name")
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("inputs")
    @classmethod
    def _sources(cls, value: dict[str, str]) -> dict[str, str]:
        for source in value.values():
            _check_source(source)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> StepSpec:
        if (self.model is None) == (self.moe is None):
            raise ValueError("a step names exactly one of 'model' or 'moe'")
        if self.moe is not None and self.version is not None:
            raise ValueError("'version' belongs to a model step; give each expert its version")
        if self.cache and not self.deterministic:
            raise ValueError(
                "cache: true needs deterministic: true (only a step whose outputs depend on "
                "its inputs alone may be answered from the cache)"
            )
        return self


class CacheSpec(BaseModel):
    """The pipeline's step-result cache: ``max_bytes`` of results (0: off), each kept at most
    ``ttl_s`` seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    ttl_s: float = Field(default=300.0, gt=0)


class PipelineSpec(BaseModel):
    """A whole ``pipeline.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: list[StepSpec] = Field(min_length=1)
    outputs: dict[str, str] = Field(min_length=1)
    """The pipeline's output name -> ``<step>.<output>``."""
    cache: CacheSpec = Field(default_factory=CacheSpec)
    max_input_bytes: int = Field(default=64 * 1024 * 1024, ge=1)

    @field_validator("outputs")
    @classmethod
    def _output_sources(cls, value: dict[str, str]) -> dict[str, str]:
        for source in value.values():
            step, _ = parse_source(source)
            if step == REQUEST:
                raise ValueError(f"output source {source!r} must name a step, not the request")
        return value

    @model_validator(mode="after")
    def _unique_steps(self) -> PipelineSpec:
        seen: set[str] = set()
        for step in self.steps:
            if step.name in seen:
                raise ValueError(f"step name {step.name!r} is used twice")
            seen.add(step.name)
        return self


class PipelineError(ValueError):
    """A pipeline that cannot be served; ``str()`` is one ``file:line: field: message`` line
    per problem, sorted by line."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__("\n".join(problems))


def locate_problems(
    path: Path, tree: yaml.Node | None, problems: list[tuple[tuple[Any, ...], str]]
) -> PipelineError:
    """``(loc, message)`` pairs as one error whose lines name the file and line of each."""
    located: list[tuple[int, str]] = []
    for loc, message in problems:
        line = yaml_line(tree, loc)
        field = ".".join(str(p) for p in loc) or "<root>"
        where = f"{path}:{line}" if line else str(path)
        located.append((line or 0, f"{where}: {field}: {message}"))
    return PipelineError(path, [text for _, text in sorted(located)])


def load_pipeline_spec(path: str | Path) -> tuple[PipelineSpec, yaml.Node | None]:
    """Parse and validate one ``pipeline.yaml``: the spec and its YAML tree (for locating the
    planner's problems later). Raises PipelineError naming file and line."""
    path = Path(path)
    data, tree, problem = read_yaml_file(path)
    if problem is not None:
        raise PipelineError(path, [problem])
    if not isinstance(data, dict):
        kind = "an empty file" if data is None else type(data).__name__
        raise PipelineError(
            path, [f"{path}:1: expected a mapping with steps and outputs, got {kind}"]
        )
    try:
        return PipelineSpec.model_validate(data), tree
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not str(p).startswith("function-"))
            msg = "unknown setting" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append((loc, msg.removeprefix("Value error, ")))
        raise locate_problems(path, tree, problems) from None
