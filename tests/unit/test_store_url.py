"""``--store URL`` parsing: what each form means, and errors that say what was wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferway.gateway.fleet.file_store import FileStore
from inferway.gateway.fleet.store_url import StoreUrlError, open_store, parse_etcd_endpoints


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
