"""The Envoy bootstrap: shape, validation by the real Envoy, and the YAML writer."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from inferway.xds.bootstrap import XDS_CLUSTER_NAME, build_bootstrap, write_bootstrap
from inferway.xds.envoy_binary import find_envoy


def test_bootstrap_points_ads_at_the_control_plane() -> None:
    boot = build_bootstrap(node_id="n1", node_cluster="c1", xds_port=18000, admin_port=9901)
    assert boot["node"] == {"id": "n1", "cluster": "c1"}
    ads = boot["dynamic_resources"]["ads_config"]
    assert ads["api_type"] == "GRPC" and ads["set_node_on_first_message_only"] is True
    assert ads["grpc_services"] == [{"envoy_grpc": {"cluster_name": XDS_CLUSTER_NAME}}]
    for key in ("lds_config", "cds_config"):
        assert boot["dynamic_resources"][key] == {"ads": {}, "resource_api_version": "V3"}
    (cluster,) = boot["static_resources"]["clusters"]
    assert cluster["type"] == "STATIC"
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 18000}
    admin = boot["admin"]["address"]["socket_address"]
    assert admin == {"address": "127.0.0.1", "port_value": 9901}


def test_a_host_name_uses_dns() -> None:
    boot = build_bootstrap(node_id="n1", xds_host="control-plane", xds_port=1, admin_port=0)
    assert boot["static_resources"]["clusters"][0]["type"] == "STRICT_DNS"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_id": "", "xds_port": 1, "admin_port": 0}, "node_id"),
        ({"node_id": "n", "xds_port": 0, "admin_port": 0}, "xds_port 0"),
        ({"node_id": "n", "xds_port": 1, "admin_port": 70000}, "admin_port 70000"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_bootstrap(**kwargs)


@pytest.mark.integration
def test_real_envoy_validates_the_written_bootstrap(tmp_path) -> None:
    boot = build_bootstrap(node_id="n1", xds_port=18000, admin_port=0)
    path = write_bootstrap(tmp_path / "deep" / "bootstrap.yaml", boot)
    assert yaml.safe_load(path.read_text()) == boot
    result = subprocess.run(
        [
            find_envoy(),
            "--mode",
            "validate",
            "-c",
            str(path),
            "--disable-hot-restart",
            "-l",
            "error",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
