"""The etcd store's calls keep a cancellation that arrives in the same turn as the answer
(Python 3.11's ``asyncio.wait_for`` returned the answer and dropped the cancellation, so a
follower's campaign loop, polling every 0.1 s, could run on after its replica was stopped,
and the stop waited for it forever)."""

from __future__ import annotations

import asyncio

from inferway.gateway.fleet.etcd_store import EtcdStore


async def test_a_cancel_in_the_same_turn_as_the_answer_is_kept() -> None:
    store = EtcdStore([("127.0.0.1", 2379)], timeout=5.0)
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    call = asyncio.create_task(store._call("get", lambda _client: answer))
    await asyncio.sleep(0)  # the call now waits for the answer
    answer.set_result("leader")
    call.cancel()  # in the same turn: the stop's cancel meets the answer
    await asyncio.wait({call})
    assert call.cancelled()
    await store.close()
