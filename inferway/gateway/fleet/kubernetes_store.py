"""``kubernetes://NAMESPACE[/PREFIX]``: the fleet's store in the Kubernetes API server, so a
fleet on Kubernetes needs no etcd of its own: the election is a ``coordination.k8s.io/v1``
Lease (kubernetes_lease.py), each record a ConfigMap (kubernetes_objects.py says how and why).

- **Client.** The official ``kubernetes`` package (extra ``inferway[kubernetes]``), the one
  the Deployment scaler already uses. ``kubernetes_asyncio`` is a separate project (generated
  from the same API description, released on its own, over aiohttp); one client for both uses
  is one dependency to keep current. Its calls block, so they run on the store's own threads,
  each with a deadline; a watch holds one thread of its own for as long as it is followed.
- **Writes.** ``expect=0`` creates (409: the key exists); ``expect=N`` patches with
  ``metadata.resourceVersion: N``, which the API server checks (409: it changed); a plain
  write is a JSON merge patch, one request, created on 404. A fenced write reads the Lease and
  the record first and updates the record conditionally on the version it read.
- **Watch.** The API's ``watch`` on the records' labels from the version asked for; when the
  API server no longer has that version (410 Gone, after etcd's compaction) the store lists
  the records again and hands on every one newer than what it delivered, then watches on from
  the list: each key's latest value arrives, intermediate values may not.
- **Credentials.** In a pod its service account (in-cluster config), elsewhere ``$KUBECONFIG``
  or ``~/.kube/config``, as kubectl does. The verbs it needs (and only those) are in
  deploy/kubernetes/fleet/rbac.yaml.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from inferway.gateway.fleet.kubernetes_lease import KubernetesLeases
from inferway.gateway.fleet.kubernetes_objects import (
    KEY_ANNOTATION,
    MAX_VALUE_BYTES,
    STORE_LABEL,
    TERM_ANNOTATION,
    ApiCaller,
    Unreachable,
    config_map_name,
    record_from,
    record_labels,
    resource_version,
    selector,
    unavailable,
    version_of,
)
from inferway.gateway.fleet.store import (
    ConflictError,
    Fence,
    FencedError,
    Leadership,
    Record,
    StoreHealth,
    StoreUnavailableError,
)

__all__ = ["KubernetesStore"]

log = logging.getLogger("inferway.fleet")

MERGE_PATCH = "application/merge-patch+json"
WATCH_S = 60
"""How long one watch request lasts on the API server before the store renews it."""
RETRY_S = 0.5
WRITE_TRIES = 8
"""Conditional writes of one fenced or created record retried on 409 before giving up."""


def _raw(item: Any) -> tuple[dict[str, Any], dict[str, str] | None]:
    """``(metadata, binaryData)`` of a ConfigMap, a client model or a watch event's dict."""
    if isinstance(item, dict):
        return item.get("metadata") or {}, item.get("binaryData")
    meta = item.metadata
    metadata = {
        "name": meta.name,
        "annotations": meta.annotations,
        "resourceVersion": meta.resource_version,
    }
    return metadata, item.binary_data


@dataclass
class _Following:
    """The watch request a follower thread has open, for the generator to stop it."""

    watch: k8s_watch.Watch | None = None


