"""pipeline.yaml checked and planned without a server: schema errors and every way a step can
fail to line up with its models are refused with the file and line; a good spec becomes a
DAG in dependency order with the pipeline's inputs and outputs derived from its ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.backends.pipelines.plan import (
    ModelRef,
    ModelSignature,
    PlanProblems,
    build_pipeline_plan,
)
from inferway.backends.pipelines.spec import PipelineError, load_pipeline_spec, locate_problems
from inferway.backends.runners.base import TensorSpec


def _sig(
    name: str, inputs: dict[str, tuple[str, tuple[int, ...]]], outputs: dict
) -> ModelSignature:
    return ModelSignature(
        name,
        "1",
        tuple(TensorSpec(n, d, s) for n, (d, s) in inputs.items()),
        tuple(TensorSpec(n, d, s) for n, (d, s) in outputs.items()),
    )


MODELS = {
    "embed": _sig("embed", {"x": ("FP32", (-1, 4))}, {"h": ("FP32", (-1, 8))}),
    "left": _sig("left", {"h": ("FP32", (-1, 8))}, {"y": ("FP32", (-1, 2))}),
    "right": _sig("right", {"h": ("FP32", (-1, 8))}, {"y": ("FP32", (-1, 2))}),
    "ints": _sig("ints", {"h": ("INT64", (-1, 8))}, {"y": ("FP32", (-1, 2))}),
    "wide": _sig("wide", {"h": ("FP32", (-1, 9))}, {"y": ("FP32", (-1, 2))}),
    "router": _sig("router", {"x": ("FP32", (-1, 4))}, {"s": ("FP32", (-1, 3))}),
    "expert": _sig("expert", {"x": ("FP32", (-1, 4))}, {"y": ("FP32", (-1, 5))}),
    "loop": _sig("loop", {"h": ("FP32", (-1, 8))}, {"h": ("FP32", (-1, 8))}),
    "expert_int": _sig("expert_int", {"x": ("FP32", (-1, 4))}, {"y": ("INT64", (-1, 5))}),
}


def signature(ref: ModelRef) -> ModelSignature:
    if ref.name not in MODELS:
        raise LookupError(f"model {ref.name!r} not found; available: {', '.join(MODELS)}")
    if ref.version not in (None, "1"):
        raise LookupError(f"model {ref.name!r} has no version {ref.version}; available: 1")
    return MODELS[ref.name]


CHAIN = """\
steps:
  - name: embed
    model: embed
    inputs: {x: request.x}
  - name: left
    model: left
    inputs: {h: embed.h}
  - name: right
    model: right
    inputs: {h: embed.h}
outputs:
  l: left.y
  r: right.y
"""


def _plan(tmp_path: Path, text: str):
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    spec, tree = load_pipeline_spec(path)
    try:
        return build_pipeline_plan(spec, signature)
    except PlanProblems as p:
        raise locate_problems(path, tree, p.problems) from None


def _refused(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(PipelineError) as info:
        _plan(tmp_path, text)
    return info.value.problems


def test_a_chain_with_two_branches_is_planned_in_dependency_order(tmp_path: Path) -> None:
    plan = _plan(tmp_path, CHAIN)
    names = [s.name for s in plan.steps]
    assert names[0] == "embed" and set(names[1:]) == {"left", "right"}
    by_name = {s.name: s for s in plan.steps}
    assert by_name["left"].deps == {"embed"} and by_name["embed"].deps == frozenset()
    assert plan.inputs == (TensorSpec("x", "FP32", (-1, 4)),)
    assert [(spec.name, src.step, src.tensor) for spec, src in plan.outputs] == [
        ("l", "left", "y"),
        ("r", "right", "y"),
    ]
    assert plan.outputs[0][0] == TensorSpec("l", "FP32", (-1, 2))


def test_steps_may_be_listed_in_any_order(tmp_path: Path) -> None:
    text = CHAIN.replace("  - name: embed\n    model: embed\n    inputs: {x: request.x}\n", "")
    text = text.replace(
        "outputs:", "  - name: embed\n    model: embed\n    inputs: {x: request.x}\noutputs:"
    )
    assert _plan(tmp_path, text).steps[0].name == "embed"


@pytest.mark.parametrize(
    ("edit", "line", "expected"),
    [
        (("model: left", "model: nosuch"), 6, "model 'nosuch' not found"),
        (
            ("inputs: {h: embed.h}\n  - name: right", "inputs: {h: embed.q}\n  - name: right"),
            7,
            "step 'embed' has no output 'q'; its outputs: h",
        ),
        (
            ("inputs: {h: embed.h}\n  - name: right", "inputs: {h: nope.h}\n  - name: right"),
            7,
            "'nope.h' names no step",
        ),
        (("model: left", "model: ints"), 7, "dtype FP32 does not match the input's INT64"),
        (("model: left", "model: wide"), 7, "shape [-1, 8] does not fit the input's [-1, 9]"),
        (
            ("inputs: {h: embed.h}\n  - name: right", "inputs: {z: embed.h}\n  - name: right"),
            7,
            "model 'left' has no input 'z'",
        ),
        (("l: left.y", "l: left.nope"), 12, "step 'left' has no output 'nope'"),
    ],
)
def test_a_step_that_does_not_line_up_is_refused_at_its_line(
    tmp_path: Path, edit: tuple[str, str], line: int, expected: str
) -> None:
    old, new = edit
    assert old in CHAIN
    problems = _refused(tmp_path, CHAIN.replace(old, new, 1))
    assert any(
        p.startswith(f"{tmp_path / 'pipeline.yaml'}:{line}:") and expected in p for p in problems
    ), problems


def test_an_unmapped_model_input_is_named(tmp_path: Path) -> None:
    problems = _refused(tmp_path, CHAIN.replace("    inputs: {x: request.x}\n", "", 1))
    assert any(":2: steps.0.inputs: model 'embed' input(s) x are not mapped" in p for p in problems)


def test_every_problem_is_reported_not_just_the_first(tmp_path: Path) -> None:
    text = CHAIN.replace("model: left", "model: nosuch").replace("model: right", "model: ints")
    problems = _refused(tmp_path, text)
    assert len(problems) == 2 and ":6:" in problems[0] and ":10:" in problems[1]


def test_a_cycle_is_refused_with_its_steps(tmp_path: Path) -> None:
    text = """\
