"""Golden tests of the translator: tests/golden/translate/<case>/ir.yaml -> one file per
Envoy resource type the translator produced (listeners.yaml, routes.yaml, clusters.yaml,
endpoints.yaml, and secrets.yaml when the IR holds TLS material). An IR with gRPC targets
also gets what proxyless gRPC clients receive (``translate_proxyless``), as grpc-<type>.yaml.

Each case's ir.yaml is the output of the resolve case of the same name (checked here, copied
under ``INFERWAY_UPDATE_GOLDEN=1``), so policy -> IR -> Envoy is covered end to end while each
layer is read on its own. Every output must also pass real Envoy's ``--mode validate``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from inferway.resolve import ir_from_yaml
from inferway.xds import type_urls
from inferway.xds.envoy_binary import find_envoy
from inferway.xds.resources import Resources, resources_to_dict
from inferway.xds.translate import translate
from inferway.xds.translate.proxyless import translate_proxyless
from inferway.xds.translate.validation import build_envoy_validation_bootstrap
from tests.golden.golden_files import (
    RESOLVE,
    TRANSLATE,
    UPDATE,
    check_text,
    prune_case_dirs,
    prune_case_files,
    refused_cases,
    resolve_cases,
)

CASES = sorted(set(resolve_cases()) - set(refused_cases(tuple(resolve_cases()))))
"""Every resolve case that yields an IR has a translate case (refused ones have none)."""
OUTPUTS = tuple(f"{type_urls.SHORT_NAMES[t]}.yaml" for t in type_urls.PUSH_ORDER)
PROXYLESS_PREFIX = "grpc-"


def render_by_type(resources: Resources) -> dict[str, str]:
    """File name -> sorted YAML of that type's resources, for each type the translator
    produced (an empty EDS set, from hostname-only services, is output too: the snapshot
    answers for it; there are no secrets without TLS material)."""
    return {
        f"{key}.yaml": yaml.safe_dump({key: items}, sort_keys=True, default_flow_style=False)
        for key, items in resources_to_dict(resources).items()
    }


def translate_case(case: str) -> Resources:
    return translate(ir_from_yaml((TRANSLATE / case / "ir.yaml").read_text()))


def render_proxyless_case(case: str) -> dict[str, str]:
    """grpc-<type>.yaml for each type a proxyless client gets; nothing without targets."""
    ir = ir_from_yaml((TRANSLATE / case / "ir.yaml").read_text())
    if not ir.grpc_targets:
        return {}
    rendered = render_by_type(translate_proxyless(ir))
    return {PROXYLESS_PREFIX + name: text for name, text in rendered.items()}


def test_translate_cases_exist() -> None:
    assert len(CASES) >= 25, f"expected the golden cases under {RESOLVE}, found {CASES}"


def test_no_stale_translate_case_dirs() -> None:
    stale = prune_case_dirs(TRANSLATE, CASES)
    assert not stale, f"translate golden dirs without a resolve case (run `make golden`): {stale}"


@pytest.mark.parametrize("case", CASES)
def test_translate_input_is_the_resolve_output(case: str) -> None:
    check_text(
        TRANSLATE / case / "ir.yaml",
        (RESOLVE / case / "ir.yaml").read_text(),
        f"the IR resolved for {RESOLVE / case}",
    )


@pytest.mark.parametrize("case", CASES)
def test_translation_matches_golden(case: str) -> None:
    case_dir = TRANSLATE / case
    if UPDATE and not (case_dir / "ir.yaml").exists():
        test_translate_input_is_the_resolve_output(case)
    rendered = render_by_type(translate_case(case)) | render_proxyless_case(case)
    for name, text in rendered.items():
        check_text(case_dir / name, text, f"translation of {case_dir / 'ir.yaml'}")
    stale = prune_case_files(case_dir, {"ir.yaml", *rendered})
    assert not stale, f"stale golden files (run `make golden`): {stale}"
    assert set(rendered) <= {*OUTPUTS, *(PROXYLESS_PREFIX + name for name in OUTPUTS)}


@pytest.mark.integration
@pytest.mark.parametrize("case", CASES)
def test_golden_output_passes_envoy_validate(case: str, tmp_path: Path) -> None:
    config = tmp_path / "bootstrap.yaml"
    config.write_text(yaml.safe_dump(build_envoy_validation_bootstrap(translate_case(case))))
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
