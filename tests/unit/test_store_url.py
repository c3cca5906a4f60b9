"""``--store URL`` parsing: what each form means, and errors that say what was wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from inferway.gateway.fleet.file_store import FileStore
from inferway.gateway.fleet.kubernetes_store import KubernetesStore
from inferway.gateway.fleet.store_url import (
    StoreUrlError,
    open_store,
    parse_etcd_endpoints,
    parse_kubernetes_url,
)


def test_an_etcd_url_lists_endpoints_with_default_ports_and_a_key_prefix() -> None:
    assert parse_etcd_endpoints("etcd://127.0.0.2:2381,127.0.0.3/fleet") == (
        [("127.0.0.2", 2381), ("127.0.0.3", 2379)],
        "/fleet",
    )
    assert parse_etcd_endpoints("etcd://[::1]:2379") == ([("::1", 2379)], "/inferway")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("etcd://h:70000", "'h:70000' is not HOST:PORT"),
        ("etcd://:2379", "':2379' is not HOST:PORT"),
        ("redis://x", "unknown scheme 'redis'"),
        ("just-a-path", "unknown scheme '(none)'"),
    ],
)
def test_a_bad_store_url_says_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(StoreUrlError, match=re.escape(message)):
        open_store(url, workdir=Path("."))


def test_file_with_no_path_is_the_workdirs_store(tmp_path: Path) -> None:
    store = open_store("file:", workdir=tmp_path)
    assert isinstance(store, FileStore) and store.root == tmp_path / "store"
    assert open_store(f"file:{tmp_path}/x", workdir=tmp_path).url == f"file:{tmp_path}/x"


def test_a_kubernetes_url_names_a_namespace_and_an_object_prefix() -> None:
    assert parse_kubernetes_url("kubernetes://inferway") == ("inferway", "inferway")
    assert parse_kubernetes_url("kubernetes://team-a/fleet-1/") == ("team-a", "fleet-1")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("kubernetes://", "'(none)' is not a namespace"),
        ("kubernetes://Team_A", "'Team_A' is not a namespace"),
        ("kubernetes://inferway/Fleet", "prefix 'Fleet' must be lowercase letters"),
    ],
)
def test_a_bad_kubernetes_url_says_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(StoreUrlError, match=re.escape(message)):
        open_store(url, workdir=Path("."))


def test_a_kubernetes_store_outside_a_pod_uses_the_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://192.0.2.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    store = open_store("kubernetes://inferway/fleet", workdir=tmp_path)
    assert isinstance(store, KubernetesStore)
    assert store.url == "kubernetes://inferway/fleet"
    assert store.core.api_client.configuration.host == "https://192.0.2.1:6443"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(StoreUrlError, match="no credentials: not in a pod"):
        open_store("kubernetes://inferway", workdir=tmp_path)
