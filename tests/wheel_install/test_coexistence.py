"""inferway in one environment with the ML-serving ecosystem's usual packages.

Each case: a fresh venv, ``inferway`` (the whole CPU product) from the built wheels and the
other package in one ``pip install`` (one resolution, as a user's requirements file), then
``pip check``, no file of inferway's shared with another distribution, and
``inferway demo --once``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.wheel_install.smoke import assert_demo_runs, assert_installed_from, assert_serves
from tests.wheel_install.venvs import Venv, record_overlaps

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(900)]

TRITON_BESIDE_INFERWAY = """
import inferway.backends.protocol as oip  # private descriptor pool: no clash below
import tritonclient.grpc as tc
import tritonclient.grpc.service_pb2 as triton_pb2
assert triton_pb2.ServerLiveRequest.DESCRIPTOR.full_name == "inference.ServerLiveRequest"
assert oip.pb2.ServerLiveRequest.DESCRIPTOR.full_name == "inference.ServerLiveRequest"
client = tc.InferenceServerClient("127.0.0.1:PORT")
assert client.is_server_live() and client.is_model_ready("demo")
assert client.get_model_metadata("demo").name == "demo"
"""


@pytest.mark.parametrize(
    "other", ["tritonclient[all]>=2.73", "kserve>=0.21", "ray[serve]", "bentoml"]
)
def test_installs_beside(other: str, wheels: dict[str, Path], dist: Path, tmp_path: Path) -> None:
    env = Venv(tmp_path / "venv")
    env.install("inferway", other, find_links=dist)
    env.check()
    assert_installed_from(env, wheels, "inferway", "inferway-core")
    overlaps = record_overlaps(env.site_packages())
    assert not {p: d for p, d in overlaps.items() if any("inferway" in x for x in d)}
    assert_demo_runs(env)
    if other.startswith("tritonclient"):
        assert_serves(env, tmp_path, grpc_client=TRITON_BESIDE_INFERWAY)
