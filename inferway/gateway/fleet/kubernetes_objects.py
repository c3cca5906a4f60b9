"""How the ``kubernetes://`` store lays the fleet's state out in the API server (object names,
labels, a record's ConfigMap and back, the Lease's MicroTime) and calls the client (off the
event loop, API errors as store errors).

- **One ConfigMap per key.** A record's version must be its own (a compare-and-set on one
  key must not fail because another key changed) and writers of different keys must not
  contend: one object per key gives both, with the object's ``resourceVersion`` as the
  version. The value is ``binaryData.value`` (bytes kept exactly), at most
  :data:`MAX_VALUE_BYTES` so the object stays under the API server's 1 MiB.
- **Names** are ``<prefix>-<slug of the key>-<hash>``: a key may hold characters an object
  name cannot, the hash keeps two keys with one slug apart; the exact key is the
  ``inferway.io/key`` annotation, checked on every read.
- **Labels** select a store's records (``inferway.io/store``) and a key's first segment
  (``inferway.io/group``, so a watch on ``rollouts/`` is not sent every ``evidence/`` write).
- **Versions** are ``resourceVersion`` read as an integer: since Kubernetes 1.35 (KEP-5504,
  comparable resource versions) the API documents them as integers increasing within one
  resource type (etcd's revision), and the store compares a ConfigMap's only with
  ConfigMaps' and a term (a Lease's) only with terms. A watch from version N is the API's own
  ``watch`` from N. An API server whose versions are not integers is refused, saying why.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException

from inferway.gateway.fleet.store import Record, StoreUnavailableError

__all__ = [
    "GROUP_LABEL",
    "KEY_ANNOTATION",
    "MANAGED_BY",
    "MAX_VALUE_BYTES",
    "STORE_LABEL",
    "TERM_ANNOTATION",
    "TOKEN_ANNOTATION",
    "ApiCaller",
    "Unreachable",
    "annotations_of",
    "config_map_name",
    "group_of",
    "lease_name",
    "micro_time",
    "parse_micro_time",
    "record_from",
    "record_labels",
    "resource_version",
    "selector",
    "unavailable",
    "version_of",
]

KEY_ANNOTATION = "inferway.io/key"
TERM_ANNOTATION = "inferway.io/term"
"""The highest leader term that wrote a record: a deposed leader's later write is refused."""
TOKEN_ANNOTATION = "inferway.io/acquisition"
"""On the Lease: a fresh random token per acquisition, kept by its renewals."""
STORE_LABEL = "inferway.io/store"
GROUP_LABEL = "inferway.io/group"
MANAGED_BY = {"app.kubernetes.io/managed-by": "inferway"}
MAX_VALUE_BYTES = 700_000
"""A value's largest size: base64 makes it 933,336 bytes, under the API server's 1 MiB for a
ConfigMap's data with room for the metadata."""

