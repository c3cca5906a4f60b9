"""An in-memory Kubernetes API server for Leases and ConfigMaps, behind the official client's
urllib3 pool: no API server can run where inferway is tested, so the ``kubernetes://`` store
is tested at the client's HTTP boundary. Everything above the pool (the client's request
building, serialization, deserialization, ``ApiException``, ``Watch``) is the real client.

What it does as the API server does: one revision counter for every object (etcd's), written
into ``metadata.resourceVersion``; ``create`` refuses an existing name (409 AlreadyExists);
``update`` and merge ``patch`` refuse a ``resourceVersion`` that is not the object's (409
Conflict) and a missing object (404); list and watch select by label (equality); a watch from
version N streams every later change in order, sends a BOOKMARK at its end when asked, and
answers an ERROR event with code 410 for a version older than the last compaction; MicroTime
fields must carry exactly six fraction digits (Go's ``RFC3339Micro``), names must be DNS
subdomains, a ConfigMap's data at most 1 MiB (422 Invalid otherwise). Every request is
recorded as its RBAC verb and resource, for the Role's test.

Each :meth:`FakeApiServer.client` is one replica's client with its own pool, which a test can
cut off (requests fail as a refused connection would) or make forbidden for a verb.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import urllib3
from kubernetes import client as k8s

__all__ = ["FakeApiServer", "FakePool"]

HOST = "https://kubernetes.fake"
_ROUTES = {
    "leases": re.compile(
        r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?$"
    ),
    "configmaps": re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps(?:/([^/]+))?$"),
}
_MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SET_ON_CREATE = "resourceVersion should not be set on objects to be created"
_MODIFIED = (
    'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; '
    "please apply your changes to the latest version and try again"
)
_BAD_TIME = 'parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00": cannot parse'
_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 410: "Gone", 415: "Unsupported Media Type",
            422: "Unprocessable Entity"}  # fmt: skip


class _Refused(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}  # fmt: skip


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _selects(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        key, sep, value = term.partition("=")
        if not sep or "!" in key or value.startswith("="):
            raise _Refused(400, "BadRequest", f"selector term {term!r}: only key=value here")
        if labels.get(key) != value:
            return False
    return True


class _Stream(urllib3.HTTPResponse):
    """A watch response: ``stream()`` yields one JSON line per event as the events happen."""

    def __init__(self, lines: Iterator[bytes], closed: threading.Event) -> None:
        super().__init__(body=b"", status=200, reason="OK", preload_content=False,
                         headers={"Content-Type": "application/json"})  # fmt: skip
        self._lines, self._closed = lines, closed

    def stream(  # type: ignore[override]
        self, amt: int | None = 2**16, decode_content: bool | None = None
    ) -> Iterator[bytes]:
        yield from self._lines

    def close(self) -> None:
        self._closed.set()
        super().close()

    def release_conn(self) -> None:
        pass


@dataclass
class FakeApiServer:
    revision: int = 1000
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[int, str, str, str, dict[str, Any]]] = field(default_factory=list)
    compacted: int = 0
    requests: list[tuple[str, str]] = field(default_factory=list)
    """(verb, resource) of every request, as RBAC names them"""
    hooks: list[tuple[str, str, Callable[[], None]]] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    closed: threading.Event = field(default_factory=threading.Event)

    def client(self) -> tuple[k8s.CoreV1Api, k8s.CoordinationV1Api, FakePool]:
        api = k8s.ApiClient(k8s.Configuration(host=HOST))
        pool = FakePool(self)
        api.rest_client.pool_manager = pool
        return k8s.CoreV1Api(api), k8s.CoordinationV1Api(api), pool

    def verbs(self) -> dict[str, set[str]]:
        used: dict[str, set[str]] = {}
        for verb, resource in self.requests:
            used.setdefault(resource, set()).add(verb)
        return used

    def before(self, verb: str, resource: str, action: Callable[[], None]) -> None:
        """Run ``action`` once, just before the next ``verb`` on ``resource`` is served."""
        self.hooks.append((verb, resource, action))

    def compact(self) -> None:
        """etcd's compaction: watches from any version up to now answer 410 Gone."""
        with self.changed:
            self.compacted = self.revision

    def shut_down(self) -> None:
        self.closed.set()
        with self.changed:
            self.changed.notify_all()

    # -- serving ---------------------------------------------------------------------------

    def serve(
        self, method: str, url: str, body: Any, headers: dict[str, str]
    ) -> urllib3.HTTPResponse:
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        found = [(r, m) for r, route in _ROUTES.items() if (m := route.match(parts.path))]
        if not found:
            return _answer(404, _Refused(404, "NotFound", f"no route {parts.path}").status())
        resource, match = found[0]
        namespace, name = match.group(1), match.group(2)
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
            method, "get" if name else ("watch" if query.get("watch") == "true" else "list")
        )
        self.requests.append((verb, resource))
        for hook in [h for h in self.hooks if h[:2] == (verb, resource)][:1]:
            self.hooks.remove(hook)
            hook[2]()
        try:
            if verb == "watch":
                return self._watch(resource, namespace, query)
            with self.changed:
                status, document = self._handle(verb, resource, namespace, name, query, body,
                                                headers)  # fmt: skip
        except _Refused as refused:
            return _answer(refused.code, refused.status())
        return _answer(status, document)

    def _handle(
        self, verb: str, resource: str, namespace: str, name: str | None, query: dict[str, str],
        body: Any, headers: dict[str, str],
    ) -> tuple[int, dict[str, Any]]:  # fmt: skip
        current = self.objects.get((resource, namespace, name or ""))
        if verb == "get":
            if current is None:
                raise _Refused(404, "NotFound", f'{resource} "{name}" not found')
            return 200, copy.deepcopy(current)
        if verb == "list":
            selector = query.get("labelSelector", "")
            items = [
                copy.deepcopy(o)
                for (r, ns, _), o in sorted(self.objects.items())
                if (r, ns) == (resource, namespace)
                and _selects(selector, o["metadata"].get("labels", {}))
            ]
            listed: dict[str, Any] = {"resourceVersion": str(self.revision)}
            limit = int(query.get("limit", "0"))
            if limit and len(items) > limit:
                items, listed["continue"] = items[:limit], "more"
            return 200, {"kind": "List", "apiVersion": "v1", "metadata": listed, "items": items}
        if verb == "create":
            name = body.get("metadata", {}).get("name", "")
            if body["metadata"].get("resourceVersion"):
                raise _Refused(500, "InternalError", _SET_ON_CREATE)
            if (resource, namespace, name) in self.objects:
                raise _Refused(409, "AlreadyExists", f'{resource} "{name}" already exists')
            return 201, self._store("ADDED", resource, namespace, name, copy.deepcopy(body))
        if current is None:
            raise _Refused(404, "NotFound", f'{resource} "{name}" not found')
        if verb == "update":
            updated = copy.deepcopy(body)
        elif verb == "patch":
            if headers.get("Content-Type") != "application/merge-patch+json":
                raise _Refused(415, "UnsupportedMediaType", "only merge patches here")
            updated = _merge(current, body)
        else:
            raise _Refused(405, "MethodNotAllowed", f"{verb} is not served here")
        wanted = updated.get("metadata", {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise _Refused(409, "Conflict", _MODIFIED.format(resource=resource, name=name))
        if updated.get("metadata", {}).get("name") != name:
            raise _Refused(400, "BadRequest", "the name of the object does not match the URL")
        return 200, self._store("MODIFIED", resource, namespace, name, updated)

    def _store(
        self, kind: str, resource: str, namespace: str, name: str, obj: dict[str, Any]
    ) -> dict[str, Any]:
        _validate(resource, obj)
        self.revision += 1
        metadata = obj.setdefault("metadata", {})
        previous = self.objects.get((resource, namespace, name), {}).get("metadata", {})
        metadata.update(namespace=namespace, resourceVersion=str(self.revision),
                        uid=previous.get("uid", f"uid-{self.revision}"))  # fmt: skip
        self.objects[(resource, namespace, name)] = obj
        self.events.append((self.revision, resource, namespace, kind, copy.deepcopy(obj)))
        self.changed.notify_all()
        return copy.deepcopy(obj)

    def _watch(self, resource: str, namespace: str, query: dict[str, str]) -> urllib3.HTTPResponse:
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + int(query.get("timeoutSeconds", "1800"))
        labels = query.get("labelSelector", "")
        bookmarks = query.get("allowWatchBookmarks") == "true"
        closed = threading.Event()

        def lines() -> Iterator[bytes]:
            nonlocal since
            if since and since < self.compacted:
                gone = _Refused(410, "Expired", f"too old resource version: {since}")
                yield _line("ERROR", gone.status())
                return
            while not closed.is_set() and not self.closed.is_set():
                with self.changed:
                    fresh = [e for e in self.events if e[0] > since]
                    if not fresh:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self.changed.wait(min(left, 0.05))
                        continue
                for revision, kind_of, ns, event, obj in fresh:
                    since = revision
                    if (kind_of, ns) == (resource, namespace) and _selects(
                        labels, obj["metadata"].get("labels", {})
                    ):
                        yield _line(event, obj)
            if bookmarks and not closed.is_set():
                mark = {"kind": "ConfigMap", "metadata": {"resourceVersion": str(self.revision)}}
                yield _line("BOOKMARK", mark)

        return _Stream(lines(), closed)


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def _answer(status: int, document: dict[str, Any]) -> urllib3.HTTPResponse:
    return urllib3.HTTPResponse(body=json.dumps(document).encode(), status=status,
                                reason=_REASONS.get(status, "Error"), preload_content=False,
                                headers={"Content-Type": "application/json"})  # fmt: skip


def _validate(resource: str, obj: dict[str, Any]) -> None:
    metadata = obj.get("metadata", {})
    name = metadata.get("name", "")
    if not _SUBDOMAIN.match(name) or len(name) > 253:
        raise _Refused(422, "Invalid", f"metadata.name {name!r}: not a DNS-1123 subdomain")
    for key, value in (metadata.get("labels") or {}).items():
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise _Refused(
                422, "Invalid", f"metadata.labels[{key}]: {value!r} is not a label value"
            )
    if resource == "leases":
        spec = obj.get("spec", {})
        for field_name in ("acquireTime", "renewTime"):
            value = spec.get(field_name)
            if value is not None and not _MICRO_TIME.match(value):
                raise _Refused(400, "BadRequest", _BAD_TIME.format(value=value))
        if spec.get("leaseDurationSeconds") is not None and spec["leaseDurationSeconds"] <= 0:
            raise _Refused(422, "Invalid", "spec.leaseDurationSeconds: must be greater than 0")
        return
    size = sum(len(v) for v in (obj.get("data") or {}).values())
    for key, value in (obj.get("binaryData") or {}).items():
        try:
            size += len(base64.b64decode(value, validate=True))
        except binascii.Error:
            raise _Refused(400, "BadRequest", f"binaryData[{key}]: illegal base64") from None
    if size > 1024 * 1024:
        raise _Refused(422, "Invalid", "ConfigMap: data must be at most 1048576 bytes")


@dataclass
class FakePool:
    """``urllib3.PoolManager.request`` as the client calls it, served by ``server``."""

    server: FakeApiServer
    cut: bool = False
    """requests fail as a refused connection would (the API server unreachable)"""
    forbidden: set[tuple[str, str]] = field(default_factory=set)
    """(verb, resource) answered 403"""

    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        if self.cut:
            raise urllib3.exceptions.ProtocolError(f"{url}: connection refused")
        body = kwargs.get("body")
        document = json.loads(body) if body else None
        headers = dict(kwargs.get("headers") or {})
        path = urlsplit(url).path
        for verb, resource in self.forbidden:
            if resource in path and {"GET": "get", "PATCH": "patch", "POST": "create",
                                     "PUT": "update"}.get(method) == verb:  # fmt: skip
                refused = _Refused(403, "Forbidden", f"cannot {verb} resource {resource}")
                return _answer(403, refused.status())
        return self.server.serve(method, url, document, headers)

    def clear(self) -> None:
        pass
