"""``inferway run`` with an Envoy: the keeper, a small process that owns Envoy and keeps the
control plane running beside it, so the data plane outlives a control-plane crash.

    keeper (inferway run) ── Envoy                     (EnvoySupervisor: restarted on crash)
                          └─ control plane process     (ControlPlaneProcess: restarted on crash)
                               policy watcher, xDS server, admin API

The keeper parses no policy and serves no request, so there is little in it to crash; the
control plane, which does the work, may crash (even SIGKILL) without taking Envoy with it:
Envoy keeps its last config, and the restarted control plane listens on the same xDS and admin
ports, reloads the policy file (an edit saved meanwhile applies then) and Envoy resyncs.
Start-up is in order (control plane ready, then Envoy) and fails loudly: a refused policy
exits 1 before Envoy starts, an Envoy that exits before it is ready exits 2 with its output.
SIGTERM/SIGINT stop everything at any point, start-up included: Envoy first (once running,
after its listeners drained: envoy_drain.py), then the control plane. If the keeper itself is
killed, ``PR_SET_PDEATHSIG`` takes both children with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
from dataclasses import replace
from pathlib import Path

from inferway import background
from inferway.exit_codes import EXIT_CANNOT_START
from inferway.free_ports import free_ports
from inferway.gateway.control_plane_process import ControlPlaneProcess, ControlPlaneSpec
from inferway.gateway.envoy_bootstrap import build_gateway_bootstrap
from inferway.gateway.envoy_drain import drain_envoy
from inferway.gateway.envoy_modules import provide_envoy_modules
from inferway.gateway.foreground import unless_stopped
from inferway.gateway.keeper_state import (
    KEEPER_STATE_FILE,
    KeeperState,
    ProcessRecord,
    write_keeper_state,
)
from inferway.gateway.supervisor import EnvoySupervisor, wait_envoy_started
from inferway.gateway.xds_mtls import XdsMtlsError, load_xds_mtls

__all__ = ["run_keeper"]

log = logging.getLogger("inferway")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PUBLISH_INTERVAL_S = 0.5


async def run_keeper(spec: ControlPlaneSpec) -> int:
    """Run Envoy and the control plane until SIGTERM/SIGINT; returns the exit code (0 stopped,
    1 the policy was refused at start, 2 something could not start)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        with contextlib.ExitStack() as files:
            workdir = spec.options.workdir
            if workdir is None:
                temp = files.enter_context(tempfile.TemporaryDirectory(prefix="inferway-"))
                workdir = Path(temp)
            return await _Keeper(spec, workdir.absolute(), stop).run()
    finally:
        for sig in _STOP_SIGNALS:
            loop.remove_signal_handler(sig)


class _Keeper:
    def __init__(self, spec: ControlPlaneSpec, workdir: Path, stop: asyncio.Event) -> None:
        options = spec.options
        # Fixed ports: a restarted control plane must listen where Envoy (and `status`) look;
        # picked together, so no two of them are the same number, nor one the user named.
        given = {p for p in (options.xds_port, options.admin_port, options.envoy_admin_port) if p}
        xds_port, admin_port, envoy_admin_port = free_ports(
            options.host, options.admin_address, "127.0.0.1", avoid=given
        )
        self.options = replace(
            options,
            workdir=workdir,
            with_envoy=False,
            xds_port=options.xds_port or xds_port,
            admin_port=options.admin_port or admin_port,
            envoy_admin_port=options.envoy_admin_port or envoy_admin_port,
            keeper_state_file=workdir / KEEPER_STATE_FILE,
        )
        self.workdir = workdir
        self.stop_event = stop
        # The first control plane checks the listener ports before Envoy binds them; once Envoy
        # runs they are Envoy's, so a restarted control plane must not check them again.
        first_spec = replace(spec, options=replace(self.options, check_listener_ports=True))
        self._restart_spec = replace(spec, options=self.options)
        self.child = ControlPlaneProcess(first_spec, on_change=self.publish)
        self.envoy: EnvoySupervisor | None = None
        self._published: str | None = None

    async def run(self) -> int:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            return await self._run()
        finally:
            await self._stop_all()

    async def _run(self) -> int:
        options = self.options
        try:
            xds_client_tls = (
                load_xds_mtls(options.xds_mtls, node_id=options.node_id)[1]
                if options.xds_mtls is not None
                else None
            )
        except XdsMtlsError as error:
            log.error("cannot start the gateway: %s", error)
            return EXIT_CANNOT_START
        self.publish()
        code = await unless_stopped(self.child.start(), self.stop_event)
        if self.stop_event.is_set():
            log.info("stopped during start-up")
            return 0
        if code is not None:
            log.error("the control plane exited with code %s before it was ready", code)
            return code if code > 0 else EXIT_CANNOT_START
        self.child.spec = self._restart_spec

        bootstrap = build_gateway_bootstrap(
            options, xds_port=options.xds_port, workdir=self.workdir, xds_client_tls=xds_client_tls
        )
        self.envoy = EnvoySupervisor(
            bootstrap,
            workdir=self.workdir,
            log_level=options.envoy_log_level,
            concurrency=options.envoy_concurrency,
            on_restart=lambda _restarts, _code: self.publish(),
            env=provide_envoy_modules(bootstrap),
        )
        try:
            await self.envoy.start()
        except OSError as error:
            log.error("cannot start envoy: %s", error)
            return EXIT_CANNOT_START
        self.publish()
        failure = await unless_stopped(wait_envoy_started(self.envoy), self.stop_event)
        if self.stop_event.is_set():
            log.info("stopped during start-up")
            return 0
        if failure is not None:
            log.error("%s", failure)
            return EXIT_CANNOT_START
        log.info("running (envoy pid %s, control plane pid %s); Ctrl-C to stop", *self._pids())
        publisher = background.start(self._publish_periodically(), name="state publisher", log=log)
        try:
            await self.stop_event.wait()
        finally:
            publisher.cancel()
        # a stop signal: Envoy's listeners drain before it is stopped (envoy_drain.py)
        await drain_envoy(self.envoy.admin_port, drain_time_s=self.envoy.drain_time_s)
        log.info("stopping envoy, then the control plane")
        return 0

    def _pids(self) -> tuple[int | None, int | None]:
        return (None if self.envoy is None else self.envoy.pid), self.child.pid

    async def _stop_all(self) -> None:
        """Envoy first: a data plane is never left without the process that keeps it."""
        if self.envoy is not None:
            await self.envoy.stop()
        await self.child.stop()

    def publish(self) -> None:
        """Write the state file for the admin API when something changed."""
        envoy = self.envoy
        state = KeeperState(
            keeper_pid=os.getpid(),
            envoy_admin_port=self.options.envoy_admin_port,
            envoy=ProcessRecord()
            if envoy is None
            else ProcessRecord(
                pid=envoy.pid,
                running=envoy.running,
                restarts=envoy.restarts,
                last_exit_code=envoy.last_exit_code,
            ),
            control_plane=self.child.record(),
        )
        text = state.to_json()
        if text == self._published or not self.workdir.is_dir():
            return
        try:
            write_keeper_state(self.workdir / KEEPER_STATE_FILE, state)
        except OSError as exc:
            log.warning("cannot write %s: %s", KEEPER_STATE_FILE, exc)
            return
        self._published = text

    async def _publish_periodically(self) -> None:
        """Catches what no callback reports (Envoy down between a crash and its restart)."""
        await background.repeat(
            self._publish_async, every_s=_PUBLISH_INTERVAL_S, what="publishing state", log=log
        )

    async def _publish_async(self) -> None:
        self.publish()
