"""config.yaml parsing: defaults, good files, and errors that name file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.backends.models.config import (
    ModelConfig,
    ModelConfigError,
    load_model_config,
    resolve_model_config_path,
)


def test_absent_and_empty_config_mean_defaults(tmp_path) -> None:
    empty = tmp_path / "config.yaml"
    empty.write_text("")
    cfg = load_model_config(empty)
    assert cfg == ModelConfig()
    assert cfg.provider == "auto"
    assert cfg.fp16 is False
    assert cfg.instances == 1
    assert cfg.batching.mode == "adaptive"


def test_full_config_is_read(tmp_path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "provider: cpu\nfp16: true\nmax_input_bytes: 1024\nintra_op_threads: 1\n"
        "batching:\n  mode: fixed\n  max_batch_size: 16\n  instances: 2\n"
    )
    cfg = load_model_config(path)
    assert cfg.provider == "cpu"
    assert cfg.fp16 is True
    assert cfg.max_input_bytes == 1024
    assert cfg.intra_op_threads == 1
    assert cfg.batching.mode == "fixed"
    assert cfg.batching.max_batch_size == 16
    assert cfg.instances == 2


def test_every_problem_is_reported_with_file_line_and_field(tmp_path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("provider: gpu\nbatching:\n  max_batch_size: 0\n  bogus: 1\nunknown_key: 2\n")
    with pytest.raises(ModelConfigError) as info:
        load_model_config(path)
    problems = info.value.problems
    assert len(problems) == 4
    assert problems[0].startswith(f"{path}:1: provider:")
    assert f"{path}:3: batching.max_batch_size:" in problems[1]
    assert problems[2] == f"{path}:4: batching.bogus: unknown setting"
    assert problems[3] == f"{path}:5: unknown_key: unknown setting"


def test_invalid_yaml_and_non_mapping_are_located(tmp_path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("batching: [unclosed\n")
    with pytest.raises(ModelConfigError, match=r"config\.yaml:\d+:\d+: invalid YAML"):
        load_model_config(path)
    path.write_text("- just\n- a list\n")
    with pytest.raises(ModelConfigError, match="expected a mapping"):
        load_model_config(path)


def test_version_level_config_wins_over_model_level(tmp_path) -> None:
    model_dir = tmp_path / "demo"
    v1 = model_dir / "1"
    v1.mkdir(parents=True)
    assert resolve_model_config_path(model_dir, v1) is None
    (model_dir / "config.yaml").write_text("provider: cpu\n")
    assert resolve_model_config_path(model_dir, v1) == model_dir / "config.yaml"
    (v1 / "config.yaml").write_text("fp16: true\n")
    assert resolve_model_config_path(model_dir, v1) == v1 / "config.yaml"


@pytest.mark.parametrize("spelling", ["off", "Off", "no", "false", '"off"'])
def test_batching_mode_off_unquoted_is_read_as_off(tmp_path, spelling: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"batching:\n  mode: {spelling}\n")
    assert load_model_config(path).batching.mode == "off"


def _only_problem(path: Path, text: str) -> str:
    path.write_text(text)
    with pytest.raises(ModelConfigError) as info:
        load_model_config(path)
    (problem,) = info.value.problems
    return problem


@pytest.mark.parametrize("spelling", ["on", "yes", "true"])
def test_batching_mode_read_as_true_says_to_quote_it(tmp_path, spelling: str) -> None:
    path = tmp_path / "config.yaml"
    problem = _only_problem(path, f"batching:\n  mode: {spelling}\n")
    assert problem.startswith(f"{path}:2: batching.mode: ")
    assert "unquoted on/yes/true" in problem and "quote it" in problem


@pytest.mark.parametrize(("spelling", "read_as"), [("off", "false"), ("yes", "true")])
def test_another_choice_read_as_a_boolean_says_to_quote_it(
    tmp_path, spelling: str, read_as: str
) -> None:
    path = tmp_path / "config.yaml"
    problem = _only_problem(path, f"fp16: true\nprovider: {spelling}\n")
    assert problem.startswith(f"{path}:2: provider: Input should be 'auto'")
    assert f"got {read_as} (YAML reads an unquoted yes, no, on, off as a boolean" in problem
