"""``--store URL`` (or the policy's ``fleet.store``) -> a :class:`Store`, with errors that say
what was wrong with the URL."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from inferway.gateway.fleet.store import Store

__all__ = ["StoreUrlError", "open_store", "parse_etcd_endpoints"]

ETCD_DEFAULT_PORT = 2379


class StoreUrlError(ValueError):
    """The store URL cannot be used; the message says why and what is accepted."""


_ACCEPTED = "file:PATH, etcd://HOST:PORT[,HOST:PORT...][/PREFIX] or kubernetes://NAMESPACE"


def parse_etcd_endpoints(url: str) -> tuple[list[tuple[str, int]], str]:
    """``etcd://h1:2379,h2:2379/prefix`` -> ([(h1, 2379), (h2, 2379)], "/prefix")."""
    rest = url.removeprefix("etcd://")
    hosts, _, path = rest.partition("/")
    endpoints = []
    for part in hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = part.strip(), str(ETCD_DEFAULT_PORT)
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise StoreUrlError(f"store {url!r}: {part!r} is not HOST:PORT (port 1-65535)")
        endpoints.append((host, int(port)))
    return endpoints, "/" + (path.strip("/") or "inferway")


def open_store(url: str, *, workdir: Path) -> Store:
    """The store ``url`` names. ``file:`` with no path is ``workdir/store``."""
    scheme = urlsplit(url).scheme
    if scheme == "file" or url == "file:":
        from inferway.gateway.fleet.file_store import FileStore

        path = url.removeprefix("file://").removeprefix("file:")
        return FileStore(Path(path) if path else workdir / "store")
    if scheme == "etcd":
        from inferway.gateway.fleet.etcd_store import EtcdStore

        endpoints, prefix = parse_etcd_endpoints(url)
        return EtcdStore(endpoints, prefix)
    if scheme == "kubernetes":
        raise StoreUrlError(
            f"store {url!r}: the kubernetes store is not available in this version; use "
            f"file: (one node) or etcd://"
        )
    raise StoreUrlError(f"store {url!r}: unknown scheme {scheme or '(none)'!r}; use {_ACCEPTED}")
