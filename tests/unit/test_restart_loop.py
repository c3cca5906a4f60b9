"""The restart loop both process supervisors share: back off, respawn, retry a failed spawn,
stop as soon as the supervisor stops."""

from __future__ import annotations

from inferway.gateway.restart_loop import Backoff, Exit, keep_restarting


async def test_crashes_back_off_a_failed_respawn_is_retried_and_stopping_ends_it() -> None:
    events: list[object] = []
    exits = iter([Exit(1, 3, 0.5), Exit(1, 3, 0.5), Exit(2, 9, 60.0)])
    spawns = iter([OSError("no such file"), None, None])
    stopping = False

    async def wait_exit() -> Exit:
        return next(exits)

    def crashed(exit: Exit, delay: float) -> None:
        events.append(("crashed", exit.pid, exit.code, delay))

    async def respawn() -> None:
        error = next(spawns)
        if error is not None:
            raise error
        events.append("spawned")

    async def restarted() -> None:
        nonlocal stopping
        events.append("restarted")
        stopping = len([e for e in events if e == "restarted"]) == 2

    backoff = Backoff(initial=0.001, maximum=0.004, factor=2.0, stable_after=10.0)
    await keep_restarting(
        "test process",
        backoff=backoff,
        stopping=lambda: stopping,
        wait_exit=wait_exit,
        crashed=crashed,
        respawn=respawn,
        restarted=restarted,
    )
    assert events == [
        ("crashed", 1, 3, 0.001),
        ("crashed", 1, 3, 0.002),  # the failed spawn: the old exit again, a longer delay
        "spawned",
        "restarted",
        ("crashed", 2, 9, 0.001),  # it ran past stable_after: back to the first delay
        "spawned",
        "restarted",
    ]
