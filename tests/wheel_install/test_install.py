"""Fresh venvs, the built wheels, plain ``pip install <name>``: each distribution does its job
with no step after the install (docs/install.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.wheel_install.smoke import (
    assert_demo_runs,
    assert_installed_from,
    assert_no_file_of_another_distribution,
    assert_runs,
    assert_serves,
)
from tests.wheel_install.trees import CPU, ENVOY, GPU, assert_tree, protobuf_floor
from tests.wheel_install.venvs import ROOT, Venv

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def product(wheels: dict[str, Path], dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """``pip install inferway``: no extra, no version, nothing after it."""
    env = Venv(tmp_path_factory.mktemp("product") / "venv")
    env.install("inferway", find_links=dist)
    return env


def test_plain_install_is_clean_and_comes_from_the_built_wheels(
    product: Venv, wheels: dict[str, Path]
) -> None:
    product.check()
    assert_installed_from(product, wheels, "inferway", "inferway-core")
    assert_tree(product.installed(), ENVOY | CPU, {"onnxruntime-gpu"})
    assert_no_file_of_another_distribution(product)
    version = wheels["inferway-core"].name.split("-")[1]
    shown = product.inferway("--version")
    assert (shown.returncode, shown.stdout) == (0, f"inferway {version}\n"), shown.stderr


def test_plain_install_runs_the_demo_with_tracing(product: Venv) -> None:
    assert_demo_runs(product)


def test_plain_install_serves(product: Venv, tmp_path: Path) -> None:
    assert_serves(product, tmp_path)


def test_plain_install_runs_the_gateway(product: Venv, tmp_path: Path) -> None:
    assert_runs(product, tmp_path)


def test_plain_install_builds_envoys_native_sse_reader(product: Venv, tmp_path: Path) -> None:
    """The wheel carries the module's C sources; the installed package builds the module
    Envoy loads (docs/llm.md, the native stream reader)."""
    code = (
        "import sys, pathlib; from inferway.xds.sse_module_build import build_sse_module; "
        "print(build_sse_module(pathlib.Path(sys.argv[1])))"
    )
    built = product.run(str(product.bin / "python"), "-c", code, str(tmp_path))
    assert built.returncode == 0, built.stderr
    assert (Path(built.stdout.strip()) / "libinferway_sse.so").is_file()


def test_gateway_alone_runs_the_control_plane_without_numerics(
    wheels: dict[str, Path], dist: Path, tmp_path: Path
) -> None:
    env = Venv(tmp_path / "venv")
    env.install("inferway-gateway", find_links=dist)
    env.check()
    assert_installed_from(env, wheels, "inferway-gateway", "inferway-core")
    assert_tree(env.installed(), ENVOY, CPU | GPU)
    policy = ROOT / "examples" / "canary.yaml"
    for command in ("validate", "render"):
        result = env.inferway(command, "-f", str(policy))
        assert result.returncode == 0, result.stdout + result.stderr
    assert_runs(env, tmp_path)
    # the backend's commands say which install brings the backend (exit 2: cannot start here)
    for command in (("serve", str(tmp_path)), ("demo", "--once")):
        refused = env.inferway(*command)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "pip install inferway-backend" in refused.stderr, refused.stderr


def test_uv_installs_the_same_product(wheels: dict[str, Path], dist: Path, tmp_path: Path) -> None:
    """The layout has no install-order dependency, so uv's resolver and installer give the
    same clean environment as pip's."""
    env = Venv(tmp_path / "venv")
    env.uv_install("inferway", find_links=dist)
    env.uv_check()
    assert_installed_from(env, wheels, "inferway", "inferway-core")
    assert_tree(env.installed(), ENVOY | CPU, {"onnxruntime-gpu"})
    assert_no_file_of_another_distribution(env)
    assert_serves(env, tmp_path)


def test_the_oldest_protobuf_the_metadata_allows_loads_the_generated_code(
    dist: Path, tmp_path: Path
) -> None:
    """The OIP stubs and the Envoy API copy under ``protobuf==<floor>`` (uv: quick): imported,
    a policy rendered to Envoy resources, the OIP messages built in their private pool."""
    env = Venv(tmp_path / "venv")
    floor = protobuf_floor()
    env.uv_install("inferway", f"protobuf=={floor}", find_links=dist)
    env.uv_check()
    probe = env.run(
        str(env.python),
        "-c",
        "import google.protobuf, inferway.backends.protocol as oip, inferway.xds.translate;"
        "print(google.protobuf.__version__, oip.pb2.ServerLiveRequest.DESCRIPTOR.full_name)",
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == [floor, "inference.ServerLiveRequest"], probe.stdout
    rendered = env.inferway("render", "-f", str(ROOT / "examples" / "canary.yaml"))
    assert rendered.returncode == 0 and "envoy.config.cluster.v3.Cluster" in rendered.stdout, (
        rendered.stdout + rendered.stderr
    )
