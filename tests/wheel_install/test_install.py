"""A fresh venv, the built wheel, plain pip: the product works with no step after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.wheel_install.smoke import (
    assert_demo_runs,
    assert_no_file_of_another_distribution,
    assert_serves,
)
from tests.wheel_install.venvs import ROOT, Venv

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(900)]


def test_all_extra_installs_cleanly_and_demo_and_serve_work(wheel: Path, tmp_path: Path) -> None:
    env = Venv(tmp_path / "venv")
    env.install(f"inferway[all] @ {wheel.as_uri()}")
    env.check()
    assert_no_file_of_another_distribution(env)
    assert_demo_runs(env)
    assert_serves(env, tmp_path)


def test_gateway_extra_runs_the_control_plane_without_numerics(wheel: Path, tmp_path: Path) -> None:
    env = Venv(tmp_path / "venv")
    env.install(f"inferway[gateway] @ {wheel.as_uri()}")
    env.check()
    absent = env.run(str(env.python), "-c", "import numpy")
    assert absent.returncode != 0, "numpy must not come with the gateway extra"
    policy = ROOT / "examples" / "canary.yaml"
    for command in ("validate", "render"):
        result = env.run(str(env.bin / "inferway"), command, "-f", str(policy), cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
    runtime = env.run(
        str(env.python),
        "-c",
        "import inferway.gateway.runtime, inferway.gateway.cli;"
        "from inferway.xds.envoy_binary import find_envoy; print(find_envoy())",
    )
    assert runtime.returncode == 0 and "envoy" in runtime.stdout, runtime.stderr
