"""Runs inferway's endpoint pickers while the live policy has services with ``picker:`` (not
``external``): resolves each service's replicas and serves them here (pools.py: one gRPC
server per ``listen`` address, one pool per service, scraped for load) or, for ``process:
sidecar``, hands them to a supervised picker process serving that address (sidecar.py). For
``process: envoy`` nothing serves picks: the replicas are scraped and the saturated ones
(``pick: hash``), or every replica's load (``pick: score``), are put in the control plane's
State, for Envoy (in_envoy.py).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from inferway.gateway.control_plane import AppliedPolicy, ControlPlane, PolicyFollower
from inferway.gateway.control_plane.plane import REPLICA_LOAD_SOURCE
from inferway.gateway.picker.in_envoy import InEnvoyLoad, Loads, Saturated, Watched
from inferway.gateway.picker.pools import PickerPools, Wanted, endpoint_address, picker_config
from inferway.gateway.picker.server import PickerServer, PoolPicker
from inferway.gateway.picker.sidecar import PickerSidecar
from inferway.policies.model import Policy
from inferway.policies.types import is_ip_address, split_host_port
from inferway.resolve import resolve_policy
from inferway.state.model import State

__all__ = ["PickerKeeper", "endpoint_address", "picker_config", "worker_warnings"]

log = logging.getLogger(__name__)


def worker_warnings(policy: Policy | None, concurrency: int | None) -> list[str]:
    """``status``'s warning for each service scored in Envoy (``process: envoy, pick:
    score``) while the Envoy this gateway runs has more than one worker (``concurrency``; None:
    Envoy's default, one per core): each worker keeps its own prefix index and counts."""
    if policy is None or concurrency == 1:
        return []
    workers = "one per core (Envoy's default)" if concurrency is None else f"{concurrency}"
    return [
        f"service {s.name}: its picker scores in Envoy (process: envoy, pick: score), whose "
        f"workers each keep their own prefix index and in-flight counts, and Envoy runs "
        f"{workers} workers: start it with --envoy-concurrency 1 (docs/picker.md)"
        for s in policy.services
        if s.picker is not None and s.picker.process == "envoy" and s.picker.pick == "score"
    ]


class PickerKeeper(PolicyFollower):
    def __init__(self, plane: ControlPlane | None, policy: Policy, state: State | None = None):
        """Follows ``plane`` (None: only ``follow`` calls) from ``policy`` on, once started."""
        self._plane = plane
        self._initial = policy
        self._state = state
        self.pools = PickerPools()
        """The pickers served in this process."""
        self.sidecars: dict[tuple[str, int], PickerSidecar] = {}
        self.in_envoy: dict[str, dict[str, Any]] = {}
        """``process: envoy`` services (no picker runs for them): their settings, for status."""
        self.envoy_load = InEnvoyLoad(self._publish_load)
        """Scrapes ``process: envoy`` replicas: the saturated ones go to Envoy as DEGRADED
        (``pick: hash``), their load to Envoy's Lua picker (``pick: score``)."""
        self._pending: asyncio.Task[None] | None = None

    @property
    def servers(self) -> dict[tuple[str, int], PickerServer]:
        """The picker servers running in this process, by listen address."""
        return self.pools.servers

    def pool(self, service: str) -> PoolPicker | None:
        """``service``'s picker when this process serves it (not a sidecar's)."""
        return self.pools.pool(service)

    def status(self) -> dict[str, Any]:
        """Per picked service, served here or by a sidecar process (as it last answered)."""
        shown = self.pools.status()
        for sidecar in self.sidecars.values():
            shown.update(sidecar.pools_status)
        load = self.envoy_load.status()
        for service, settings in self.in_envoy.items():
            watched = load.get(service, {})
            shown[service] = {
                "endpoints": watched.get("endpoints", {}),
                "last_pick": None,
                "in_envoy": settings,
                "changes": watched.get("changes", []),
                "kept_in_saturated": watched.get("kept_in_saturated", 0),
                "no_room": watched.get("no_room"),
            }
        return dict(sorted(shown.items()))

    def _publish_load(self, saturated: Saturated, loads: Loads) -> None:
        """The replicas Envoy should leave out now and the load its Lua pickers read, into
        the control plane's State (a re-push). Raises PolicyRefusedError when that cannot be
        pushed (InEnvoyLoad logs it and tries again on its next round)."""
        if self._plane is None:
            return
        state = replace(
            self._plane.state,
            saturated=MappingProxyType(dict(saturated)),
            picker_load=MappingProxyType({k: MappingProxyType(dict(v)) for k, v in loads.items()}),
        )
        self._plane.update_state(state, REPLICA_LOAD_SOURCE)  # raises when refused

    async def follow(self, policy: Policy) -> None:
        state = self._plane.state if self._plane is not None else self._state
        in_envoy = {
            s.name: s.picker
            for s in policy.services
            if s.picker is not None and s.picker.process == "envoy"
        }
        self.in_envoy = {
            name: (
                {"pick": "score", "scorers": p.scorers.model_dump()}
                if p.pick == "score"
                else {"prefix_bytes": p.prefix_bytes, "load_bound": p.load_bound}
            )
            for name, p in in_envoy.items()
        }
        resolved = resolve_policy(policy, state).services
        watched: Watched = {
            s.name: (
                in_envoy[s.name],
                {endpoint_address(e.host, e.port): (e.host, e.port) for e in s.endpoints},
            )
            for s in resolved
            if s.name in in_envoy
        }
        self.envoy_load.follow(watched)
        services = {
            s.name: s
            for s in resolved
            if s.picker is not None and not s.picker.external and not s.picker.in_envoy
        }
        settings = {s.name: s.picker for s in policy.services if s.name in services}
        here: Wanted = {}
        away: Wanted = {}
        for name, service in services.items():
            own = settings[name]
            assert own is not None  # resolved with a picker: the policy has one
            endpoints = [
                endpoint_address(e.host, e.port) for e in service.endpoints if is_ip_address(e.host)
            ]
            wanted = away if own.process == "sidecar" else here
            wanted.setdefault(split_host_port(own.listen), {})[name] = (own, endpoints)
        for address in list(self.sidecars):
            if address not in away:
                await self.sidecars.pop(address).stop()
        for address, pools in away.items():
            if address in here:  # one address, two processes: the sidecar cannot bind it
                log.error("picker %s:%d: services disagree on process; sidecar wins", *address)
                del here[address]
            if address not in self.sidecars:
                self.sidecars[address] = await PickerSidecar(*address).start()
            self.sidecars[address].update(pools)
        await self.pools.serve(here)

    async def start(self) -> None:
        """Serve what the live policy asks for, then follow the control plane's applies."""
        await self.follow(self._initial)
        if self._plane is not None:
            self._plane.add_observer(self)

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        if applied.source == REPLICA_LOAD_SOURCE:  # its own push: the replicas are as they were
            return
        self._pending = asyncio.get_running_loop().create_task(self._follow(applied.policy))

    async def _follow(self, policy: Policy) -> None:
        try:
            await self.follow(policy)
        except OSError as error:  # Envoy applies each service's fail mode until an edit fixes it
            log.error("%s; picker services fail open or closed as their policy says", error)

    async def stop(self) -> None:
        if self._pending is not None:
            await self._pending
        await self.pools.stop()
        await self.envoy_load.stop()
        for sidecar in self.sidecars.values():
            await sidecar.stop()
        self.sidecars.clear()
