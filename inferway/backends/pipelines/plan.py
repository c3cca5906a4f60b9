"""A pipeline spec checked against the served models and turned into a runnable DAG.

Pure: the caller passes what each model declares (``signature``), so the checks are unit
tested without a server. Every problem is collected with its place in the file (``loc``),
not just the first: an unknown model, an input left unmapped, a source naming no step or
output, a dtype or shape that does not line up, a cycle, a step that feeds nothing. The
pipeline's own inputs come from the step inputs mapped from the request (their model
specs, unified), its outputs from the steps that produce them.
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from inferway.backends.pipelines.spec import REQUEST, CacheSpec, PipelineSpec, parse_source
from inferway.backends.runners.base import TensorSpec

__all__ = [
    "FLOAT_TYPES",
    "ModelRef",
    "ModelSignature",
    "MoePlan",
    "PipelinePlan",
    "PlanProblems",
    "PlannedStep",
    "Source",
    "build_pipeline_plan",
    "model_refs",
]

FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64"})
Loc = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A model a step names: ``version`` None means its highest served version."""

    name: str
    version: str | None = None


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """What a served model declares (its resolved version, its tensors)."""

    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True, slots=True)
class Source:
    """Where a tensor comes from: the request (``step`` None) or a step's output."""

    step: str | None
    tensor: str


@dataclass(frozen=True, slots=True)
class MoePlan:
    router: Source
    experts: tuple[ModelRef, ...]
    top_k: int
    weights: str
    output: str


@dataclass(frozen=True, slots=True)
class PlannedStep:
    name: str
    model: ModelRef | None
    """The model of a model step (None for a mixture: see ``moe``)."""
    moe: MoePlan | None
    inputs: tuple[tuple[str, Source], ...]
    """The model's input name -> where it comes from."""
    deps: frozenset[str]
    """Steps whose outputs this one reads (the router too, for a mixture)."""
    outputs: tuple[TensorSpec, ...]
    cached: bool

    def refs(self) -> tuple[ModelRef, ...]:
        """The models this step calls: its model, or its experts."""
        if self.model is not None:
            return (self.model,)
        return self.moe.experts if self.moe is not None else ()


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    steps: tuple[PlannedStep, ...]
    """In an order where every step comes after the steps it reads."""
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[tuple[TensorSpec, Source], ...]
    cache: CacheSpec

    def models(self) -> tuple[ModelRef, ...]:
        return tuple(r for s in self.steps for r in s.refs())


