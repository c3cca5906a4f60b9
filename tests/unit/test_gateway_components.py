"""The gateway's parts start in order and stop in reverse, each stop supervised; a part that
runs before its place in the stop order is held, and stops first if the start fails."""

from __future__ import annotations

import pytest

from inferway.gateway.components import Calls, Components


class Part:
    def __init__(self, name: str, log: list[str], *, fail_start: bool = False) -> None:
        self.name, self.log, self.fail_start = name, log, fail_start

    async def start(self) -> None:
        if self.fail_start:
            raise OSError(f"{self.name} cannot start")
        self.log.append(f"start {self.name}")

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")


async def test_parts_stop_in_reverse_with_the_held_one_at_its_place() -> None:
    log: list[str] = []
    components = Components()
    components.adopt("folder", lambda: log.append("stop folder"))
    await components.start("server", Part("server", log))
    replicas = components.hold("replicas", Part("replicas", log).stop)
    envoy = await components.start("envoy", Part("envoy", log))
    assert isinstance(envoy, Part)
    components.own(replicas)
    await components.start("loop", Calls(Part("loop", log).start, Part("loop", log).stop))
    await components.stop()
    assert log == [
        "start server",
        "start envoy",
        "start loop",
        "stop loop",
        "stop replicas",
        "stop envoy",
        "stop server",
        "stop folder",
    ]


async def test_a_failed_start_stops_the_held_part_first_and_not_the_failed_one() -> None:
    log: list[str] = []
    components = Components()
    await components.start("server", Part("server", log))
    components.hold("replicas", Part("replicas", log).stop)
    with pytest.raises(OSError, match="envoy cannot start"):
        await components.start("envoy", Part("envoy", log, fail_start=True))
    await components.stop()
    assert log == ["start server", "stop replicas", "stop server"]


async def test_a_failing_stop_is_logged_the_rest_still_stop_and_the_first_error_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[str] = []

    async def broken() -> None:
        raise RuntimeError("port already closed")

    components = Components()
    await components.start("server", Part("server", log))
    components.adopt("admin API", broken)
    components.adopt("second", lambda: log.append("stop second"))
    with pytest.raises(RuntimeError, match="port already closed"):
        await components.stop()
    assert log == ["start server", "stop second", "stop server"]
    assert "stopping the admin API failed" in caplog.text
    await components.stop()  # stopped once: nothing left
    assert log == ["start server", "stop second", "stop server"]