Unreachable = (urllib3.exceptions.HTTPError, OSError)
"""What the client raises when the API server cannot be reached or does not answer in time."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_T = TypeVar("_T")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].strip("-") or "k"


def config_map_name(prefix: str, key: str) -> str:
    return f"{prefix}-{_slug(key, 60)}-{_digest(key)}"


def lease_name(prefix: str, election: str) -> str:
    name = f"{prefix}-{election}"
    return name if _DNS_LABEL.match(name) else f"{prefix}-{_slug(election, 40)}-{_digest(election)}"


def group_of(key: str) -> str | None:
    """The group label of a key (its first ``/`` segment), None for a key without one."""
    segment, slash, _ = key.partition("/")
    if not slash:
        return None
    if len(segment) <= 63 and _LABEL_VALUE.match(segment):
        return segment
    return "h-" + _digest(segment)


def record_labels(prefix: str, key: str) -> dict[str, str]:
    labels = {**MANAGED_BY, STORE_LABEL: prefix}
    group = group_of(key)
    if group is not None:
        labels[GROUP_LABEL] = group
    return labels


def selector(prefix: str, key_prefix: str) -> str:
    """The label selector of the records a ``key_prefix`` may match (filtered by key after)."""
    parts = [f"{STORE_LABEL}={prefix}"]
    group = group_of(key_prefix)
    if group is not None:
        parts.append(f"{GROUP_LABEL}={group}")
    return ",".join(parts)


def resource_version(obj: Any) -> str:
    """``metadata.resourceVersion`` of a client model (a Lease, a ConfigMap, a list)."""
    metadata = obj.metadata
    return str(metadata.resource_version or "") if metadata is not None else ""


def annotations_of(obj: Any) -> dict[str, str]:
    metadata = obj.metadata
    return dict(metadata.annotations or {}) if metadata is not None else {}


def version_of(resource_version: str | None, where: str) -> int:
    try:
        return int(resource_version or "")
    except ValueError:
        raise StoreUnavailableError(
            f"kubernetes {where}: resourceVersion {resource_version!r} is not an integer; the "
            "store needs an API server whose resource versions are etcd revisions"
        ) from None


def record_from(
    metadata: Mapping[str, Any], binary_data: Mapping[str, str] | None, expected_key: str | None
) -> tuple[Record, int]:
    """A ConfigMap's record and the term that last wrote it (0: none), from its metadata
    (``annotations``, ``resourceVersion``, ``name``) and ``binaryData``."""
    annotations = metadata.get("annotations") or {}
    name = metadata.get("name", "?")
    key = annotations.get(KEY_ANNOTATION)
    if key is None or (expected_key is not None and key != expected_key):
        raise StoreUnavailableError(
            f"kubernetes configmap {name}: holds key {key!r}, not {expected_key!r} (an object "
            "of the same name not written by inferway)"
        )
    value = base64.b64decode((binary_data or {}).get("value", ""))
    version = version_of(metadata.get("resourceVersion"), f"configmap {name}")
    return Record(key, value, version), int(annotations.get(TERM_ANNOTATION, "0"))


def micro_time(now: dt.datetime | None = None) -> dt.datetime:
    """The current time for a Lease's MicroTime fields. The client writes a datetime with
    ``isoformat()``, which leaves the fraction out when the microsecond is 0, and the API
    server parses MicroTime with exactly six fraction digits: 0 becomes 1."""
    now = now or dt.datetime.now(dt.UTC)
    return now.replace(microsecond=now.microsecond or 1)


def parse_micro_time(value: dt.datetime | str | None) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def unavailable(what: str, error: BaseException) -> StoreUnavailableError:
    """An API error or a transport failure as the store's error, saying what to change."""
    if isinstance(error, ApiException):
        if error.status in (401, 403):
            return StoreUnavailableError(
                f"kubernetes {what}: {error.status} {error.reason}: the service account needs "
                "get, create and update on leases (coordination.k8s.io) and get, list, watch, "
                "create and patch on configmaps in the store's namespace (docs/fleet.md)"
            )
        return StoreUnavailableError(f"kubernetes {what}: {error.status} {error.reason}")
    return StoreUnavailableError(f"kubernetes {what}: {type(error).__name__}: {error}")


class ApiCaller:
    """Runs the synchronous client's calls on a small pool of threads of the store's own, so
    the event loop never blocks and a Lease renewal never queues behind unrelated work in the
    loop's default executor. Every call has a deadline (``_request_timeout``); an API error
    other than those the caller handles (``passthrough``), and every transport failure,
    becomes :class:`StoreUnavailableError`."""

    def __init__(self, timeout: float, threads: int = 8) -> None:
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="inferway-kubernetes")

    async def __call__(
        self,
        what: str,
        method: Callable[..., _T],
        *args: Any,
        passthrough: tuple[int, ...] = (404, 409),
        **kwargs: Any,
    ) -> _T:
        kwargs.setdefault("_request_timeout", self.timeout)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, partial(method, *args, **kwargs))
        except ApiException as error:
            if error.status in passthrough:
                raise
            raise unavailable(what, error) from None
        except Unreachable as error:
            raise unavailable(what, error) from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
