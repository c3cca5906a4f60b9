"""``--store URL`` (or the policy's ``fleet.store``) -> a :class:`Store`, with errors that say
what was wrong with the URL."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from inferway.gateway.fleet.store import Store

__all__ = ["StoreUrlError", "open_store", "parse_etcd_endpoints", "parse_kubernetes_url"]

ETCD_DEFAULT_PORT = 2379


class StoreUrlError(ValueError):
    """The store URL cannot be used; the message says why and what is accepted."""


_ACCEPTED = "file:PATH, etcd://HOST:PORT[,HOST:PORT...][/PREFIX] or kubernetes://NAMESPACE[/PREFIX]"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


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


def parse_kubernetes_url(url: str) -> tuple[str, str]:
    """``kubernetes://inferway/fleet`` -> ("inferway", "fleet"); the prefix is "inferway"
    when none is given."""
    namespace, _, prefix = url.removeprefix("kubernetes://").partition("/")
    if len(namespace) > 63 or not _DNS_LABEL.match(namespace):
        raise StoreUrlError(
            f"store {url!r}: {namespace or '(none)'!r} is not a namespace (lowercase letters, "
            "digits and '-'); use kubernetes://NAMESPACE[/PREFIX]"
        )
    prefix = prefix.strip("/") or "inferway"
    if len(prefix) > 40 or not _DNS_LABEL.match(prefix):
        raise StoreUrlError(
            f"store {url!r}: prefix {prefix!r} must be lowercase letters, digits and '-' "
            "(at most 40): it starts the name of every object the store writes"
        )
    return namespace, prefix


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
        namespace, prefix = parse_kubernetes_url(url)
        try:
            from inferway.gateway.fleet.kubernetes_store import KubernetesStore
        except ImportError as error:
            raise StoreUrlError(
                f"store {url!r}: needs the `kubernetes` package ({error.name} is missing): "
                "install inferway[kubernetes]"
            ) from None
        try:
            return KubernetesStore.from_environment(namespace, prefix)
        except ValueError as error:
            raise StoreUrlError(str(error)) from None
    raise StoreUrlError(f"store {url!r}: unknown scheme {scheme or '(none)'!r}; use {_ACCEPTED}")
