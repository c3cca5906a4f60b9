"""The ``kubernetes://`` store's election: a ``coordination.k8s.io/v1`` Lease per election,
taken and renewed with the API's optimistic concurrency, as client-go's leader election does.

- **Taking it.** A candidate reads the Lease. Free (no holder, or no Lease: it is created) or
  expired, it writes itself in with ``update`` carrying the ``resourceVersion`` it read; of two
  candidates, the second gets 409 Conflict and keeps waiting. Expired means: the Lease has not
  changed for ``leaseDurationSeconds`` *as this candidate observed it* (its own monotonic
  clock since it first saw that ``resourceVersion``), never the holder's ``renewTime``
  against the local clock, so clock skew between nodes cannot elect two leaders.
- **The term** is the ``resourceVersion`` of the write that took the Lease. Resource versions
  of one resource type increase as integers (Kubernetes 1.35, KEP-5504: etcd's revision), so
  a later leader's term is always higher, also after the Lease was deleted and created again
  (``leaseTransitions`` restarts at 0 then, and stays the same when one identity takes the
  Lease twice). ``leaseTransitions`` is still kept as client-go keeps it, for ``kubectl
  describe``.
- **Fencing.** Each acquisition writes a fresh random token into the Lease (an annotation its
  renewals keep). A fenced write first reads the Lease: another holder, or another token
  (the Lease was taken and given back meanwhile), and the write is refused
  (:class:`FencedError`). The record written then carries the term, and a record that a
  higher term wrote refuses a lower one atomically (its update is conditional on its own
  ``resourceVersion``): Kubernetes has no transaction over two objects, so that per-record
  fencing token closes the window between the Lease's read and the record's write.
- **Renewals** every third of the duration; the leader stops deciding at 70% of it after its
  last confirmed renewal (watched apart from the renewals), before any candidate can see the
  Lease expire. A renewal answered 409 by a Lease no longer ours, or 404, ends it at once.
- **Giving it back** (``resign``): the holder is cleared (``leaseDurationSeconds: 1``), and a
  waiting candidate takes the Lease at its next look instead of after the duration.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from inferway import background
from inferway.gateway.fleet.kubernetes_objects import (
    MANAGED_BY,
    TOKEN_ANNOTATION,
    ApiCaller,
    annotations_of,
    lease_name,
    micro_time,
    parse_micro_time,
    resource_version,
    version_of,
)
from inferway.gateway.fleet.store import (
    Fence,
    FencedError,
    Leadership,
    StoreUnavailableError,
)

__all__ = ["LOSE_AFTER", "KubernetesLeases"]

log = logging.getLogger("inferway.fleet")

LOSE_AFTER = 0.7
"""Fraction of the lease duration after the last confirmed renewal at which a leader stops
deciding: no candidate sees the Lease expire sooner than the full duration after it."""


@dataclass
class _Held:
    leadership: Leadership
    lease: str
    token: str
    resource_version: str
    confirmed: float
    """monotonic time the last confirmed write was sent"""


class KubernetesLeases:
    def __init__(
        self, api: k8s.CoordinationV1Api, call: ApiCaller, namespace: str, prefix: str
    ) -> None:
        self.api, self.call, self.namespace, self.prefix = api, call, namespace, prefix
        self._held: dict[tuple[str, int], _Held] = {}
        self._renewals: dict[tuple[str, int], asyncio.Task[None]] = {}

    # -- reading and writing the Lease -------------------------------------------------------

    async def _read(self, name: str) -> k8s.V1Lease | None:
        try:
            lease: k8s.V1Lease = await self.call(
                "read lease", self.api.read_namespaced_lease, name, self.namespace
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise StoreUnavailableError(f"kubernetes read lease {name}: {error.status}") from None
        return lease

    def _body(
        self, name: str, spec: dict[str, Any], token: str, resource_version: str | None
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": name,
            "labels": dict(MANAGED_BY),
            "annotations": {TOKEN_ANNOTATION: token},
        }
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
                "spec": spec}  # fmt: skip

    async def _write(self, name: str, body: dict[str, Any], *, create: bool) -> k8s.V1Lease | None:
        """The stored Lease, or None when the API refused the write as stale (409)."""
        try:
            if create:
                written: k8s.V1Lease = await self.call(
                    "create lease", self.api.create_namespaced_lease, self.namespace, body
                )
            else:
                written = await self.call(
                    "update lease", self.api.replace_namespaced_lease, name, self.namespace, body
                )
        except ApiException as error:
            if error.status == 409:
                return None
            if error.status == 404:  # deleted since it was read: the next look creates it
                return None
            raise
        return written

    # -- the election ---------------------------------------------------------------------

    async def campaign(self, name: str, identity: str, ttl: float) -> Leadership:
        seconds = max(2, math.ceil(ttl))
        poll = min(1.0, max(0.1, seconds / 10))
        lease = lease_name(self.prefix, name)
        seen: tuple[str | None, float] = (None, 0.0)
        while True:
            try:
                current = await self._read(lease)
                if current is None:
                    won = await self._take(name, lease, identity, seconds, None)
                    if won is not None:
                        return won
                    continue
                spec = current.spec or k8s.V1LeaseSpec()
                rv = resource_version(current)
                if rv != seen[0]:
                    seen = (rv, time.monotonic())
                duration = spec.lease_duration_seconds or seconds
                waited = time.monotonic() - seen[1]
                if not spec.holder_identity or waited >= duration:
                    won = await self._take(name, lease, identity, seconds, current)
                    if won is not None:
                        return won
                    continue
                await asyncio.sleep(max(0.01, min(poll, duration - waited)))
            except StoreUnavailableError as exc:
                log.warning("campaign for %r: %s; trying again", name, exc)
                await asyncio.sleep(poll)

    async def _take(
        self, name: str, lease: str, identity: str, seconds: int, current: k8s.V1Lease | None
    ) -> Leadership | None:
        now = micro_time()
        token = uuid.uuid4().hex
        spec: dict[str, Any] = {
            "holderIdentity": identity,
            "leaseDurationSeconds": seconds,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        if current is not None and current.spec is not None:
            before = current.spec
            changed = before.holder_identity != identity  # as client-go counts them
            spec["leaseTransitions"] = (before.lease_transitions or 0) + int(changed)
        sent = time.monotonic()
        rv = resource_version(current) if current is not None else None
        written = await self._write(
            lease, self._body(lease, spec, token, rv), create=current is None
        )
        if written is None:
            return None
        written_rv = resource_version(written)
        term = version_of(written_rv, f"lease {lease}")
        leadership = Leadership(Fence(name, identity, term), float(seconds))
        held = _Held(leadership, lease, token, written_rv, sent)
        self._held[(name, term)] = held
        self._renewals[(name, term)] = asyncio.create_task(
            self._keep(held, spec), name=f"kubernetes-lease-{name}"
        )
        log.info("%s leads %r (term %d, Lease %s, %ds)", identity, name, term, lease, seconds)
        return leadership

    async def _keep(self, held: _Held, spec: dict[str, Any]) -> None:
        """Renew every third of the duration (a tenth while renewals fail); apart from the
        renewals, give the leadership up at ``confirmed + LOSE_AFTER * duration``."""
        leadership = held.leadership

        async def watchdog() -> None:
            while not leadership.lost.is_set():
                remaining = held.confirmed + LOSE_AFTER * leadership.ttl - time.monotonic()
                if remaining <= 0:
                    leadership.lose(f"Lease not renewed for {LOSE_AFTER:.0%} of its duration")
                    return
                await asyncio.sleep(remaining)

        guard = asyncio.create_task(watchdog(), name=f"kubernetes-lease-watchdog-{held.lease}")
        pause = leadership.ttl / 3
        try:
            while not leadership.lost.is_set():
                await asyncio.sleep(pause)
                sent = time.monotonic()
                try:
                    lost = await self._renew(held, spec)
                except StoreUnavailableError as exc:
                    log.warning("Lease %s: renewal failed: %s", held.lease, exc)
                    pause = leadership.ttl / 10
                    continue
                if lost:
                    leadership.lose(lost)
                    return
                held.confirmed = max(held.confirmed, sent)
                pause = leadership.ttl / 3
        finally:
            guard.cancel()
            key = (leadership.fence.name, leadership.fence.term)
            self._renewals.pop(key, None)

    async def _renew(self, held: _Held, spec: dict[str, Any]) -> str:
        """One renewal; a reason when the Lease is no longer ours, else ''."""
        spec = {**spec, "renewTime": micro_time()}
        body = self._body(held.lease, spec, held.token, held.resource_version)
        written = await self._write(held.lease, body, create=False)
        if written is not None:
            held.resource_version = resource_version(written)
            return ""
        current = await self._read(held.lease)  # 409 or 404: whose is it now?
        if current is None:
            return "the Lease was deleted"
        if not self._ours(current, held):
            holder = current.spec.holder_identity if current.spec else None
            return f"the Lease is held by {holder or 'nobody'} now"
        held.resource_version = resource_version(current)  # touched by someone else
        return ""

    def _ours(self, lease: k8s.V1Lease, held: _Held) -> bool:
        annotations = annotations_of(lease)
        holder = lease.spec.holder_identity if lease.spec else None
        return holder == held.leadership.fence.identity and (
            annotations.get(TOKEN_ANNOTATION) == held.token
        )

    async def check(self, fence: Fence, key: str) -> None:
        """Raise :class:`FencedError` unless ``fence`` still holds its Lease, as read now."""
        held = self._held.get((fence.name, fence.term))
        if held is None or held.leadership.lost.is_set():
            raise FencedError(
                f"{key}: not written, {fence.identity} no longer leads {fence.name!r} "
                f"(term {fence.term})"
            )
        current = await self._read(held.lease)
        if current is None or not self._ours(current, held):
            holder = current.spec.holder_identity if current and current.spec else None
            held.leadership.lose(f"the Lease is held by {holder or 'nobody'} now")
            raise FencedError(
                f"{key}: not written, {fence.identity} no longer leads {fence.name!r} "
                f"(term {fence.term}; the Lease is held by {holder or 'nobody'})"
            )

    async def resign(self, leadership: Leadership) -> None:
        key = (leadership.fence.name, leadership.fence.term)
        leadership.lose("resigned")
        renewal = self._renewals.pop(key, None)
        if renewal is not None:
            await background.cancel(renewal)
        held = self._held.pop(key, None)
        if held is None:
            return
        current = await self._read(held.lease)
        if current is None or not self._ours(current, held):
            return
        spec = current.spec or k8s.V1LeaseSpec()
        released = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": spec.acquire_time,
            "renewTime": micro_time(),
            "leaseTransitions": spec.lease_transitions or 0,
        }
        body = self._body(held.lease, released, held.token, resource_version(current))
        await self._write(held.lease, body, create=False)

    async def leader(self, name: str) -> str | None:
        """The holder, unless it gave the Lease back or its last renewal is older than the
        duration (by this host's clock: for display, never for the election)."""
        current = await self._read(lease_name(self.prefix, name))
        spec = current.spec if current is not None else None
        if spec is None or not spec.holder_identity:
            return None
        renewed = parse_micro_time(spec.renew_time)
        if renewed is not None and spec.lease_duration_seconds:
            age = (micro_time() - renewed).total_seconds()
            if age > spec.lease_duration_seconds:
                return None
        return spec.holder_identity

    def close(self) -> None:
        for task in list(self._renewals.values()):
            task.cancel()
        self._renewals.clear()
