"""The rollouts on the admin API: ``GET /rollouts``, ``GET /rollouts/{name}`` and
``POST /rollouts/{name}/{promote|abort|pause|resume|restart}``. POSTs pass the admin
app's token middleware (``admin_security``) like ``POST /reload``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from inferway.controllers.rollout.controller import COMMANDS, RolloutCommandError
from inferway.gateway.admin_documents import RolloutCommandAnswer, RolloutList
from inferway.gateway.rollouts.driver import RolloutDriver, UnknownRolloutError

__all__ = ["DRIVER", "FORWARD", "add_rollout_routes"]

DRIVER = web.AppKey("rollout_driver", RolloutDriver)
FORWARD: web.AppKey[Callable[[web.Request], Awaitable[web.Response | None]]] = web.AppKey(
    "rollout_forward"
)
"""A fleet replica that does not lead forwards commands to the leader (None: it leads)."""


def _unknown(driver: RolloutDriver, name: str) -> web.Response:
    known = ", ".join(driver.names()) or "none"
    return web.json_response(
        {"error": f"no rollout named {name!r} in the live policy (rollouts: {known})"}, status=404
    )


async def _list(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    document = RolloutList(rollouts=[driver.status(n, history=0) for n in driver.names()])
    return web.json_response(document)


async def _show(request: web.Request) -> web.Response:
    driver, name = request.app[DRIVER], request.match_info["name"]
    try:
        return web.json_response(driver.status(name))
    except UnknownRolloutError:
        return _unknown(driver, name)


async def _command(request: web.Request) -> web.Response:
    driver, name = request.app[DRIVER], request.match_info["name"]
    forward = request.app.get(FORWARD)
    if forward is not None and (forwarded := await forward(request)) is not None:
        return forwarded
    command = request.match_info["command"]
    if command not in COMMANDS:
        return web.json_response(
            {"error": f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}"},
            status=404,
        )
    try:
        decision = driver.command(name, command)
    except UnknownRolloutError:
        return _unknown(driver, name)
    except RolloutCommandError as exc:
        return web.json_response({"error": str(exc)}, status=409)
    answer = RolloutCommandAnswer(decision=decision.to_json(), status=driver.status(name))
    return web.json_response(answer)


def add_rollout_routes(app: web.Application, driver: RolloutDriver) -> None:
    """Before the app starts (aiohttp freezes the router then)."""
    app[DRIVER] = driver
    app.router.add_get("/rollouts", _list)
    app.router.add_get("/rollouts/{name}", _show)
    app.router.add_post("/rollouts/{name}/{command}", _command)