class PlanProblems(ValueError):
    """The spec does not line up with the models; ``problems`` are ``(loc, message)``."""

    def __init__(self, problems: list[tuple[Loc, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(m for _, m in problems))


def model_refs(spec: PipelineSpec) -> tuple[ModelRef, ...]:
    """Every model the spec names, in file order (experts included)."""
    refs: list[ModelRef] = []
    for step in spec.steps:
        if step.model is not None:
            refs.append(ModelRef(step.model, step.version))
        elif step.moe is not None:
            refs.extend(ModelRef(e.model, e.version) for e in step.moe.experts)
    return tuple(refs)


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _mismatch(got: TensorSpec, want: TensorSpec) -> str | None:
    """Why a tensor of spec ``got`` cannot feed an input of spec ``want`` (None: it can)."""
    if got.datatype != want.datatype:
        return f"dtype {got.datatype} does not match the input's {want.datatype}"
    if len(got.shape) != len(want.shape) or any(
        g >= 0 and w >= 0 and g != w for g, w in zip(got.shape, want.shape, strict=False)
    ):
        return f"shape {_shape(got.shape)} does not fit the input's {_shape(want.shape)}"
    return None


def _merge(a: TensorSpec, b: TensorSpec) -> TensorSpec:
    """The request input both consumers accept: fixed dims win over dynamic ones."""
    dims = tuple(x if x >= 0 else y for x, y in zip(a.shape, b.shape, strict=True))
    return TensorSpec(a.name, a.datatype, dims)


class _Planner:
    def __init__(self, spec: PipelineSpec, signature: Callable[[ModelRef], ModelSignature]) -> None:
        self.spec = spec
        self.signature = signature
        self.problems: list[tuple[Loc, str]] = []
        self.produced: dict[str, tuple[TensorSpec, ...]] = {}
        self.request: dict[str, TensorSpec] = {}
        self.request_order: list[str] = []

    def fail(self, loc: Loc, message: str) -> None:
        self.problems.append((loc, message))

    def resolve(self, ref: ModelRef, loc: Loc) -> ModelSignature | None:
        try:
            return self.signature(ref)
        except LookupError as e:  # a KeyError's str() is the repr of its message: take args[0]
            message = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
            self.fail(loc, message)
            return None

    def plan(self) -> PipelinePlan:
        sigs: dict[str, list[ModelSignature | None]] = {}
        for i, step in enumerate(self.spec.steps):
            if step.model is not None:
                sig = self.resolve(ModelRef(step.model, step.version), ("steps", i, "model"))
                sigs[step.name] = [sig]
                if sig is not None:
                    self.produced[step.name] = sig.outputs
            elif step.moe is not None:
                sigs[step.name] = [
                    self.resolve(ModelRef(e.model, e.version), ("steps", i, "moe", "experts", j))
                    for j, e in enumerate(step.moe.experts)
                ]
                self.produced[step.name] = self._moe_output(i, sigs[step.name])
        steps = [self._step(i, sigs[s.name]) for i, s in enumerate(self.spec.steps)]
        order = self._order(steps)
        outputs = self._outputs()
        self._check_used(steps, outputs)
        if self.problems:
            raise PlanProblems(self.problems)
        by_name = {s.name: s for s in steps}
        return PipelinePlan(
            steps=tuple(by_name[n] for n in order),
            inputs=tuple(self.request[n] for n in self.request_order),
            outputs=tuple(outputs),
            cache=self.spec.cache,
        )

    def _moe_output(self, i: int, experts: list[ModelSignature | None]) -> tuple[TensorSpec, ...]:
        moe = self.spec.steps[i].moe
        assert moe is not None
        loc = ("steps", i, "moe", "output")
        first: TensorSpec | None = None
        for sig in experts:
            if sig is None:
                continue
            spec = next((o for o in sig.outputs if o.name == moe.output), None)
            if spec is None:
                names = ", ".join(o.name for o in sig.outputs)
                self.fail(
                    loc, f"expert {sig.name!r} has no output {moe.output!r}; its outputs: {names}"
                )
            elif spec.datatype not in FLOAT_TYPES:
                self.fail(
                    loc,
                    f"expert {sig.name!r} output {moe.output!r} is {spec.datatype}; "
                    "combining by weight needs FP16, FP32 or FP64",
                )
            elif first is None:
                first = spec
            elif why := _mismatch(spec, first):
                self.fail(
                    loc, f"expert {sig.name!r} output {moe.output!r}: {why} of the first expert"
                )
        return (first,) if first is not None else ()

    def _source(self, text: str, loc: Loc, own: str) -> Source | None:
        step, tensor = parse_source(text)
        if step == REQUEST:
            return Source(None, tensor)
        if step == own:
            self.fail(loc, f"step {own!r} cannot read its own output {text!r}")
            return None
        names = [s.name for s in self.spec.steps]
        if step not in names:
            self.fail(loc, f"{text!r} names no step; the steps are: {', '.join(names)}")
            return None
        if step in self.produced and not any(o.name == tensor for o in self.produced[step]):
            outs = ", ".join(o.name for o in self.produced[step])
            self.fail(loc, f"step {step!r} has no output {tensor!r}; its outputs: {outs}")
            return None
        return Source(step, tensor)

    def _feed(self, source: Source, want: TensorSpec, loc: Loc, text: str) -> None:
        """Check one source against the input it feeds; collect request inputs."""
        if source.step is None:
            got = self.request.get(source.tensor)
            if got is None:
                self.request[source.tensor] = TensorSpec(source.tensor, want.datatype, want.shape)
                self.request_order.append(source.tensor)
            elif why := _mismatch(got, want):
                self.fail(
                    loc,
                    f"request input {source.tensor!r} is used with {got.datatype} "
                    f"{_shape(got.shape)} elsewhere: {why}",
                )
            else:
                self.request[source.tensor] = _merge(got, want)
            return
        produced = self.produced.get(source.step)
        spec = next((o for o in produced or () if o.name == source.tensor), None)
        if spec is not None and (why := _mismatch(spec, want)):
            self.fail(loc, f"{text}: {why}")

    def _step(self, i: int, sigs: list[ModelSignature | None]) -> PlannedStep:
        step = self.spec.steps[i]
        inputs: list[tuple[str, Source]] = []
        deps: set[str] = set()
        moe: MoePlan | None = None
        if step.moe is not None:
            router = self._source(step.moe.router, ("steps", i, "moe", "router"), step.name)
            if router is not None:
                self._check_router(i, router, len(step.moe.experts))
                if router.step is not None:
                    deps.add(router.step)
                else:
                    self.fail(
                        ("steps", i, "moe", "router"), "the router scores must come from a step"
                    )
            moe = MoePlan(
                router=router or Source(None, ""),
                experts=tuple(ModelRef(e.model, e.version) for e in step.moe.experts),
                top_k=step.moe.top_k,
                weights=step.moe.weights,
                output=step.moe.output,
            )
        for name, text in step.inputs.items():
            source = self._source(text, ("steps", i, "inputs", name), step.name)
            if source is None:
                continue
            inputs.append((name, source))
            if source.step is not None:
                deps.add(source.step)
        for j, sig in enumerate(sigs):
            if sig is not None:
                self._check_inputs(i, j if step.moe else None, sig, dict(inputs))
        return PlannedStep(
            name=step.name,
            model=ModelRef(step.model, step.version) if step.model is not None else None,
            moe=moe,
            inputs=tuple(inputs),
            deps=frozenset(deps),
            outputs=self.produced.get(step.name, ()),
            cached=step.cache,
        )

    def _check_inputs(
        self, i: int, expert: int | None, sig: ModelSignature, mapped: dict[str, Source]
    ) -> None:
        step = self.spec.steps[i]
        who = f"model {sig.name!r}" if expert is None else f"expert {sig.name!r}"
        wanted = {s.name: s for s in sig.inputs}
        for name in step.inputs:
            if name not in wanted:
                known = ", ".join(wanted) or "none"
                self.fail(
                    ("steps", i, "inputs", name),
                    f"{who} has no input {name!r}; its inputs: {known}",
                )
        missing = [n for n in wanted if n not in step.inputs]
        if missing:
            self.fail(("steps", i, "inputs"), f"{who} input(s) {', '.join(missing)} are not mapped")
        for name, source in mapped.items():
            if name in wanted:
                self._feed(source, wanted[name], ("steps", i, "inputs", name), step.inputs[name])

    def _check_router(self, i: int, router: Source, experts: int) -> None:
        if router.step is None:
            return
        spec = next(
            (o for o in self.produced.get(router.step, ()) if o.name == router.tensor), None
        )
        if spec is None:
            return
        loc = ("steps", i, "moe", "router")
        if spec.datatype not in FLOAT_TYPES:
            self.fail(
                loc,
                f"router scores {router.step}.{router.tensor} are {spec.datatype}; "
                "they must be FP16, FP32 or FP64",
            )
        elif len(spec.shape) != 2 or spec.shape[1] not in (-1, experts):
            self.fail(
                loc,
                f"router scores {router.step}.{router.tensor} have shape "
                f"{_shape(spec.shape)}; a mixture of {experts} experts needs [-1, {experts}]",
            )

    def _order(self, steps: list[PlannedStep]) -> list[str]:
        sorter = graphlib.TopologicalSorter({s.name: s.deps for s in steps})
        try:
            return list(sorter.static_order())
        except graphlib.CycleError as e:
            cycle = e.args[1]
            first = next(i for i, s in enumerate(self.spec.steps) if s.name == cycle[0])
            self.fail(("steps", first), f"steps form a cycle: {' -> '.join(cycle)}")
            return [s.name for s in steps]

    def _outputs(self) -> list[tuple[TensorSpec, Source]]:
        outputs = []
        for name, text in self.spec.outputs.items():
            source = self._source(text, ("outputs", name), "")
            if source is None or source.step is None:
                continue
            spec = next(
                (o for o in self.produced.get(source.step, ()) if o.name == source.tensor), None
            )
            if spec is not None:
                outputs.append((TensorSpec(name, spec.datatype, spec.shape), source))
        return outputs

    def _check_used(
        self, steps: list[PlannedStep], outputs: list[tuple[TensorSpec, Source]]
    ) -> None:
        """Every step must feed an output, directly or through other steps."""
        deps = {s.name: s.deps for s in steps}
        used: set[str] = set()
        todo = [src.step for _, src in outputs if src.step is not None]
        while todo:
            name = todo.pop()
            if name not in used:
                used.add(name)
                todo.extend(deps.get(name, ()))
        for i, step in enumerate(self.spec.steps):
            if step.name not in used and not self.problems:
                self.fail(("steps", i, "name"), f"step {step.name!r} feeds no pipeline output")


def build_pipeline_plan(
    spec: PipelineSpec, signature: Callable[[ModelRef], ModelSignature]
) -> PipelinePlan:
    """Check ``spec`` against the models ``signature`` describes (it raises LookupError for
    one not served) and order its steps; raises PlanProblems with every problem found."""
    return _Planner(spec, signature).plan()