class KubernetesStore:
    def __init__(
        self,
        core: k8s.CoreV1Api,
        coordination: k8s.CoordinationV1Api,
        namespace: str,
        prefix: str = "inferway",
        *,
        timeout: float = 2.0,
        watch_s: int = WATCH_S,
    ) -> None:
        self.core, self.namespace, self.prefix = core, namespace, prefix
        self.url = f"kubernetes://{namespace}/{prefix}"
        self.watch_s = watch_s
        self._call = ApiCaller(timeout)
        self.leases = KubernetesLeases(coordination, self._call, namespace, prefix)
        self._watches: set[threading.Event] = set()

    @classmethod
    def from_environment(cls, namespace: str, prefix: str) -> KubernetesStore:
        """In a pod, its service account; elsewhere ``$KUBECONFIG`` or ``~/.kube/config``."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            try:  # $KUBECONFIG read now (the client reads it once, when it is imported)
                k8s_config.load_kube_config(
                    config_file=os.environ.get("KUBECONFIG") or None,
                    client_configuration=configuration,
                )
            except (k8s_config.ConfigException, OSError) as error:
                raise ValueError(
                    f"store kubernetes://{namespace}: no credentials: not in a pod with a "
                    f"service account, and no kubeconfig ({error})"
                ) from None
        api = k8s.ApiClient(configuration)
        return cls(k8s.CoreV1Api(api), k8s.CoordinationV1Api(api), namespace, prefix)

    # -- records ---------------------------------------------------------------------------

    async def _read(self, key: str) -> tuple[Record, int] | None:
        name = config_map_name(self.prefix, key)
        try:
            found = await self._call(
                "read configmap", self.core.read_namespaced_config_map, name, self.namespace
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise unavailable(f"read configmap {name}", error) from None
        return record_from(*_raw(found), key)

    async def get(self, key: str) -> Record | None:
        found = await self._read(key)
        return None if found is None else found[0]

    async def _list(self, prefix: str) -> tuple[list[Record], str]:
        listing = await self._call(
            "list configmaps",
            self.core.list_namespaced_config_map,
            self.namespace,
            label_selector=selector(self.prefix, prefix),
        )
        records = [record_from(*_raw(item), None)[0] for item in listing.items]
        return [r for r in records if r.key.startswith(prefix)], resource_version(listing)

    async def list(self, prefix: str) -> list[Record]:
        return sorted((await self._list(prefix))[0], key=lambda r: r.key)

    def _object(
        self, key: str, value: bytes, term: int | None, resource_version: str | None
    ) -> dict[str, Any]:
        annotations = {KEY_ANNOTATION: key}
        if term is not None:
            annotations[TERM_ANNOTATION] = str(term)
        metadata: dict[str, Any] = {
            "name": config_map_name(self.prefix, key),
            "labels": record_labels(self.prefix, key),
            "annotations": annotations,
        }
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {"metadata": metadata, "binaryData": {"value": base64.b64encode(value).decode()}}

    async def _create(self, key: str, body: dict[str, Any]) -> Record | None:
        body = {"apiVersion": "v1", "kind": "ConfigMap", **body}
        try:
            made = await self._call(
                "create configmap", self.core.create_namespaced_config_map, self.namespace, body
            )
        except ApiException as error:
            if error.status == 409:
                return None
            raise unavailable(f"create configmap for {key}", error) from None
        return record_from(*_raw(made), key)[0]

    async def _patch(self, key: str, body: dict[str, Any]) -> Record | None:
        """None when the object is missing (404) or changed since the version in ``body``."""
        name = body["metadata"]["name"]
        try:
            patched = await self._call(
                "patch configmap",
                self.core.patch_namespaced_config_map,
                name,
                self.namespace,
                body,
                _content_type=MERGE_PATCH,
            )
        except ApiException as error:
            if error.status in (404, 409):
                return None
            raise unavailable(f"patch configmap {name}", error) from None
        return record_from(*_raw(patched), key)[0]

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, fence: Fence | None = None
    ) -> Record:
        if len(value) > MAX_VALUE_BYTES:
            raise ValueError(
                f"{key}: {len(value)} bytes; the kubernetes store keeps values up to "
                f"{MAX_VALUE_BYTES} (a ConfigMap is at most 1 MiB)"
            )
        if fence is None:
            if expect is None:
                return await self._put_plain(key, value)
            return await self._put_expecting(key, value, expect)
        await self.leases.check(fence, key)
        for _ in range(WRITE_TRIES):
            current = await self._read(key)
            found = current[0].version if current is not None else 0
            if current is not None and current[1] > fence.term:
                raise FencedError(
                    f"{key}: not written, term {current[1]} wrote it after {fence.identity}'s "
                    f"term {fence.term}"
                )
            if expect is not None and found != expect:
                raise ConflictError(key, expect, found)
            if current is None:
                written = await self._create(key, self._object(key, value, fence.term, None))
            else:
                body = self._object(key, value, fence.term, str(found))
                written = await self._patch(key, body)
            if written is not None:
                return written
        raise StoreUnavailableError(
            f"kubernetes put {key}: changed under each of {WRITE_TRIES} tries"
        )

    async def _put_expecting(self, key: str, value: bytes, expect: int) -> Record:
        """A compare-and-set in one request: create (``expect=0``) or a patch conditional on
        ``expect``; the record is read only to say what was found instead."""
        if expect == 0:
            written = await self._create(key, self._object(key, value, None, None))
        else:
            written = await self._patch(key, self._object(key, value, None, str(expect)))
        if written is not None:
            return written
        current = await self._read(key)
        raise ConflictError(key, expect, current[0].version if current is not None else 0)

    async def _put_plain(self, key: str, value: bytes) -> Record:
        """Unconditional: a merge patch leaves the record's term as it was."""
        body = self._object(key, value, None, None)
        for _ in range(WRITE_TRIES):
            written = await self._patch(key, body)
            if written is None:
                written = await self._create(key, body)
            if written is not None:
                return written
        raise StoreUnavailableError(f"kubernetes put {key}: created and deleted under every try")

    # -- watch -----------------------------------------------------------------------------

    async def watch(self, prefix: str, *, after: int = 0) -> AsyncIterator[Record]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Record | Exception] = asyncio.Queue()
        stop = threading.Event()
        current = _Following()

        def emit(item: Record | Exception) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, item)

        follow = threading.Thread(
            target=self._follow,
            args=(prefix, after, emit, stop, current),
            name=f"kubernetes-watch-{prefix}",
            daemon=True,
        )
        self._watches.add(stop)
        follow.start()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            stop.set()
            self._watches.discard(stop)
            if current.watch is not None:
                current.watch.stop()

    def _follow(
        self,
        prefix: str,
        after: int,
        emit: Callable[[Record | Exception], None],
        stop: threading.Event,
        current: _Following,
    ) -> None:
        """In its own thread: list when there is no version to watch from (at the start with
        ``after=0``, after a 410), then watch, renewing the watch as the API server ends it."""
        labels = selector(self.prefix, prefix)
        timeout = self._call.timeout
        delivered, since = after, (str(after) if after > 0 else None)
        while not stop.is_set():
            try:
                if since is None:
                    listing = self.core.list_namespaced_config_map(
                        self.namespace, label_selector=labels, _request_timeout=timeout
                    )
                    found = [record_from(*_raw(i), None)[0] for i in listing.items]
                    for record in sorted(found, key=lambda r: r.version):
                        if record.key.startswith(prefix) and record.version > delivered:
                            delivered = record.version
                            emit(record)
                    since = resource_version(listing)
                watch = k8s_watch.Watch()
                current.watch = watch
                for event in watch.stream(
                    self.core.list_namespaced_config_map,
                    self.namespace,
                    label_selector=labels,
                    resource_version=since,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self.watch_s,
                    _request_timeout=(timeout, self.watch_s + timeout),
                ):
                    if stop.is_set():
                        break
                    raw = event["raw_object"]
                    since = raw["metadata"]["resourceVersion"]
                    if event["type"] not in ("ADDED", "MODIFIED"):
                        continue
                    record = record_from(*_raw(raw), None)[0]
                    if record.key.startswith(prefix) and record.version > delivered:
                        delivered = record.version
                        emit(record)
            except ApiException as error:
                if error.status == 410:
                    log.info("kubernetes watch on %s: version %s is gone; listing", prefix, since)
                    since = None
                    continue
                emit(unavailable(f"watch {prefix}", error))
                return
            except (*Unreachable, StoreUnavailableError) as error:
                if not stop.is_set():
                    log.warning("kubernetes watch on %s broke (%s); resuming", prefix, error)
                stop.wait(RETRY_S)
            except Exception as error:  # a record it cannot read: the follower must hear of it
                emit(StoreUnavailableError(f"kubernetes watch {prefix}: {error!r}"))
                return

    # -- election (kubernetes_lease.py) ------------------------------------------------------

    async def campaign(self, name: str, identity: str, ttl: float) -> Leadership:
        return await self.leases.campaign(name, identity, ttl)

    async def resign(self, leadership: Leadership) -> None:
        await self.leases.resign(leadership)

    async def leader(self, name: str) -> str | None:
        return await self.leases.leader(name)

    async def health(self) -> StoreHealth:
        host = self.core.api_client.configuration.host
        try:
            listing = await self._call(
                "list configmaps",
                self.core.list_namespaced_config_map,
                self.namespace,
                label_selector=f"{STORE_LABEL}={self.prefix}",
                limit=1,
            )
            version_of(resource_version(listing), "list configmaps")
        except StoreUnavailableError as error:
            return StoreHealth(self.url, False, str(error), (f"{host} unreachable",))
        return StoreHealth(self.url, True, "answering", (f"{host} ok",))

    async def close(self) -> None:
        self.leases.close()
        for stop in list(self._watches):
            stop.set()
        self._call.close()
