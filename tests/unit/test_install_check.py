"""The backend commands' check for numpy/onnx/onnxruntime (inferway/backends/install_check.py).
The real gateway-only install, where the check fires, is tests/wheel_install/test_install.py's."""

from __future__ import annotations

import sys

import pytest

from inferway.backends.install_check import missing_backend_message, missing_backend_modules
from inferway.cli import serve as backend_cli
from inferway.exit_codes import EXIT_CANNOT_START


def test_this_environment_has_the_backend() -> None:
    assert missing_backend_modules() == []


def test_a_module_that_cannot_be_found_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # a None entry in sys.modules makes find_spec raise ValueError; a finder-less name is what
    # an uninstalled module looks like, so hide onnx behind a meta-path finder that refuses it
    class Refuse:
        @staticmethod
        def find_spec(name: str, *args: object) -> None:
            return None

    monkeypatch.setattr(sys, "meta_path", [Refuse()])
    for name in ("numpy", "onnx", "onnxruntime"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert missing_backend_modules() == ["numpy", "onnx", "onnxruntime"]


def test_the_message_names_each_install_that_brings_the_backend() -> None:
    text = missing_backend_message("serve", ["onnxruntime"])
    assert text.startswith("inferway serve needs the inference backend, and onnxruntime")
    for install in ("pip install inferway`", "inferway-backend", "inferway-gpu"):
        assert install in text


def test_serve_exits_with_the_cli_code_for_an_unmet_precondition() -> None:
    assert backend_cli._EXIT_CANNOT_START == EXIT_CANNOT_START