steps:
  - {name: a, model: loop, inputs: {h: b.h}}
  - {name: b, model: loop, inputs: {h: a.h}}
outputs: {y: a.h}
"""
    problems = _refused(tmp_path, text)
    assert len(problems) == 1 and ":2: steps.0: steps form a cycle: " in problems[0], problems


def test_a_step_feeding_no_output_is_refused(tmp_path: Path) -> None:
    problems = _refused(tmp_path, CHAIN.replace("  r: right.y\n", ""))
    assert problems == [
        f"{tmp_path / 'pipeline.yaml'}:8: steps.2.name: step 'right' feeds no pipeline output"
    ]


def test_one_request_input_used_with_two_specs_is_refused(tmp_path: Path) -> None:
    text = """\
steps:
  - {name: a, model: embed, inputs: {x: request.x}}
  - {name: b, model: ints, inputs: {h: request.x}}
outputs: {h: a.h, y: b.y}
"""
    problems = _refused(tmp_path, text)
    assert any(":3:" in p and "request input 'x' is used with FP32" in p for p in problems), (
        problems
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("steps: []\noutputs: {y: a.y}\n", ":1: steps: List should have at least 1 item"),
        (
            "steps:\n  - {name: a, model: m, moe: {router: r.s, experts: [x, y], output: y}}\n"
            "outputs: {y: a.y}\n",
            ":2: steps.0: a step names exactly one of 'model' or 'moe'",
        ),
        (
            "steps:\n  - {name: a, model: m, cache: true}\noutputs: {y: a.y}\n",
            ":2: steps.0: cache: true needs deterministic: true",
        ),
        (
            "steps:\n  - {name: a, model: m, inputs: {x: nodot}}\noutputs: {y: a.y}\n",
            "steps.0.inputs: source 'nodot' must be 'request.<input>' or '<step>.<output>'",
        ),
        (
            "steps:\n  - {name: a, model: m}\n  - {name: a, model: m}\noutputs: {y: a.y}\n",
            "step name 'a' is used twice",
        ),
        (
            "steps:\n  - {name: request, model: m}\noutputs: {y: request.y}\n",
            "names the request's inputs",
        ),
        (
            "steps:\n  - {name: a, model: m, colour: red}\noutputs: {y: a.y}\n",
            ":2: steps.0.colour: unknown setting",
        ),
        ("- a list\n", ":1: expected a mapping with steps and outputs, got list"),
        ("steps: [\n", "invalid YAML"),
    ],
)
def test_schema_errors_are_located(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    with pytest.raises(PipelineError) as info:
        load_pipeline_spec(path)
    assert any(expected in p for p in info.value.problems), info.value.problems
    assert all(p.startswith(str(path)) for p in info.value.problems)


MOE = """\
steps:
  - {name: gate, model: router, inputs: {x: request.x}}
  - name: mix
    moe:
      router: gate.s
      experts: [expert, expert, {model: expert, version: 1}]
      top_k: 2
      output: y
    inputs: {x: request.x}
outputs: {y: mix.y}
"""


def test_a_mixture_is_planned_with_its_experts_and_router(tmp_path: Path) -> None:
    plan = _plan(tmp_path, MOE)
    mix = plan.steps[-1]
    assert mix.moe is not None and mix.deps == {"gate"}
    assert mix.moe.experts == (ModelRef("expert"), ModelRef("expert"), ModelRef("expert", "1"))
    assert mix.moe.top_k == 2 and mix.moe.weights == "softmax"
    assert plan.outputs[0][0] == TensorSpec("y", "FP32", (-1, 5))
    assert len(plan.models()) == 4


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("experts: [expert, expert, {model: expert, version: 1}]", "experts: [expert, expert]"),
            "a mixture of 2 experts needs [-1, 2]",
        ),
        (("top_k: 2", "top_k: 4"), "top_k 4 exceeds the number of experts (3)"),
        (
            ("experts: [expert, expert,", "experts: [expert, expert_int,"),
            "expert 'expert_int' output 'y' is INT64",
        ),
        (("output: y", "output: z"), "expert 'expert' has no output 'z'"),
        (("router: gate.s", "router: request.x"), "the router scores must come from a step"),
    ],
)
def test_a_mixture_that_does_not_line_up_is_refused(
    tmp_path: Path, edit: tuple[str, str], expected: str
) -> None:
    old, new = edit
    assert old in MOE
    problems = _refused(tmp_path, MOE.replace(old, new))
    assert any(expected in p for p in problems), problems
