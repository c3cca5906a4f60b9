"""Golden tests for the translator: tests/golden/<case>/policy.yaml -> expected.yaml.

``INFERWAY_UPDATE_GOLDEN=1`` (``make golden``) rewrites every expected.yaml and prunes case
directories whose policy.yaml is gone; review the diff like any code change. Every golden
output must also pass real Envoy's ``--mode validate``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from inferway.policies import Policy, load_policy
from inferway.resolve import resolve_policy
from inferway.xds.envoy_binary import find_envoy
from inferway.xds.resources import resources_to_yaml
from inferway.xds.translate import translate
from inferway.xds.translate.validation import build_envoy_validation_bootstrap

GOLDEN = Path(__file__).parent
UPDATE = os.environ.get("INFERWAY_UPDATE_GOLDEN") == "1"
CASES = sorted(p.parent.name for p in GOLDEN.glob("*/policy.yaml"))


def _load_policy(path: Path) -> Policy:
    """Through the real loader, so every golden input also passes the policy checks."""
    return load_policy(path)


def _stale_case_dirs() -> list[Path]:
    return [
        d
        for d in sorted(GOLDEN.iterdir())
        if d.is_dir()
        and not d.name.startswith(("_", "."))
        and not (d / "policy.yaml").exists()
        and (d / "expected.yaml").exists()
    ]


def test_golden_cases_exist() -> None:
    assert len(CASES) >= 8, f"expected the golden cases under {GOLDEN}, found {CASES}"


def test_no_stale_golden_dirs() -> None:
    stale = _stale_case_dirs()
    if UPDATE:
        for case_dir in stale:
            (case_dir / "expected.yaml").unlink()
            if not any(case_dir.iterdir()):
                case_dir.rmdir()
        stale = _stale_case_dirs()
    assert not stale, f"golden dirs without policy.yaml (run `make golden`): {stale}"


@pytest.mark.parametrize("case", CASES)
def test_translation_matches_golden(case: str) -> None:
    case_dir = GOLDEN / case
    rendered = resources_to_yaml(translate(resolve_policy(_load_policy(case_dir / "policy.yaml"))))
    expected_path = case_dir / "expected.yaml"
    if UPDATE:
        expected_path.write_text(rendered)
    assert expected_path.exists(), f"{expected_path} missing: run `make golden`"
    assert rendered == expected_path.read_text(), (
        f"translation of {case_dir / 'policy.yaml'} differs from {expected_path}; "
        "if the change is intended, run `make golden` and review the diff"
    )


@pytest.mark.integration
@pytest.mark.parametrize("case", CASES)
def test_golden_output_passes_envoy_validate(case: str, tmp_path: Path) -> None:
    resources = translate(resolve_policy(_load_policy(GOLDEN / case / "policy.yaml")))
    config = tmp_path / "bootstrap.yaml"
    config.write_text(yaml.safe_dump(build_envoy_validation_bootstrap(resources)))
    result = subprocess.run(
        [find_envoy(), "--mode", "validate", "-c", str(config), "--log-level", "warn"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, (
        f"envoy --mode validate rejected case {case!r} (exit {result.returncode}):\n"
        f"{result.stderr}\n{result.stdout}\nconfig:\n{config.read_text()}"
    )
    assert "OK" in result.stdout + result.stderr
